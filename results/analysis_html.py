"""The `labkube analyze` page: one self-contained HTML file (figures are matplotlib SVG inlined, nothing fetched).

Every figure is drawn from a `FigureData` of the analysis, so the page shows exactly the numbers of the JSON.
Each figure is a `<figure>` with one `<svg>` and one `<figcaption>`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from markupsafe import Markup

from labkube.results.analysis_schema import Analysis, FigureData, Panel
from labkube.results.html_report import (
    BASELINE_COLOR,
    MODEL_COLORS,
    SEED_COLORS,
    SOTA_COLOR,
    figure_svg,
    new_figure,
    plot_style,
    template_env,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["render_analysis_html", "render_figure"]


def _ci(i: object) -> str:
    low, high = getattr(i, "low", None), getattr(i, "high", None)
    return "—" if low is None or high is None else f"[{low:.2f}, {high:.2f}]"


def render_analysis_html(a: Analysis) -> str:
    svgs = {f.id: (f, render_figure(f)) for f in a.figures}

    def figs(prefix: str) -> Markup:
        parts = [
            Markup('<figure class="plot" id="fig-{}">{}<figcaption>{}</figcaption></figure>').format(
                f.id, svg, f.caption
            )
            for fid, (f, svg) in svgs.items()
            if fid.startswith(prefix)
        ]
        return Markup("\n").join(parts)

    return (
        template_env()
        .get_template("analysis.html.j2")
        .render(a=a, figs=figs, ci=_ci, title="labkube analysis: " + ", ".join(a.campaigns))
    )


def render_figure(fig_data: FigureData) -> Markup:
    """One `FigureData` as an inline SVG: a row of panels."""
    n = len(fig_data.panels)
    with plot_style():
        fig = new_figure(min(11.0, 3.4 * n + 1.6), 3.0)
        axes = fig.subplots(1, n, squeeze=False)[0]
        for ax, panel in zip(axes, fig_data.panels, strict=True):
            _draw(ax, fig_data.kind, panel)
        handles: dict[str, object] = {}
        for ax in fig.axes:
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, h)
        if handles and len(handles) <= 24:
            fig.legend(list(handles.values()), list(handles), loc="outside right upper")
        return figure_svg(fig, fig_data.id, fig_data.title)


def _draw(ax: Axes, kind: str, panel: Panel) -> None:
    colors = SEED_COLORS if kind == "lines" else MODEL_COLORS
    if kind == "points":
        for i, s in enumerate(panel.series):
            ys = [y for y in s.y if y is not None]
            jitter = [i + 0.08 * (j - (len(ys) - 1) / 2) for j in range(len(ys))]
            ax.scatter(jitter, ys, color=colors[i % len(colors)], label=s.label, zorder=3)
        ax.set_xticks(range(len(panel.series)), [s.label for s in panel.series], rotation=15, ha="right")
        ax.set_xlim(-0.6, len(panel.series) - 0.4)
    elif kind in ("bars", "stacked"):
        cats = list(dict.fromkeys(str(x) for s in panel.series for x in s.x))
        bottom = [0.0] * len(cats)
        width = 0.8 / (1 if kind == "stacked" else max(1, len(panel.series)))
        for i, s in enumerate(panel.series):
            # an unknown bar (a capability whose every attempt was left out) is not drawn, never drawn as 0
            missing = 0.0 if kind == "stacked" else math.nan
            vals = {str(x): (missing if y is None else y) for x, y in zip(s.x, s.y, strict=True)}
            ys = [vals.get(c, missing) for c in cats]
            if kind == "stacked":
                ax.bar(range(len(cats)), ys, width, bottom=bottom, color=colors[i % len(colors)], label=s.label)
                bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
            else:
                xs = [c + (i - (len(panel.series) - 1) / 2) * width for c in range(len(cats))]
                ax.bar(xs, ys, width * 0.92, color=colors[i % len(colors)], label=s.label)
        ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
        ax.grid(axis="x", visible=False)
    else:
        for i, s in enumerate(panel.series):
            pts = [(float(x), y) for x, y in zip(s.x, s.y, strict=True) if y is not None and math.isfinite(float(x))]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            if kind == "lines":
                ax.plot(
                    xs,
                    ys,
                    drawstyle="steps-post",
                    marker="o",
                    markersize=2.5,
                    linewidth=1.2,
                    color=colors[i % len(colors)],
                    label=s.label if len(panel.series) <= 12 else None,
                )
            else:
                ax.scatter(xs, ys, color=colors[i % len(colors)], label=s.label, s=18, zorder=3)
    for label, y in panel.hlines.items():
        style = {"baseline": ("--", BASELINE_COLOR), "SOTA": (":", SOTA_COLOR)}.get(label, ("-.", BASELINE_COLOR))
        ax.axhline(y, linestyle=style[0], color=style[1], linewidth=1, label=label)
    ax.set_title(panel.title)
    ax.set_xlabel(panel.x_label)
    ax.set_ylabel(panel.y_label)
