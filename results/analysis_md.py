"""The Markdown summary of `labkube analyze`."""

from __future__ import annotations

import math

from labkube.result import AGENT_POD_CURVE_LABEL
from labkube.results.analysis_schema import (
    CURVE_SOURCE_RULE,
    DENSITY_RULE,
    FLAG_RULES,
    PHASE_RULE,
    PLATEAU_RULE,
    SHARE_RULE,
    Analysis,
)
from labkube.results.analysis_stats import Interval

__all__ = ["render_markdown"]


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _yes_no(x: bool | None) -> str:
    return "—" if x is None else "yes" if x else "no"


def _ci(i: Interval) -> str:
    return "—" if i.low is None or i.high is None else f"[{i.low:.2f}, {i.high:.2f}]"


def render_markdown(a: Analysis) -> str:
    lines = [
        "# labkube analysis",
        "",
        f"Campaigns: {', '.join(a.campaigns)}. Runs analysed: {a.runs}"
        + (f"; skipped (not final): {len(a.skipped)}" if a.skipped else "")
        + (f"; left out, error outcome: {len(a.errors)}" if a.errors else "")
        + (f"; left out, cancelled: {len(a.cancelled)}" if a.cancelled else "")
        + (f"; left out, intervened: {len(a.excluded_intervened)}" if a.excluded_intervened else "")
        + (f"; intervened in (analysed): {len(a.intervened)}" if a.intervened else "")
        + (f"; left out, SUSPICIOUS: {len(a.excluded_suspicious)}" if a.excluded_suspicious else "")
        + ".",
        "",
        "## Capability and reliability",
        "",
        f"- {a.rules['scores']}",
        f"- {a.rules['pass']}",
        "",
        "| task | model | runs | no value | errors (left out) | cancelled (left out) | best | mean (95% CI) | median | "
        "worst | spread | mean, no value = 0 | completion | beat baseline | pass@1 | pass^k |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in a.groups:
        p1, pn = g.pass_k[0] if g.pass_k else None, g.pass_k[-1] if g.pass_k else None
        lines.append(
            f"| {g.task} | {g.model} | {g.runs} | {g.no_value} | {g.errors} | {g.cancelled} | {_f(g.best)} | "
            f"{_f(g.mean)} {_ci(g.mean_ci)} | {_f(g.median)} | {_f(g.worst)} | {_f(g.spread)} | "
            f"{_f(g.mean_no_value_as_zero)} | {_pct(g.completion_rate)} | {g.beat_baseline}/{g.runs} | "
            f"{_f(p1.pass_at_k if p1 else None, 2)} | "
            f"{'—' if pn is None else f'{pn.pass_hat_k:.2f} (k={pn.k})'} |"
        )
    if a.errors or a.cancelled or a.excluded_suspicious or a.excluded_unsandboxed or a.excluded_intervened:
        lines += ["", "Left out of every analysis:", ""]
        lines += [f"- {e.run_id}: `{e.outcome}`" + (f": {e.error}" if e.error else "") for e in a.errors]
        lines += [f"- {e.run_id}: `cancelled` by a person" for e in a.cancelled]
        lines += [f"- {rid}: a person intervened in it (--exclude-intervened)" for rid in a.excluded_intervened]
        lines += [f"- {rid}: integrity verdict SUSPICIOUS (--exclude-suspicious)" for rid in a.excluded_suspicious]
        lines += [f"- {rid}: ran unsandboxed (--exclude-unsandboxed)" for rid in a.excluded_unsandboxed]
    lines += ["", "## Efficiency", "", f"- {PLATEAU_RULE}", f"- {SHARE_RULE}", ""]
    if a.agent_pod_curves:
        lines[-1:] = [f"- {CURVE_SOURCE_RULE}", ""]
        lines += [
            f"**{len(a.agent_pod_curves)} run(s) have a score curve that is {AGENT_POD_CURVE_LABEL}** (their rows are "
            "marked *agent pod's claim*): time to best, plateau and shares below are the agent's own claim for them.",
            "",
        ]
    lines += ["| run | final | time to best | since last improvement | plateaued | wall share at 25/50/75% |"]
    lines += ["|---|---|---|---|---|---|"]
    for e in a.efficiency:
        wall = e.share_of_final.get("wall", {})
        share = " / ".join(_f(wall.get(k), 2) for k in ("25%", "50%", "75%")) if wall else "—"
        run = f"{e.run_id} (*agent pod's claim*)" if e.curve_source == "agent_pod" else e.run_id
        lines.append(
            f"| {run} | {_f(e.final_score)} | {_f(e.time_to_best_s, 0)} s | "
            f"{_f(e.since_last_improvement_s, 0)} s | {_yes_no(e.plateaued)} | {share} |"
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
            "| capability | model | scenarios | pass@1 | pass@k | pass^k | excluded (error or no verdict) |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in a.gaia2_capabilities:
            lines.append(
                f"| {c.capability} | {c.model} | {c.scenarios} | {_f(c.pass_at_1, 2)} | {_f(c.pass_at_k, 2)} | "
                f"{_f(c.pass_hat_k, 2)} | {c.excluded} |"
            )
    lines += ["", "## Figures", ""] + [f"- {f.title}: {f.caption}" for f in a.figures]
    return "\n".join(lines) + "\n"
