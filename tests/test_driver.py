"""The Ray campaign driver in-process on a real local Ray: crash recovery by the supervisor, GPU slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec
from labkube.operator import launch

pytestmark = pytest.mark.slow

CRASH_ONCE = {"tool": "bash", "args": {"command": "[ -f .crashed ] || { touch .crashed; kill -9 $PPID; sleep 5; }"}}
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}


def test_supervisor_resumes_a_crashed_agent(ray_local, tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE, CRASH_ONCE, {"tool": "read_file", "args": {"path": "result.txt"}}])
    # the agent's own command kills its harness ($PPID): only an unsandboxed run can reach it (docs/sandbox.md)
    spec = CampaignSpec(name="crash", tasks=[str(task)], models=["oracle"], seeds=2, sandbox="none")
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert len(results) == 2
    for result in results:
        assert result.status.value == "Finished" and result.stop_reason.value == "done"
        assert result.resumes == 1
        assert result.subtasks[0].raw == 6.0
        transcript = tmp_path / "out" / "runs" / result.run_id / "transcript.jsonl"
        steps = [r["step"] for r in map(json.loads, transcript.read_text().splitlines()) if r["type"] == "model_call"]
        assert steps == list(range(1, len(steps) + 1))


def test_runs_needing_gpus_wait_for_free_gpus(ray_local, tmp_path: Path) -> None:
    # The local Ray here has 2 logical GPUs; each run needs 2, so they run one at a time.
    task = make_tiny_task(tmp_path, [WRITE, {"tool": "bash", "args": {"command": "sleep 1"}}], resources={"gpus": 2})
    spec = CampaignSpec(name="gpu", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert all(r.status.value == "Finished" for r in results)
    records = []
    for r in results:
        lines = (tmp_path / "out" / "runs" / r.run_id / "transcript.jsonl").read_text().splitlines()
        records.append([json.loads(x)["ts"] for x in lines])
    (_, a_end), (b_start, _) = sorted((rec[0], rec[-1]) for rec in records)
    assert b_start >= a_end, "two 2-GPU runs overlapped on a 2-GPU cluster"


def test_a_run_needing_more_gpus_than_the_cluster_has_fails_clearly(ray_local, tmp_path: Path) -> None:
    from labkube.operator import DriverError

    task = make_tiny_task(tmp_path, [WRITE], resources={"gpus": 8})
    spec = CampaignSpec(name="toobig", tasks=[str(task)], models=["oracle"], seeds=1)
    with pytest.raises(DriverError, match="needs 8 GPUs; the Ray cluster has 2"):
        launch(spec, tmp_path / "out", ray_ctx=ray_local)


def test_local_gpu_hour_cap_holds_back_runs_once_used_up(ray_local, tmp_path: Path) -> None:
    from cli_helpers import labkube

    # One GPU run at a time; the first uses ~1.5 GPU-seconds, past a cap of 0.72 GPU-seconds.
    task = make_tiny_task(tmp_path, [WRITE, {"tool": "bash", "args": {"command": "sleep 1.5"}}], resources={"gpus": 1})
    spec = CampaignSpec(name="cap", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=1, gpu_hours_cap=0.0002)
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    # Only the first run has a result; the held one stays unfinished, so a later run of the campaign
    # (with a larger cap) would still start it.
    assert [(r.run_id, r.status.value) for r in results] == [("tiny-task--oracle--s0", "Finished")]
    held = tmp_path / "out" / "runs" / "tiny-task--oracle--s1"
    assert not (held / "result.json").exists()
    status = json.loads((held / "status.json").read_text())
    assert "GPU-hour cap" in status["message"]
    shown = labkube("status", str(tmp_path / "out"), cwd=tmp_path)
    assert "GPU-hour cap" in shown.stdout
    # Run again from the CLI on the same Ray cluster: the finished run is skipped, the held one is held
    # again (the cap is still used up), and the CLI says so and exits non-zero.
    import ray
    import yaml

    file = tmp_path / "cap.yaml"
    file.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    address = ray.get_runtime_context().gcs_address
    out = str(tmp_path / "out")
    again = labkube("campaign", "run", str(file), "--out", out, "--ray-address", address, cwd=tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "1 run(s) not started:" in again.stderr and "raise gpu_hours_cap" in again.stderr
    assert not (held / "result.json").exists()


def test_two_one_gpu_runs_each_see_their_own_gpu(ray_local, tmp_path: Path) -> None:
    """Ray's allocation becomes CUDA_VISIBLE_DEVICES (the agent process's environment, so its commands, jobs and
    grader inherit it): on 2 logical GPUs, two concurrent 1-GPU runs get different ones."""
    show = {"tool": "bash", "args": {"command": 'echo -n "$CUDA_VISIBLE_DEVICES" > cuda.txt; sleep 2'}}
    task = make_tiny_task(tmp_path, [WRITE, show], resources={"gpus": 1})
    spec = CampaignSpec(name="cuda", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert all(r.status.value == "Finished" for r in results)
    seen = [(tmp_path / "out" / "runs" / r.run_id / "workspace" / "cuda.txt").read_text() for r in results]
    assert sorted(seen) == ["0", "1"], seen
    records = []
    for r in results:
        lines = (tmp_path / "out" / "runs" / r.run_id / "transcript.jsonl").read_text().splitlines()
        records.append([json.loads(x)["ts"] for x in lines])
    (_, a_end), (b_start, _) = sorted((rec[0], rec[-1]) for rec in records)
    assert b_start < a_end, "the two runs did not overlap, so the test proves nothing"


def test_a_run_that_asks_for_no_gpu_sees_none(ray_local, tmp_path: Path) -> None:
    """On a machine with GPUs, a CPU run must not use the GPUs Ray gave other runs: CUDA_VISIBLE_DEVICES is set
    and empty (unset, CUDA would see every GPU of the machine)."""
    show = {"tool": "bash", "args": {"command": 'echo -n "[${CUDA_VISIBLE_DEVICES-unset}]" > cuda.txt'}}
    task = make_tiny_task(tmp_path, [WRITE, show])
    spec = CampaignSpec(name="cpu", tasks=[str(task)], models=["oracle"], seeds=1)
    (result,) = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert result.status.value == "Finished"
    assert (tmp_path / "out" / "runs" / result.run_id / "workspace" / "cuda.txt").read_text() == "[]"


def _spans(out: Path, results: list) -> list[tuple[float, float]]:
    """Each run's first and last transcript record times."""
    spans = []
    for r in results:
        lines = (out / "runs" / r.run_id / "transcript.jsonl").read_text().splitlines()
        stamps = [json.loads(x)["ts"] for x in lines]
        spans.append((stamps[0], stamps[-1]))
    return spans


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


