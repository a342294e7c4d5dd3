"""The Markdown summary of `labkube analyze`."""

from __future__ import annotations

import math

from labkube.analysis import DENSITY_RULE, FLAG_RULES, PHASE_RULE, PLATEAU_RULE, SHARE_RULE, Analysis, Interval

__all__ = ["render_markdown"]


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _ci(i: Interval) -> str:
    return "—" if i.low is None or i.high is None else f"[{i.low:.2f}, {i.high:.2f}]"


def render_markdown(a: Analysis) -> str:
    lines = [
        "# labkube analysis",
        "",
        f"Campaigns: {', '.join(a.campaigns)}. Runs analysed: {a.runs}"
        + (f"; skipped (not final): {len(a.skipped)}." if a.skipped else "."),
        "",
        "## Capability and reliability",
        "",
        "| task | model | runs | best | mean (95% CI) | median | worst | spread | completion | beat baseline | "
        "pass@1 | pass^k |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in a.groups:
        p1, pn = g.pass_k[0] if g.pass_k else None, g.pass_k[-1] if g.pass_k else None
        lines.append(
            f"| {g.task} | {g.model} | {g.runs} | {_f(g.best)} | {_f(g.mean)} {_ci(g.mean_ci)} | {_f(g.median)} | "
            f"{_f(g.worst)} | {_f(g.spread)} | {g.completion_rate:.0%} | {g.beat_baseline}/{g.runs} | "
            f"{_f(p1.pass_at_k if p1 else None, 2)} | "
            f"{'—' if pn is None else f'{pn.pass_hat_k:.2f} (k={pn.k})'} |"
        )
    lines += ["", "## Efficiency", "", f"- {PLATEAU_RULE}", f"- {SHARE_RULE}", ""]
    lines += ["| run | final | time to best | since last improvement | plateaued | wall share at 25/50/75% |"]
    lines += ["|---|---|---|---|---|---|"]
    for e in a.efficiency:
        wall = e.share_of_final.get("wall", {})
        share = " / ".join(_f(wall.get(k), 2) for k in ("25%", "50%", "75%")) if wall else "—"
        lines.append(
            f"| {e.run_id} | {_f(e.final_score)} | {_f(e.time_to_best_s, 0)} s | "
            f"{_f(e.since_last_improvement_s, 0)} s | {'yes' if e.plateaued else 'no'} | {share} |"
        )
    d = a.density_vs_score
    lines += [
        "",
        "## Behaviour",
        "",
        f"- {PHASE_RULE}",
        f"- {DENSITY_RULE}",
        f"- Action density vs score: n = {d.n}, Pearson r = {_f(d.pearson, 2)} {_ci(d.pearson_ci)}, "
        f"Spearman rho = {_f(d.spearman, 2)} {_ci(d.spearman_ci)} (95% intervals, Fisher z).",
        "",
        "| phase | tool calls by tool |",
        "|---|---|",
    ]
    for phase, mix in a.tool_mix.items():
        lines.append(f"| {phase} | {', '.join(f'{t} {n}' for t, n in mix.items()) or '—'} |")
    lines += ["", "## Failure-mode flags (heuristics)", ""]
    for kind, rule in FLAG_RULES.items():
        lines.append(f"- **{kind}**: {rule}")
    lines.append("")
    lines += [f"- `{f.kind}` {f.run_id}: {f.evidence}" for f in a.flags] or ["No flag fired."]
    if a.gaia2_capabilities:
        lines += [
            "",
            "## Gaia2",
            "",
            "| capability | model | scenarios | pass@1 | pass@k | pass^k |",
            "|---|---|---|---|---|---|",
        ]
        for c in a.gaia2_capabilities:
            lines.append(
                f"| {c.capability} | {c.model} | {c.scenarios} | {c.pass_at_1:.2f} | {c.pass_at_k:.2f} | "
                f"{c.pass_hat_k:.2f} |"
            )
    lines += ["", "## Figures", ""] + [f"- {f.title}: {f.caption}" for f in a.figures]
    return "\n".join(lines) + "\n"
