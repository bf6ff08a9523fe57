"""Figure helpers: a headless matplotlib and one way to save (PNG for the report, SVG for papers)."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .io import write_bytes  # noqa: E402


def save_figure(fig: Figure, folder: str | Path, name: str) -> list[Path]:
    """Write `fig` as ``name.png`` (150 dpi) and ``name.svg`` into `folder` atomically; closes it."""
    paths = []
    for ext, dpi in (("png", 150), ("svg", "figure")):
        buf = BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", dpi=dpi)
        path = Path(folder) / f"{name}.{ext}"
        write_bytes(path, buf.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths
