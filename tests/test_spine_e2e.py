"""The spine end to end: `labkube run` on the real Ray, the results store, the report, re-runs, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import BUNDLED_TASK, labkube, tree_digest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oracle_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("oracle")
    out = work / "camp"
    proc = labkube("run", BUNDLED_TASK, "--model", "oracle", "--seeds", "2", "--out", str(out), cwd=work)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert str(out.resolve()) in proc.stdout
    return out


def report_json(out: Path) -> list[dict]:
    proc = labkube("report", str(out), "--format", "json", cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_oracle_runs_finish_and_beat_the_baseline(oracle_campaign: Path) -> None:
    from labkube.tasks import load_task

    baseline = load_task(BUNDLED_TASK).primary.baseline
    rows = report_json(oracle_campaign)
    assert [r["seed"] for r in rows] == [0, 1]
    for row in rows:
        assert row["status"] == "Finished"
        assert row["stop_reason"] == "done"
        assert row["beat_baseline"] is True
        assert row["completion"] == 1.0
        assert row["integrity_verdict"] == "PASS"
        assert row["tokens_total"] > 0 and row["steps"] >= 3
        result = json.loads((oracle_campaign / "runs" / row["run_id"] / "result.json").read_text())
        raw = next(s["raw"] for s in result["subtasks"] if s["id"] == "avg_acc")
        assert raw > baseline
        assert row["score"] == pytest.approx(result["subtasks"][0]["fraction_of_sota"])


def test_results_store_layout(oracle_campaign: Path) -> None:
    campaign = json.loads((oracle_campaign / "campaign.json").read_text())
    assert campaign["spec"]["tasks"] == [BUNDLED_TASK]
    for run_id in campaign["runs"]:
        run = oracle_campaign / "runs" / run_id
        for name in ("run.json", "transcript.jsonl", "result.json", "logs"):
            assert (run / name).exists(), name
        records = [json.loads(line) for line in (run / "transcript.jsonl").read_text().splitlines()]
        kinds = {r["type"] for r in records}
        assert {"start", "model_call", "tool_call"} <= kinds
        # The oracle's tool calls really ran: its training logs are in the workspace git repository.
        assert list((run / "workspace" / "logs").glob("replay_seed*.log"))
        assert (run / "workspace" / ".git").is_dir()


def test_workspace_hides_what_the_agent_must_not_see(oracle_campaign: Path) -> None:
    ws = oracle_campaign / "runs" / "continual-learning-lite--oracle--s0" / "workspace"
    for hidden in (
        "requirements.txt",
        "install.sh",
        "idea_hint.txt",
        "labkube.yaml",
        "oracle",
        "make_data.py",
    ):
        assert not (ws / hidden).exists(), hidden
    assert (ws / "task_description.md").exists() and (ws / "grading" / "grade.sh").exists()


def test_second_identical_run_skips_finished_runs(oracle_campaign: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in oracle_campaign.rglob("result.json")}
    proc = labkube(
        "run",
        BUNDLED_TASK,
        "--model",
        "oracle",
        "--seeds",
        "2",
        "--out",
        str(oracle_campaign),
        cwd=oracle_campaign.parent,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 of 2 runs already finished" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in oracle_campaign.rglob("result.json")} == before


def test_rerun_retries_only_unfinished_runs(oracle_campaign: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(oracle_campaign, out, symlinks=True)
    unfinished = out / "runs" / "continual-learning-lite--oracle--s1"
    for name in ("result.json", "checkpoint.json", "status.json", "transcript.jsonl", "conversation.jsonl"):
        (unfinished / name).unlink()
    shutil.rmtree(unfinished / "workspace")
    kept = (out / "runs" / "continual-learning-lite--oracle--s0" / "result.json").read_bytes()
    proc = labkube("run", BUNDLED_TASK, "--model", "oracle", "--seeds", "2", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "1 of 2 runs already finished" in proc.stdout
    assert (out / "runs" / "continual-learning-lite--oracle--s0" / "result.json").read_bytes() == kept
    rows = {r["run_id"]: r for r in report_json(out)}
    assert rows["continual-learning-lite--oracle--s1"]["beat_baseline"] is True


def test_do_nothing_run_does_not_beat_the_baseline(tmp_path: Path) -> None:
    out = tmp_path / "noop"
    proc = labkube("run", BUNDLED_TASK, "--model", "noop", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = report_json(out)
    assert row["status"] == "Finished"
    assert row["outcome"] == "no_value"
    assert row["beat_baseline"] is None  # unknown: there is no value to compare with the baseline
    assert row["score"] is None
    assert row["completion"] == 0.0  # the grader ran cleanly and filled none of the subtasks: a measurement
    assert row["message"].startswith("the grader gave no value for subtask avg_acc")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", BUNDLED_TASK, "--model", "gpt5"], "unknown model 'gpt5'"),
        (["run", "researchgym/no-such-task"], "unknown task 'researchgym/no-such-task'"),
        (["campaign", "run", "BAD_FILE"], "BAD_FILE"),
    ],
    ids=["unknown-model", "unknown-task", "malformed-campaign-file"],
)
def test_bad_input_is_one_line_and_writes_nothing(
    oracle_campaign: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    bad = tmp_path / "campaign.yaml"
    bad.write_text("name: demo\ntasks: [researchgym/continual-learning-lite]\nseeds: -3\nbogus: 1\n")
    args = [str(bad) if a == "BAD_FILE" else a for a in args]
    before = tree_digest(oracle_campaign)
    proc = labkube(*args, "--out", str(oracle_campaign), cwd=tmp_path)
    assert proc.returncode == 2
    assert expected.replace("BAD_FILE", str(bad)) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_digest(oracle_campaign) == before


def test_campaign_file_runs_the_same_campaign(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(
        "name: from-file\ntasks: [researchgym/continual-learning-lite]\nmodels: [noop]\nseeds: [3]\n"
        "budgets: {steps: 5}\nconcurrency: 2\n"
    )
    out = tmp_path / "out"
    proc = labkube("campaign", "run", str(spec), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = report_json(out)
    assert row["run_id"] == "continual-learning-lite--noop--s3"
    assert json.loads((out / "runs" / row["run_id"] / "run.json").read_text())["budgets"]["steps"] == 5
