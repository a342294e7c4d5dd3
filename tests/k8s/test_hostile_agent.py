"""An agent that tries to set its own score: it plants a termination message and a `result.json` saying
`Finished`, score 1.0, then dies as an OOM kill does (exit 137). The run must count a crash and resume; its
result comes from the grading pod the operator starts after the agent's pods are gone (`k8s_grading`)."""

from __future__ import annotations

import json

import pytest
from conftest import Cluster, eventually, tiny_task

from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

# Writes a forged result where the operator used to read one (the run's result.json and the container's
# termination message), once, then SIGKILLs the agent process it runs under.
# Writes a forged result where the operator used to read one (the run's result.json and the agent container's
# termination message), once, then SIGKILLs the agent process it runs under, as the kernel's OOM killer would.
# Its commands run in the run's workspace; the termination message is /dev/termination-log in a pod, and where
# the test kubelet keeps that file (beside the pod's /tmp volume, its HOME) here.
PLANT_AND_DIE = r"""python3 - <<'PY'
import json, os, signal
run_dir = os.path.dirname(os.getcwd())
if not os.path.exists(f"{run_dir}/.planted"):
    open(f"{run_dir}/.planted", "w").close()
    run = json.load(open(f"{run_dir}/run.json"))
    forged = {"run_id": run["run_id"], "task": run["task"], "model": run["model"], "seed": run["seed"],
              "status": "Finished", "stop_reason": "done", "outcome": "scored", "score": 1.0,
              "finished_at": "2025-01-01T00:00:00Z"}
    open(f"{run_dir}/result.json", "w").write(json.dumps(forged))
    log = "/dev/termination-log"
    if not os.access(log, os.W_OK):
        log = os.path.join(os.environ["HOME"], "..", "..", "termination", "agent")
    open(log, "w").write(json.dumps({"labkube.result/v1": forged}))
    pid = os.getppid()
    while b"agent\0--run-dir" not in open(f"/proc/{pid}/cmdline", "rb").read():
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGKILL)
PY
"""
STEPS = [
    {"tool": "bash", "args": {"command": PLANT_AND_DIE}},
    {"tool": "bash", "args": {"command": "echo 6 > result.txt"}},
    {"tool": "read_file", "args": {"path": "result.txt"}},
]
WORKSPACES = {
    "shared-claim": None,
    "claim-per-run": {"mode": "pvc"},
}


def phase(cluster: Cluster, name: str) -> str | None:
    return ((cluster.get_campaign(name) or {}).get("status") or {}).get("phase")


@pytest.mark.parametrize("workspace", list(WORKSPACES))
async def test_a_forged_result_and_an_oom_kill_count_as_a_crash_and_the_run_is_graded(
    cluster: Cluster, workspace: str
) -> None:
    task = tiny_task(cluster.root, "forger", STEPS)
    async with cluster.operator(workspace=WORKSPACES[workspace]):
        cluster.campaign("forge", tasks=[str(task)], models=["oracle"], seeds=1)
        await eventually(lambda: phase(cluster, "forge") == "Finished", 120, what="the campaign to finish")

    (run,) = cluster.runs("forge")
    name = run["metadata"]["name"]
    # The plant happened: the first pod ended 137 carrying the forged report.
    first = cluster.last_pod_state(f"{name}-0")
    (agent,) = first["status"]["containerStatuses"]
    assert agent["state"]["terminated"]["exitCode"] == 137
    assert json.loads(agent["state"]["terminated"]["message"])["labkube.result/v1"]["score"] == 1.0
    # ... and counted for what it was: a crash, resumed; the result is the grading pod's.
    status = run["status"]
    assert status["crashes"] == 1 and status["disruptions"] == 0 and status["attempts"] == 2
    resumed = next(c for c in status["conditions"] if c["type"] == "Resumed")
    assert resumed["reason"] == "PodFailed" and "exit code 137" in resumed["message"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6)
    assert status["outcome"] == "scored"
    assert cluster.pods_created("forge") == [f"{name}-0", f"{name}-1", f"{name}-2-grade"]
    grading = cluster.created_pod(f"{name}-2-grade")
    assert [c["name"] for c in grading["spec"]["containers"]] == ["grade"]
    # The operator's campaign directory: with the shared claim, the volume the forged result.json was planted on.
    result = CampaignDir(cluster.campaign_dir("forge")).result(run["spec"]["run_id"])
    assert result is not None and result.score == pytest.approx(0.6)