def test_runs_queued_in_the_supervisor_never_exceed_the_campaigns_concurrency(ray_local, tmp_path: Path) -> None:
    """On a Ray this driver started, the next runs wait in the one supervisor's own queue (`admit`), not in the
    driver: still no more than `concurrency` runs at once, and as many as that (else the test proves nothing)."""
    task = make_tiny_task(tmp_path, [WRITE, {"tool": "bash", "args": {"command": "sleep 0.6"}}])
    spec = CampaignSpec(name="queue", tasks=[str(task)], models=["oracle"], seeds=6, concurrency=2)
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert len(results) == 6 and all(r.status.value == "Finished" for r in results)
    assert _most_at_once(_spans(tmp_path / "out", results)) == 2


def test_a_supervisor_admits_runs_one_at_a_time_and_starts_none_once_closing(ray_local, tmp_path: Path) -> None:
    """The supervisor actor's contract with the driver: with `admit=1`, the runs it was handed go one after the
    other; once `close()` was called, a run it is handed does not start (None, and nothing written in its folder)."""
    import ray

    from labkube.operator.campaign_run import plan_campaign
    from labkube.operator.driver import SupervisorActor
    from labkube.result import RunResult

    task = make_tiny_task(tmp_path, [WRITE, {"tool": "bash", "args": {"command": "sleep 0.4"}}])
    spec = CampaignSpec(name="admit", tasks=[str(task)], models=["oracle"], seeds=4, concurrency=1)
    cdir, runs, _ = plan_campaign(spec, tmp_path / "out")
    cdir.write_campaign(spec, runs)
    folders = [cdir.root / "runs" / r.run_id for r in runs]
    actor = SupervisorActor.remote()
    try:
        handed = [actor.supervise.remote(str(folder), None, None, 1) for folder in folders[:3]]
        results = [RunResult.model_validate(data) for data in ray.get(handed, timeout=120)]
        assert all(r.status.value == "Finished" for r in results)
        assert _most_at_once(_spans(tmp_path / "out", results)) == 1
        ray.get(actor.close.remote(), timeout=60)
        assert ray.get(actor.supervise.remote(str(folders[3]), None, None, 1), timeout=60) is None
        assert not (folders[3] / "status.json").exists() and not (folders[3] / "transcript.jsonl").exists()
    finally:
        ray.kill(actor)


def test_the_local_head_runs_without_the_monitors_the_dashboard_and_the_agents(ray_local) -> None:
    """A head started on this machine never scales and its workers' logs go to nobody (`log_to_driver=False`): the
    two monitors would be 160 MiB of the operator pod's memory for nothing. Nothing of labkube uses the dashboard's
    API server, which `ray.init` would wait for (about 1.7 s of a short campaign) and keep (150 MiB), nor the
    dashboard and runtime-env agents, which the raylet waits for: stand-ins run in their place
    (`operator/ray_agent_standin.py`). No run or supervisor takes a CPU: the node declares one, so Ray prestarts one
    worker, not one per core. Checked on the processes of this session (the ones whose command line names its
    directory)."""
    import ray

    session = ray._private.worker._global_node.get_session_dir_path()
    commands = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if session in " ".join(argv):
            commands.append(argv)
    programs = [" ".join(argv[:5]) for argv in commands]
    assert any("gcs_server" in p for p in programs) and any("raylet/raylet" in p for p in programs), programs
    assert not [p for p in programs if "monitor.py" in p], "an autoscaler or log monitor was started"
    assert not [p for p in programs if "dashboard/dashboard.py" in p], "the dashboard API server was started"
    assert not [p for p in programs if "dashboard/agent.py" in p or "runtime_env/agent" in p], "a Ray agent started"
    standins = sorted(argv[4] for argv in commands if argv[3:4] and argv[3].endswith("ray_agent_standin.py"))
    assert standins == ["dashboard", "runtime_env"], programs
    assert ray.cluster_resources().get("CPU") == 1.0
    assert ray.cluster_resources().get("GPU") == 2.0  # the node's own parameters are the ones given
