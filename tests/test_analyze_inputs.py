"""`featurelab analyze` inputs: every bad one ends in one line naming it (exit 2) before anything is written;
a weights-only file of a plain chain keeps its order and gets k_mid, balancedness and alignment."""

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import featurelab as fl
from featurelab.cli import main

FACTORIES = """
import os

import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))


def boom():
    raise RuntimeError("no GPU here")


def meta():
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "nets.py").write_text(FACTORIES)
    (tmp_path / "broken.py").write_text("raise ValueError('broken on import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("nets", "broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    torch.manual_seed(0)
    good = nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))
    save_file(good.state_dict(), "good.safetensors")
    save_file({"0.weight": torch.full((12, 64), float("nan")), "0.bias": torch.zeros(12)}, "nan.safetensors")
    save_file({"0.weight": torch.zeros(12, 0)}, "empty.safetensors")
    save_file({"0.weight": torch.zeros(12, 64), "9.weight": torch.zeros(3, 3)}, "other.safetensors")
    (tmp_path / "damaged.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    np.savez("objects.npz", X=np.array([object(), 1], dtype=object))
    np.savez("strings.npz", X=np.array([["a", "b"]]))
    np.savez("zero.npz", X=np.zeros((0, 64)))
    (tmp_path / "corrupt.npz").write_bytes(b"PK\x03\x04 this is not a zip")
    (tmp_path / "afile").write_text("")
    return tmp_path


CASES = [
    (["broken:make"], "broken"),
    (["nets:boom"], "no GPU here"),
    (["os:urandom"], "os:urandom"),
    (["nets:meta"], "meta device"),
    (["nets:make", "--threads", "0"], "--threads=0"),
    (["nets:make", "--n", "0"], "--n=0"),
    (["nets:make", "--out", "afile"], "is a file"),
    (["nets:make", "--data", "digits", "--shape", "1,x"], "--shape '1,x'"),
    (["nets:make", "--data", "digits", "--shape", "2,8,8"], "--shape 2,8,8"),
    (["nets:make", "--data", "objects.npz"], "objects.npz"),
    (["nets:make", "--data", "strings.npz"], "dtype <U1"),
    (["nets:make", "--data", "zero.npz"], "at least one row"),
    (["nets:make", "--data", "corrupt.npz"], "not a readable .npz"),
    (["nets:make", "--weights", "damaged.safetensors"], "not a readable safetensors"),
    (
        ["nets:make", "--weights", "other.safetensors"],
        "missing keys 0.bias, 2.weight, 2.bias; unexpected keys 9.weight",
    ),
    (["nan.safetensors"], "NaN or inf in 0.weight"),
    (["empty.safetensors"], "empty tensors (0.weight)"),
    (["nets:make", "--data", "digits", "--representations", "9"], "matches no module"),
]


@pytest.mark.parametrize("args, words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_one_line_before_anything_is_written(folder, capsys, args, words):
    before = sorted(p.name for p in folder.iterdir())
    assert main(["analyze", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and err.startswith("featurelab: error:"), err
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == [
        b for b in before if b != "__pycache__"
    ]


def test_previous_analysis_needs_force(folder, capsys):
    assert main(["analyze", "good.safetensors"]) == 0
    stamp = (folder / "analysis" / "report.html").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["analyze", "good.safetensors"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (folder / "analysis" / "report.html").stat().st_mtime_ns == stamp
    assert main(["analyze", "good.safetensors", "--force"]) == 0


def test_python_inputs_one_line():
    lin = nn.Linear(4, 3)
    with torch.device("meta"):
        on_meta = nn.Linear(4, 3)
    bad = nn.Linear(4, 3)
    empty = nn.Linear(4, 3)
    empty.weight = nn.Parameter(torch.zeros(3, 0))
    with torch.no_grad():
        bad.weight[0, 0] = float("inf")
    for call, words in (
        (lambda: fl.analyze(lin, torch.tensor(1.0)), "0-d tensor"),
        (lambda: fl.analyze(lin, torch.zeros(0, 4)), "0 rows"),
        (lambda: fl.analyze(lin, np.array([["a", "b", "c", "d"]])), "dtype <U1"),
        (lambda: fl.analyze(on_meta), "meta device"),
        (lambda: fl.analyze(bad), "NaN or inf in weight"),
        (lambda: fl.analyze(empty), "empty parameters"),
    ):
        with pytest.raises(fl.FeaturelabError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


def test_weights_only_chain_and_typing(folder):
    """A Linear chain in a file, with layers numbered past 9: natural order, dotted names, and the chain's k_mid,
    balancedness and alignment equal those of the same chain as a module (read with a ReLU between layers)."""
    torch.manual_seed(1)
    dims = [16, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 4]
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    seq = nn.Sequential(*layers[:-1])
    save_file({f"net.{k}": v for k, v in seq.state_dict().items()}, "chain.safetensors")
    res = fl.analyze(fl.analysis.weights_module("chain.safetensors"))
    ref = fl.analyze(seq)
    assert list(res.layers["name"]) == [f"net.{i}" for i in range(0, 23, 2)]
    for col in ("sv1", "balance_mean", "balance_residual", "alignment"):
        np.testing.assert_allclose(res.layers[col], ref.layers[col], rtol=1e-6, equal_nan=True)
    assert res.summary["bottleneck"]["k_mid"] == ref.summary["bottleneck"]["k_mid"]
    assert any("ReLU between layers" in n for n in res.summary["notes"])
    # embeddings, tokens and norms of a transformer-like file keep their types
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "embeddings.word_embeddings.weight": torch.randn(50, 8, generator=g),
            "embeddings.LayerNorm.weight": torch.ones(8),
            "embeddings.LayerNorm.bias": torch.zeros(8),
            "cls_token": torch.randn(1, 1, 8, generator=g),
            "encoder.layer.0.dense.weight": torch.randn(8, 8, generator=g),
            "encoder.layer.0.dense.bias": torch.zeros(8),
        },
        "bert.safetensors",
    )
    table = fl.analyze(fl.analysis.weights_module("bert.safetensors")).layers.set_index("name")
    assert table.loc["embeddings.word_embeddings.weight", "kind"] == "embedding"
    assert table.loc["cls_token", "type"] == "token" and table.loc["encoder.layer.0.dense", "type"] == "Linear"


def test_cli_report_tables(folder):
    assert main(["analyze", "nets:make", "--data", "digits", "--n", "100", "--out", "a"]) == 0
    assert (folder / "a" / "tables" / "norms.csv").exists() is False  # no norm in this model
    table = pd.read_csv(folder / "a" / "tables" / "layers.csv", dtype=str)
    assert list(table["name"]) == ["0", "2"] and table["next"][0] == "2"
