"""Figure helpers: a headless matplotlib and one way to save (PNG for the report, SVG for papers), with every
legend beside its panel, off the curves."""

from __future__ import annotations

import base64
import html
from io import BytesIO
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .io import write_bytes  # noqa: E402


def legends_outside(fig: Figure) -> None:
    """Move each panel's legend of `fig` beside the panel (its upper left corner at the panel's upper right),
    where it covers no curve. When every panel sits on the figure's grid, matplotlib's constrained layout then
    makes room for the legends between the panels. A legend that would still cover another panel (a colorbar
    made under another layout engine, which keeps that engine) goes back inside its panel, where it covers
    the least ("best"). Figure-level legends are left where they are."""
    legends = [ax.get_legend() for ax in fig.axes]
    if not any(legends):
        return
    for ax, legend in zip(fig.axes, legends):
        if legend is not None:
            legend.set_loc("upper left")
            legend.set_bbox_to_anchor((1.02, 1.0), transform=ax.transAxes)
    if all(ax.get_subplotspec() is not None for ax in fig.axes):
        try:
            fig.set_layout_engine("constrained")
        except RuntimeError:  # a colorbar exists under an incompatible engine: that engine stays
            pass
    fig.draw_without_rendering()
    boxes = [ax.get_window_extent() for ax in fig.axes]
    for i, legend in enumerate(legends):
        if legend is not None and any(legend.get_window_extent().overlaps(b) for j, b in enumerate(boxes) if j != i):
            legend.set_loc("best")
            legend.set_bbox_to_anchor(None)


def save_figure(fig: Figure, folder: str | Path, name: str) -> list[Path]:
    """Write `fig` as ``name.png`` (150 dpi) and ``name.svg`` into `folder` atomically, its legends beside their
    panels (`legends_outside`) and the canvas cropped to what it draws; closes it."""
    legends_outside(fig)
    paths = []
    for ext, dpi in (("png", 150), ("svg", "figure")):
        buf = BytesIO()
        fig.savefig(buf, format=ext, bbox_inches="tight", dpi=dpi)
        path = Path(folder) / f"{name}.{ext}"
        write_bytes(path, buf.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths


def png_tag(png: bytes, alt: str) -> str:
    """An HTML ``<img>`` holding the PNG bytes `png` inline (base64), at most as wide as its box."""
    data = base64.b64encode(png).decode()
    return f"<img alt='{html.escape(alt, quote=True)}' style='max-width:100%' src='data:image/png;base64,{data}'>"


def inline_png(fig: Figure, alt: str, dpi: int = 100) -> str:
    """`fig` as an inline PNG ``<img>`` (`png_tag`), its legends beside their panels; closes it."""
    legends_outside(fig)
    buf = BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", dpi=dpi)
    plt.close(fig)
    return png_tag(buf.getvalue(), alt)
