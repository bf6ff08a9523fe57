"""featurelab in a notebook: a kernel runs a notebook that analyses a small model and runs a tiny experiment;
both display as HTML (a layer's name, every claim's id), and the run shows its progress in the cell."""

import json
import re

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ANALYSE = """
import featurelab as fl
from torch import nn

data = fl.digits(200)
seq = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
fl.analyze(seq, data.X_train.float(), data.Y_train)
"""
RUN = """
record = fl.run_experiment("escape-circle", preset="tiny", out={out!r}, workers=1)
record
"""


def html_of(cell) -> str:
    pages = [o["data"]["text/html"] for o in cell.outputs if o.get("output_type") == "execute_result"]
    assert len(pages) == 1, cell.outputs
    return pages[0]


@pytest.mark.slow
def test_analysis_and_run_display_as_html_in_a_kernel(tmp_path):
    out = tmp_path / "run"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(ANALYSE), nbformat.v4.new_code_cell(RUN.format(out=str(out)))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()
    analysis = html_of(nb.cells[0])
    for layer in ("0", "2"):  # the Linear layers of the Sequential, by their module names
        assert f"<td>{layer}</td>" in analysis
    page = html_of(nb.cells[1])
    claims = json.loads((out / "claims.json").read_text())
    assert claims and all(f"<code>{c['id']}</code>" in page for c in claims if c["id"])
    assert page.count("data:image/png;base64,") == len(list((out / "figures").glob("*.png")))
    stderr = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("name") == "stderr")
    assert re.search(r"\d+/\d+ \[\d\d:\d\d<\d\d:\d\d", stderr), stderr  # bars with the time left, by default
