"""What the agent leaves where labkube keeps its own files, met by a grading pod (issue 41 item 2).

On a cluster the grading pod starts on the agent's volume. Before labkube read or wrote anything there, a FIFO as
`transcript.jsonl` hung the audit's read, one as `.agent.lock` or `result.json` failed or hung the grading pod's open,
and a link as a log took labkube's write elsewhere: the run was never graded (its pod ran to its deadline). Now the
grading pod moves each aside unopened, grades the run as it stands, says what it set aside, and gives no clean
verdict. The `prepare` init container, which writes the Run's spec to `run.json`, replaces whatever is there. Real
parts: `labkube agent` as the agent's and the grading pod's containers run it, and the pod manifest's own script.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_helpers import labkube
from tinytask import make_run_dir, make_tiny_task

from labkube.budgets import Spend
from labkube.operator.k8s_models import PodOptions
from labkube.operator.pod_manifest import build_pod_manifest
from labkube.result import RunResult
from labkube.run_spec import CLUSTER_ACCOUNT_VARIABLE, ClusterAccount

pytestmark = pytest.mark.slow

PLANTED = ["transcript.jsonl", "checkpoint.json", "integrity.json", "result.json", ".agent.lock", "status.json"]


def test_a_grading_pod_sets_aside_fifos_and_links_and_grades_the_run(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 2 > result.txt"}}])
    rd = make_run_dir(tmp_path, task, model="oracle", sandbox="pod")
    ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not labkube's\n")
    for name in PLANTED:
        (rd / name).unlink(missing_ok=True)
        os.mkfifo(rd / name)
    for log in (rd / "logs").iterdir():
        log.unlink()
        log.symlink_to(elsewhere)

    account = ClusterAccount(spend=Spend(), wall_seconds=10.0, attempts=1)
    env = {CLUSTER_ACCOUNT_VARIABLE: account.model_dump_json()}
    graded = labkube("agent", "--run-dir", str(rd), "--finalize", "done", cwd=tmp_path, env=env, timeout=120)
    assert graded.returncode == 0, graded.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.outcome.value == "scored" and result.score == pytest.approx(0.2)
    for name in PLANTED[:4]:
        assert f"{name} (a FIFO)" in (result.message or ""), result.message
        assert (rd / f"{name}.refused").is_fifo()
    assert "(a symbolic link)" in (result.message or "")
    assert elsewhere.read_text() == "not labkube's\n", "a write went through the agent's link"
    for name in ("checkpoint.json", "integrity.json", ".agent.lock", "status.json"):  # written again by the grading
        assert (rd / name).is_file() and not (rd / name).is_symlink(), name
    integrity = json.loads((rd / "integrity.json").read_text())
    assert integrity["verdict"] == result.integrity_verdict == "SUSPICIOUS"
    planted = {v["file"] for v in integrity["violations"] if v["type"] == "planted_file"}
    assert {f"{name}.refused" for name in PLANTED[:4]} <= planted and "logs/grader.log.refused" in planted


def test_the_prepare_container_replaces_a_fifo_or_a_link_at_run_json(tmp_path: Path) -> None:
    """The init container's own script (from the manifest), run as its `sh -c`: a FIFO at run.json would block its
    write until the pod's deadline; a link would take the spec elsewhere."""
    from labkube.operator.k8s_models import RunResourceSpec

    run = RunResourceSpec(run_id="r", campaign="c", task="t", task_path="/t", model="oracle", seed=0)
    owner = {"apiVersion": "labkube.dev/v1", "kind": "Run", "metadata": {"name": "c-r", "namespace": "default",
             "uid": "u-1"}}  # fmt: skip
    pod = build_pod_manifest(run, PodOptions(default_image="labkube:test"), owner=owner)
    (prepare,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "prepare"]
    env = {e["name"]: e["value"] for e in prepare["env"]}
    for plant in ("fifo", "link"):
        run_dir = tmp_path / plant / "run"
        run_dir.mkdir(parents=True)
        target = tmp_path / plant / "target"
        target.write_text("")
        os.mkfifo(run_dir / "run.json") if plant == "fifo" else (run_dir / "run.json").symlink_to(target)
        done = subprocess.run(
            prepare["command"], env={**env, "LABKUBE_RUN_DIR": str(run_dir), "PATH": os.environ["PATH"]}, timeout=20
        )
        assert done.returncode == 0
        written = run_dir / "run.json"
        assert written.is_file() and not written.is_symlink() and json.loads(written.read_text())["run_id"] == "r"
        assert target.read_text() == ""


def test_the_audit_reads_no_fifo_the_agent_left_for_its_transcript_or_checkpoint(tmp_path: Path) -> None:
    """`labkube audit RUN_DIR` on a workstation reads the run folder as it is (no grading pod set anything aside): a
    FIFO as `transcript.jsonl`, `checkpoint.json` or the grader's summary is refused without blocking, and the audit
    ends, with the planted files named."""
    import threading

    from labkube.integrity import audit_run

    task = make_tiny_task(tmp_path, [{"tool": "bash", "args": {"command": "echo 2 > result.txt"}}])
    rd = make_run_dir(tmp_path, task, model="oracle")
    ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-2000:]
    for name in ("transcript.jsonl", "checkpoint.json"):
        (rd / name).unlink()
        os.mkfifo(rd / name)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(audit_run(rd)), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "the audit blocked on a FIFO"
    report = done[0]
    planted = {v.file for v in report.violations if v.type.value == "planted_file"}  # type: ignore[attr-defined]
    assert planted == {"transcript.jsonl", "checkpoint.json"}, report
