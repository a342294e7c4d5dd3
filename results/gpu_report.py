"""A run's GPU use in reports: mean utilisation and peak memory as text, and its curves as a plot.

A run without a GPU (none asked for, or none NVML could see) reads "no GPU", never 0 %.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from labkube.result import GpuUse

if TYPE_CHECKING:
    from markupsafe import Markup

NO_GPU = "no GPU"


def gpu_text(utilization: float | None, peak_memory_bytes: int | None) -> str:
    """`37% · 7.0 GiB`: the run's mean GPU utilisation and its peak GPU memory; "no GPU" without one."""
    if utilization is None or peak_memory_bytes is None:
        return NO_GPU
    return f"{utilization:.0%} · {peak_memory_bytes / 2**30:.1f} GiB"  # mean utilisation · peak memory


def gpu_plot(runs: Sequence[tuple[str, GpuUse | None]], salt: str, title: str) -> Markup | None:
    """Utilisation and memory over time, one line per run; None when no run had a GPU."""
    curves = [(label, use) for label, use in runs if use is not None and use.curve]
    if not curves:
        return None
    from labkube.results.html_report import SEED_COLORS, _time_unit, figure_legend, figure_svg, new_figure, plot_style

    scale, unit = _time_unit(max(p.at_seconds for _l, use in curves for p in use.curve))
    with plot_style():
        fig = new_figure(10.5, 2.4)
        util_ax, mem_ax = fig.subplots(1, 2, sharex=True)
        for i, (label, use) in enumerate(curves):
            xs = [p.at_seconds / scale for p in use.curve]
            color = SEED_COLORS[i % len(SEED_COLORS)]
            util_ax.plot(xs, [100 * p.utilization for p in use.curve], color=color, linewidth=1.2, label=label)
            mem_ax.plot(xs, [p.memory_used_bytes / 2**30 for p in use.curve], color=color, linewidth=1.2, label=label)
        util_ax.set_ylim(0, 100)
        util_ax.set_title(f"GPU utilisation (%) over wall time ({unit})")
        mem_ax.set_ylim(bottom=0)
        mem_ax.set_title(f"GPU memory used (GiB) over wall time ({unit})")
        figure_legend(fig)
        return figure_svg(fig, salt, title)
