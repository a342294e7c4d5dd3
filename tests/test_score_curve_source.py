"""Issue 41, item 5: on a cluster the periodic gradings run inside the agent's pod, and the grading pod copies them
from the agent-writable checkpoint. The result says so (`score_curve_source: agent_pod`), and every report that shows
the curve or a number taken from it labels it the agent pod's own claim: the trajectory page, the campaign report's
curves, `labkube analyze` (efficiency rows, curves figure, Markdown, HTML, the CLI's summary) and the exported
rewards. A local run's curve (the default, `referee`) carries no such label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analyze_synth import paper_result, plan, plant_campaign, transcript_lines, write_run
from cli_helpers import labkube
from tinytask import make_run_dir, make_tiny_task

from labkube.budgets import StopReason
from labkube.result import AGENT_POD_CURVE_LABEL, TERMINATION_MESSAGE_LIMIT, RunResult, result_from_report
from labkube.result import termination_report as report_text
from labkube.results.analysis import analyze_campaigns
from labkube.results.analysis_html import render_analysis_html
from labkube.results.analysis_md import render_markdown
from labkube.results.export import build_trajectory
from labkube.results.export_rewards import step_rewards, terminal_rewards
from labkube.results.html_report import render_report_html
from labkube.results.trajectory_view import render_run_html
from labkube.run_spec import CLUSTER_ACCOUNT_VARIABLE, ClusterAccount
from labkube.store import CampaignDir

CLAIM = "agent pod's claim"


def shows(page: str, text: str) -> bool:
    """`text` is on the HTML page, its apostrophes escaped as Jinja or matplotlib's SVG writes them, or not."""
    return any(text.replace("'", quote) in page for quote in ("'", "&#39;", "&#x27;", "&apos;"))


def _campaign(root: Path, sources: list[str]) -> list[str]:
    """A synthetic paper campaign of len(sources) runs whose results carry these curve sources; the run ids."""
    runs = plan()[: len(sources)]
    cdir = CampaignDir(root)
    specs = plant_campaign(cdir, "synth", runs, seeds=1)
    for r, spec, source in zip(runs, specs, sources, strict=True):
        result = paper_result(r).model_copy(update={"score_curve_source": source})
        write_run(cdir, spec, result, transcript_lines(r))
    return [r.run_id for r in runs]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    root = tmp_path_factory.mktemp("mixed")
    referee, agent_pod = _campaign(root, ["referee", "agent_pod"])
    return root, referee, agent_pod


def test_the_default_is_the_referee_and_older_results_read_so() -> None:
    data = json.loads(RunResult(run_id="r", task="t", model="m", seed=0, status="Finished").model_dump_json())
    data.pop("score_curve_source")
    result = RunResult.model_validate(data)
    assert result.score_curve_source == "referee" and not result.curve_is_agent_claim


def test_the_termination_report_keeps_the_source_and_fits() -> None:
    result = RunResult(
        run_id="r", task="t", model="m", seed=0, status="Finished", score_curve_source="agent_pod", error="x" * 9000
    )
    text = report_text(result)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    back = result_from_report(text)
    assert back is not None and back.score_curve_source == "agent_pod"
    plain = report_text(result.model_copy(update={"score_curve_source": "referee"}))
    assert "score_curve_source" not in plain  # the default costs the 4096 bytes nothing


def test_the_trajectory_page_labels_only_the_agent_pods_curve(mixed: tuple[Path, str, str]) -> None:
    root, referee, agent_pod = mixed
    claimed = render_run_html(root / "runs" / agent_pod)
    assert 'id="score-plot"' in claimed and 'id="curve-claim"' in claimed
    assert shows(claimed, AGENT_POD_CURVE_LABEL)
    assert shows(claimed, "score (the agent pod's own gradings)")  # the plot's legend
    own = render_run_html(root / "runs" / referee)
    assert 'id="score-plot"' in own and 'id="curve-claim"' not in own
    assert not shows(own, AGENT_POD_CURVE_LABEL) and "own gradings" not in own


def test_the_campaign_report_labels_the_agent_pods_curves(mixed: tuple[Path, str, str]) -> None:
    root, _, _ = mixed
    page = render_report_html(root)
    assert 'id="agent-pod-curve-note"' in page and shows(page, AGENT_POD_CURVE_LABEL)
    assert shows(page, "gradings ran inside the agent's pod on a cluster; only the final score is the grading pod's")
    assert shows(page, f"seed 0 ({CLAIM})")  # the curve's legend


def test_the_referee_only_report_has_no_label(tmp_path: Path) -> None:
    _campaign(tmp_path, ["referee"])
    page = render_report_html(tmp_path)
    assert 'id="agent-pod-curve-note"' not in page and not shows(page, AGENT_POD_CURVE_LABEL)
    assert not shows(page, CLAIM)


