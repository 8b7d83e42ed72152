"""The parity report of an eval run: Markdown with a PNG histogram (matplotlib, drawn on
its Agg canvas without pyplot, so the caller's matplotlib backend is left alone)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..archive import safe_name
from .stats import ParitySummary


def _md(text, limit: int = 80) -> str:
    """text for a Markdown table cell: escaped and without pipes, backticks or brackets."""
    out = safe_name(text, limit)
    for c in "\\|`*_[]<>":
        out = out.replace(c, "\\" + c)
    return out


def _g(x: float) -> str:
    return f"{x:.3g}"


def markdown(summary: ParitySummary, model: str, data: str, png_name: "str | None") -> str:
    verdict = "PASSED" if summary.passed else "FAILED"
    lines = [
        "# gpukernels eval: parity report", "",
        f"- model: `{safe_name(model, 200).replace('`', '')}`",
        f"- data: `{safe_name(data, 200).replace('`', '')}` ({summary.samples} samples)",
        f"- compared: gpukernels on **{_md(summary.device)}** against **{_md(summary.against)}**",
        f"- tolerance: an element is outside when |y - r| > atol + rtol * |r| "
        f"(rtol {summary.rtol:g}, atol {summary.atol:g}); y: {_md(summary.device)}, r: {_md(summary.against)}",
        "- per sample: the largest absolute and relative element error of the output; p99 is the 99th "
        "percentile of those over the samples",
        f"- result: **{verdict}**", "",
        "| output | max abs | p99 abs | max rel | p99 rel | samples outside | share outside |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for o in summary.outputs:
        lines.append(f"| {_md(o.name)} | {_g(o.max_abs)} | {_g(o.p99_abs)} | {_g(o.max_rel)} | {_g(o.p99_rel)} | "
                     f"{o.outside} / {o.samples} | {o.outside_share * 100:.2f}% |")
    lines += ["", "## Worst samples", ""]
    for o in summary.outputs:
        lines += [f"### {_md(o.name)}", ""]
        if not o.worst:
            lines += ["Every sample agrees exactly.", ""]
            continue
        lines += ["| sample | max abs | max rel | outside |", "| ---: | ---: | ---: | :-: |"]
        lines += [f"| {w['sample']} | {_g(w['max_abs'])} | {_g(w['max_rel'])} | {'yes' if w['outside'] else 'no'} |"
                  for w in o.worst]
        lines.append("")
    if png_name:
        lines += ["## Error histogram", "",
                  "Per-sample largest absolute error (samples that differ), log scale; the dashed line is atol.", "",
                  f"![per-sample errors]({png_name})", ""]
    return "\n".join(lines)


def histogram_png(path: Path, summary: ParitySummary, per_sample: dict) -> None:
    """One histogram per output of log10(per-sample max abs error); samples that agree
    exactly and samples with an infinite error (NaN/inf mismatch) are counted in the title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    k = len(summary.outputs)
    fig = Figure(figsize=(7, 2.6 * k), dpi=100)
    FigureCanvasAgg(fig)
    for j, o in enumerate(summary.outputs):
        ax = fig.add_subplot(k, 1, j + 1)
        err = np.asarray(per_sample[o.name][0], dtype=np.float64)
        positive = err[np.isfinite(err) & (err > 0)]
        counts = [f"{o.outside} of {o.samples} samples outside"]
        if (err == 0).any():
            counts.append(f"{int((err == 0).sum())} equal")
        if (~np.isfinite(err)).any():
            counts.append(f"{int((~np.isfinite(err)).sum())} NaN/inf mismatch")
        if positive.size:
            ax.hist(np.log10(positive), bins=40, color="#4477aa")
        else:
            ax.text(0.5, 0.5, "no sample differs", ha="center", va="center", transform=ax.transAxes)
        if summary.atol > 0:
            ax.axvline(np.log10(summary.atol), color="#cc3311", linestyle="--", linewidth=1)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{safe_name(o.name, 60)}: {', '.join(counts)}", fontsize=9)
        ax.set_xlabel("log10(max |y - r|) per sample", fontsize=8)
        ax.set_ylabel("samples", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)


def write_report(path, summary: ParitySummary, per_sample: dict, model: str, data: str) -> "tuple[str, str]":
    """Write the Markdown report to path and the histogram beside it (same stem, .png)."""
    from .extras import require

    require("matplotlib", "the parity report's histogram")
    md = Path(path)
    png = md.with_suffix(".png")
    histogram_png(png, summary, per_sample)
    tmp = md.with_name(f".{md.name}.{os.getpid()}.tmp")
    tmp.write_text(markdown(summary, model, data, png.name), "utf-8")
    os.replace(tmp, md)
    return str(md), str(png)

