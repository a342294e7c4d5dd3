"""The rows `labkube run` shows and counts while a campaign runs (`report.LiveRows`): the same rows as
`report_rows`, but a final run's files are read once, and a running run's only when one of them changed.

A campaign of three runs written with the real store: one finished, one running, one not started yet.
"""

from __future__ import annotations

from pathlib import Path

from labkube.budgets import Spend, StopReason
from labkube.campaign import CampaignSpec
from labkube.report import LiveRows, report_rows
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunSpec, RunStatus, make_run_id
from labkube.store import CampaignDir, write_model
from labkube.tasks import BUNDLED

TASK = "researchgym/retrieval-ranking"


def run_spec(seed: int) -> RunSpec:
    return RunSpec(
        run_id=make_run_id(TASK, "oracle", seed, "rg-agent"),
        campaign="live",
        task=TASK,
        task_path=str(BUNDLED / TASK),
        model="oracle",
        seed=seed,
    )


def final_result(spec: RunSpec, score: float, verdict: str | None = "PASS") -> RunResult:
    return RunResult(
        run_id=spec.run_id,
        task=spec.task,
        model=spec.model,
        seed=spec.seed,
        status=RunPhase.finished,
        stop_reason=StopReason.done,
        score=score,
        spend=Spend(steps=3),
        integrity_verdict=verdict,
    )


def write_status(cdir: CampaignDir, spec: RunSpec, phase: RunPhase, step: int) -> None:
    write_model(
        cdir.run_dir(spec.run_id) / "status.json",
        RunStatus(run_id=spec.run_id, phase=phase, step=step, spend=Spend(steps=step)),
    )


def test_live_rows_read_a_final_run_once_and_a_running_run_when_it_changes(tmp_path: Path) -> None:
    cdir = CampaignDir(tmp_path / "camp")
    finished, running, waiting = (run_spec(seed) for seed in range(3))
    cdir.write_campaign(
        CampaignSpec(name="live", tasks=[TASK], models=["oracle"], seeds=3), [finished, running, waiting]
    )
    write_status(cdir, finished, RunPhase.finished, 3)
    write_model(cdir.run_dir(finished.run_id) / "result.json", final_result(finished, 0.5))
    write_status(cdir, running, RunPhase.running, 1)

    live = LiveRows(cdir)
    assert live.rows() == report_rows(cdir)
    assert [r.status for r in live.rows()] == ["Finished", "Running", "Pending"]

    # A final run's result is not read again: a changed (here damaged) result.json leaves its row as it was.
    (cdir.run_dir(finished.run_id) / "result.json").write_text("{not json")
    assert live.rows()[0].score == 0.5
    assert report_rows(cdir)[0].score is None  # what reading it again would have shown

    # A running run's row follows its files as they change, and so does a run that starts.
    write_status(cdir, running, RunPhase.running, 2)
    write_status(cdir, waiting, RunPhase.starting, 0)
    assert [(r.status, r.steps) for r in live.rows()[1:]] == [("Running", 2), ("Starting", 0)]
    write_model(cdir.run_dir(running.run_id) / "result.json", final_result(running, 0.75))
    write_status(cdir, running, RunPhase.finished, 3)
    assert live.rows()[1:] == report_rows(cdir)[1:]
    assert live.rows()[1].score == 0.75


def test_a_final_result_is_read_again_until_its_audit_has_put_its_verdict_in(tmp_path: Path) -> None:
    """The agent writes a final `result.json`, then its audit (an LLM inspector may take seconds) rewrites it with the
    integrity verdict: a row kept from before would show the run unaudited in the live table and the final one."""
    cdir = CampaignDir(tmp_path / "camp")
    run = run_spec(0)
    cdir.write_campaign(CampaignSpec(name="live", tasks=[TASK], models=["oracle"], seeds=1), [run])
    write_status(cdir, run, RunPhase.finished, 3)
    write_model(cdir.run_dir(run.run_id) / "result.json", final_result(run, 0.5, verdict=None))
    live = LiveRows(cdir)
    assert live.rows()[0].integrity_verdict is None
    write_model(cdir.run_dir(run.run_id) / "result.json", final_result(run, 0.5, verdict="SUSPICIOUS"))
    assert live.rows()[0].integrity_verdict == "SUSPICIOUS"
    assert live.rows() == report_rows(cdir)