def test_the_export_carries_the_source_and_marks_the_rewards_taken_from_the_curve(
    mixed: tuple[Path, str, str],
) -> None:
    root, referee, agent_pod = mixed
    cdir = CampaignDir(root)
    claimed, own = cdir.result(agent_pod), cdir.result(referee)
    assert claimed is not None and own is not None
    assert step_rewards(claimed) and all(
        r["agent_pod_claim"] == AGENT_POD_CURVE_LABEL for rs in step_rewards(claimed).values() for r in rs
    )
    first = next(r for r in terminal_rewards(claimed) if r["kind"] == "first_grading_score")
    assert first["agent_pod_claim"] == AGENT_POD_CURVE_LABEL
    final = next(r for r in terminal_rewards(claimed) if r["kind"] == "final_score")
    assert "agent_pod_claim" not in final  # the grading pod's own
    assert not any("agent_pod_claim" in r for rs in step_rewards(own).values() for r in rs)
    assert not any("agent_pod_claim" in r for r in terminal_rewards(own))
    for run_id, result, source in ((agent_pod, claimed, "agent_pod"), (referee, own, "referee")):
        trajectory = build_trajectory(cdir.run_dir(run_id), result)
        assert trajectory.extra["labkube"]["score_curve_source"] == source
        assert trajectory.extra["rewards"]["score_curve_source"] == source


def test_the_analysis_marks_the_agent_pods_curves(mixed: tuple[Path, str, str]) -> None:
    root, referee, agent_pod = mixed
    analysis = analyze_campaigns([root])
    rows = {e.run_id: e for e in analysis.efficiency}
    assert rows[agent_pod].curve_source == "agent_pod" and rows[referee].curve_source == "referee"
    assert analysis.agent_pod_curves == [agent_pod]
    curves = next(f for f in analysis.figures if f.id.startswith("curves-"))
    labels = {s.label for s in curves.panels[0].series}
    assert labels == {referee, f"{agent_pod} ({CLAIM})"}
    assert AGENT_POD_CURVE_LABEL in curves.caption
    md = render_markdown(analysis)
    assert f"| {agent_pod} (*{CLAIM}*) |" in md and f"| {referee} |" in md
    assert AGENT_POD_CURVE_LABEL in md
    html = render_analysis_html(analysis)
    assert 'id="agent-pod-curves"' in html and shows(html, CLAIM)


def test_the_analyze_command_says_which_curves_are_claims(mixed: tuple[Path, str, str], tmp_path: Path) -> None:
    root, _, _ = mixed
    proc = labkube("analyze", str(root), "--format", "md", "--out", str(tmp_path / "a.md"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"marked: 1 runs whose score curve is {AGENT_POD_CURVE_LABEL}" in proc.stdout


def test_an_analysis_of_referee_curves_has_no_label(tmp_path: Path) -> None:
    _campaign(tmp_path, ["referee", "referee"])
    analysis = analyze_campaigns([tmp_path])
    assert analysis.agent_pod_curves == [] and all(e.curve_source == "referee" for e in analysis.efficiency)
    assert AGENT_POD_CURVE_LABEL not in render_markdown(analysis)
    assert CLAIM not in render_markdown(analysis)
    assert 'id="agent-pod-curves"' not in render_analysis_html(analysis)
    assert all(AGENT_POD_CURVE_LABEL not in f.caption for f in analysis.figures)


def test_a_grading_pod_labels_the_curve_it_copied_from_the_checkpoint(tmp_path: Path) -> None:
    """`labkube agent --finalize` with the operator's account (only a grading pod has it) writes `agent_pod`; the
    same finalization without it (a local run stopped from outside) writes `referee`."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model="noop", sandbox="pod")
    started = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
    assert started.returncode in (0, 1), started.stderr[-2000:]
    account = ClusterAccount(spend=None, wall_seconds=10, attempts=1)
    graded = labkube(
        "agent", "--run-dir", str(rd), "--finalize", StopReason.done.value, cwd=tmp_path,
        env={CLUSTER_ACCOUNT_VARIABLE: account.model_dump_json()},
    )  # fmt: skip
    assert graded.returncode in (0, 1), graded.stderr[-2000:]
    data = json.loads((rd / "result.json").read_text())
    assert data["score_curve_source"] == "agent_pod"
    local = labkube("agent", "--run-dir", str(rd), "--finalize", StopReason.done.value, cwd=tmp_path)
    assert local.returncode in (0, 1), local.stderr[-2000:]
    assert json.loads((rd / "result.json").read_text())["score_curve_source"] == "referee"
