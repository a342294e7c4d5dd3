"""Gaia2 runs as pods on the fake cluster: the world is the pod's native sidecar (`world`, ARE's
`world_server.py` run by the fake kubelet), reached by the agent at `LABKUBE_WORLD_URL`."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NAMESPACE, PODS, WORLD_IMAGE, Cluster, eventually
from fakekube import FakeKube
from kubelet import FakeKubelet

from labkube.agent.harness.entrypoint import finalize_stopped
from labkube.budgets import StopReason
from labkube.operator.k8s_models import WorldOptions
from labkube.operator.pod_manifest import pod_name
from labkube.result import Outcome
from labkube.store import CampaignDir
from labkube.tasks.gaia2 import setup_world_env
from labkube.tasks.gaia2.verdict_message import (
    CONTROL_HEADER,
    WORLD_VERDICT_SOURCE,
    WORLD_VERDICT_VARIABLE,
    verdict_from_report,
)

pytestmark = [pytest.mark.slow, pytest.mark.gaia2]

TASK = "gaia2/execution_budget_email"
WORLD = WorldOptions(image=WORLD_IMAGE)
WHITFIELD, WELLS, MARCO = (
    "dana.whitfield@northwind.example",
    "dana.wells@mailbox.example",
    "marco.bianchi@northwind.example",
)


@pytest.fixture(scope="module", autouse=True)
def world_env() -> None:
    setup_world_env()


def phase(cluster: Cluster, name: str) -> str | None:
    obj = cluster.get_campaign(name)
    return ((obj or {}).get("status") or {}).get("phase")


async def until_done(cluster: Cluster, name: str, timeout: float = 120) -> None:
    """Until the campaign is Finished; a campaign the operator refused fails at once, with its reason."""
    await eventually(lambda: phase(cluster, name) in ("Finished", "Failed"), timeout, what=f"campaign {name} to end")
    campaign = cluster.get_campaign(name) or {}
    assert phase(cluster, name) == "Finished", campaign.get("status")


def replay(path: Path, calls: list[tuple[str, dict]]) -> str:
    """A `replay:` model that makes these tool calls (as tests/test_gaia2_agent.py)."""
    lines = [
        json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) for n, a in calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return f"replay:{path}"


@pytest.fixture
def plans() -> Iterator[Path]:
    """A short directory for replay plans: a model's run id keeps only the first 60 characters of its name."""
    with tempfile.TemporaryDirectory(prefix="g2-") as root:
        yield Path(root)


def send_to(plans: Path, to: str) -> str:
    send = {"recipients": [to], "cc": [MARCO], "subject": "Q3 budget final", "content": "The Q3 budget is final."}
    return replay(
        plans / f"{to.split('@')[0]}.jsonl",
        [("EmailClientV2__send_email", send), ("AgentUserInterface__send_message_to_user", {"content": "Sent."})],
    )


def gone(pgid: int) -> bool:
    """No live process is left in process group `pgid` (zombies waiting for init to reap them are dead)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] != "Z":
                return False
    return True


def assert_used_its_sidecar(cluster: Cluster, cdir: CampaignDir, run: dict) -> int:
    """The run's agent talked to its pod's world sidecar (and started no world of its own): its port."""
    pod = pod_name(run["metadata"]["name"], 0)  # the agent's pod (the grading pod that followed it has no world)
    listening = re.fullmatch(r"LISTENING (\d+)\n", cluster.kubelet.log(pod, "world"))
    assert listening, f"the world sidecar of {pod} never listened: {cluster.kubelet.log(pod, 'world', 'err')[-2000:]}"
    port = int(listening[1])
    assert port != WORLD.port  # the kubelet's own port for it, which the agent's LABKUBE_WORLD_URL was rewritten to
    run_dir = cdir.run_dir(run["spec"]["run_id"])
    assert not (run_dir / "logs" / "world.log").exists(), "the agent started a world of its own"
    records = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
    assert any(r["type"] == "world" for r in records)
    obj = cluster.last_pod_state(pod)  # deleted once the result was recorded
    (world,) = obj["status"]["initContainerStatuses"][1:]
    assert world["name"] == "world" and "terminated" in world["state"]  # stopped after the agent
    return port


async def test_oracle_campaign_runs_each_world_as_its_pods_sidecar(cluster: Cluster) -> None:
    async with cluster.operator(world=WORLD):
        cluster.campaign("g2", tasks=[TASK], models=["oracle"], seeds=2, concurrency=2)
        await until_done(cluster, "g2")

    runs = cluster.runs("g2")
    assert len(runs) == 2 and len(cluster.agent_pods_created("g2")) == 2
    cdir = CampaignDir(cluster.campaign_dir("g2"))
    ports = set()
    for run in runs:
        assert run["status"]["phase"] == "Finished" and run["status"]["score"] == 1.0
        result = cdir.result(run["spec"]["run_id"])
        assert result is not None and result.score == 1.0, result
        assert result.details["gaia2"]["success"] is True and result.details["gaia2"]["oracle"] is True
        ports.add(assert_used_its_sidecar(cluster, cdir, run))
    assert len(ports) == 2  # one world per pod
    sidecars = cluster.kubelet.sidecars_started
    assert sorted(name for _, name, _ in sidecars) == ["world", "world"]
    assert all(gone(pgid) for _, _, pgid in sidecars), "a world sidecar outlived its pod"


async def test_replayed_agents_are_judged_by_ares_world_in_the_pod(cluster: Cluster, plans: Path) -> None:
    right, wrong = send_to(plans, WHITFIELD), send_to(plans, WELLS)
    async with cluster.operator(world=WORLD):
        cluster.campaign("judged", tasks=[TASK], models=[right, wrong], seeds=1, concurrency=2)
        await until_done(cluster, "judged")

    cdir = CampaignDir(cluster.campaign_dir("judged"))
    runs = {run["spec"]["model"]: run for run in cluster.runs("judged")}
    assert sorted(runs) == sorted([right, wrong])
    for run in runs.values():
        assert run["status"]["phase"] == "Finished"
        assert_used_its_sidecar(cluster, cdir, run)
    passed = cdir.result(runs[right]["spec"]["run_id"])
    assert passed is not None and passed.score == 1.0, passed.details
    failed = cdir.result(runs[wrong]["spec"]["run_id"])
    assert failed is not None and failed.status.value == "Finished" and failed.score == 0.0
    verdict = failed.details["gaia2"]
    assert verdict["success"] is False and "EmailClientV2__send_email" in verdict["rationale"]
    assert all(gone(pgid) for _, _, pgid in cluster.kubelet.sidecars_started)


async def test_a_world_that_never_listens_fails_the_pod_within_its_startup_time(cluster: Cluster, plans: Path) -> None:
    mute = WorldOptions(image=WORLD_IMAGE, command=["sleep", "600"], startup_seconds=4)  # probes at 0, 2 and 4 s
    async with cluster.operator(world=mute, max_attempts=1):
        cluster.campaign("mute", tasks=[TASK], models=[send_to(plans, WHITFIELD)], seeds=1)

        (name,) = await eventually(lambda: cluster.pods_created("mute"), 30, every=0.05, what="a pod")

        def world_is(state: str) -> dict | None:
            """The pod's status once its world container is in `state` (running, terminated)."""
            status = (cluster.api.read_object(PODS, NAMESPACE, name) or {}).get("status") or {}
            world = next((s for s in status.get("initContainerStatuses") or [] if s["name"] == "world"), None)
            return status if world is not None and state in world["state"] else None

        status = await eventually(lambda: world_is("running"), 30, every=0.05, what="the world sidecar to start")
        began = time.monotonic()
        assert status["phase"] == "Pending" and status["containerStatuses"][0]["state"]["waiting"]
        world = status["initContainerStatuses"][1]
        assert world["name"] == "world" and world["started"] is False and world["ready"] is False
        status = await eventually(lambda: world_is("terminated"), 30, every=0.05, what="the world to be stopped")
        assert time.monotonic() - began < 10
        assert status["phase"] == "Failed"
        assert status["message"].startswith("init container world did not start: its startup probe failed 3 times")
        assert "Connection refused" in status["message"]
        terminated = status["initContainerStatuses"][1]["state"]["terminated"]
        assert terminated["message"] == status["message"].removeprefix("init container world ")
        assert name not in cluster.kubelet.started  # its agent never ran
        await until_done(cluster, "mute")

    (run,) = cluster.runs("mute")
    assert run["status"]["phase"] == "Failed"
    first, final = cluster.pods_created("mute")  # the pod, then the finalize pod, which needs no world
    assert first == name
    final_pod = cluster.created_pod(final)
    assert [c["name"] for c in final_pod["spec"].get("initContainers", [])] == ["prepare"]
    assert run["status"]["stopReason"] == "world_error", run["status"]
    assert run["status"]["outcome"] == "world_error"  # an error outcome, as `kubectl get lkr` shows it
    measured = next(c for c in run["status"]["conditions"] if c["type"] == "Measured")
    assert measured["status"] == "False" and measured["reason"] == "world_error" and measured["message"]
    resumed = next(c for c in run["status"]["conditions"] if c["type"] == "Resumed")
    assert "container world: did not start: its startup probe failed 3 times" in resumed["message"], resumed
    assert all(gone(pgid) for _, _, pgid in cluster.kubelet.sidecars_started)


def sidecar_pod(name: str, agent: list[str]) -> dict:
    """A pod whose sidecar ignores SIGTERM (so only SIGKILL, after the grace period, ends it)."""
    sidecar = {
        "name": "world",
        "image": "sidecar:test",
        "restartPolicy": "Always",
        "command": ["sh", "-c", "trap '' TERM; sleep 600"],
        "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
    }
    agent_container = {"name": "agent", "image": "agent:test", "command": agent}
    spec = {"restartPolicy": "Never", "initContainers": [sidecar], "containers": [agent_container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def test_sidecars_are_killed_when_the_agent_ends_the_pod_goes_or_the_kubelet_stops(tmp_path: Path) -> None:
    async with FakeKube() as api:
        kubelet = FakeKubelet(api, claims={}, grace_s=0.5, work=tmp_path / "kubelet")
        async with kubelet:

            def pod_phase(name: str) -> str | None:
                return ((api.read_object(PODS, NAMESPACE, name) or {}).get("status") or {}).get("phase")

            for name, agent in [("done", ["true"]), *((n, ["sleep", "600"]) for n in ("evicted", "deleted", "left"))]:
                api.create_object(PODS, NAMESPACE, sidecar_pod(name, agent))
            await eventually(lambda: pod_phase("done") == "Succeeded", 10, what="the pod to succeed")
            await eventually(lambda: sorted(kubelet.running()) == ["deleted", "evicted", "left"], 10)
            kubelet.evict("evicted")
            api.delete_object(PODS, NAMESPACE, "deleted")
            await eventually(lambda: pod_phase("evicted") == "Failed", 10, what="the eviction")
            sidecars = {pod: pgid for pod, _, pgid in kubelet.sidecars_started}
            await eventually(lambda: all(gone(sidecars[p]) for p in ("done", "evicted", "deleted")), 5)
            assert not gone(sidecars["left"])
            status = (api.read_object(PODS, NAMESPACE, "evicted") or {})["status"]
            assert status["reason"] == "Evicted" and status["initContainerStatuses"][0]["state"]["terminated"]
        assert gone(sidecars["left"])


async def test_a_verdict_the_agent_forges_in_its_checkpoint_is_not_the_result(
    cluster: Cluster, plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#24 item 2 for Gaia2: ARE fails the email to the wrong Dana. A hostile agent's process (here a thread of the
    test, writing as the agent's processes can: the run's volume) keeps rewriting the checkpoint's verdict to a pass
    from the moment the harness writes it until the run is recorded. The grading pod takes the verdict the world
    sidecar wrote to its own termination message (recorded in the Run's status), so the run fails, 0.0.

    The fake kubelet reads a sidecar's termination-message file as the real one does (the world's own file, bound
    at its `terminationMessagePath`); what only it is trusted with here is that the agent cannot write that file,
    which on a cluster is the container boundary."""
    wrong = send_to(plans, WELLS)
    forged = {"success": True, "rationale": None, "exception": None, "oracle": False, "checks": ["forged"]}
    stop = threading.Event()
    writes = 0

    def forge() -> None:
        nonlocal writes
        while not stop.is_set():
            for ckpt in cluster.volume.glob(f"{NAMESPACE}/forged/runs/*/checkpoint.json"):
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads(ckpt.read_text())
                    if data.get("world_verdict") and data["world_verdict"].get("checks") != ["forged"]:
                        data["world_verdict"] = forged
                        tmp = ckpt.with_suffix(".forged")
                        tmp.write_text(json.dumps(data))
                        tmp.replace(ckpt)
                        writes += 1
            stop.wait(0.02)

    forger = threading.Thread(target=forge, daemon=True)
    forger.start()
    try:
        async with cluster.operator(world=WORLD):
            cluster.campaign("forged", tasks=[TASK], models=[wrong], seeds=1)
            await until_done(cluster, "forged")
    finally:
        stop.set()
        forger.join()

    (run,) = cluster.runs("forged")
    cdir = CampaignDir(cluster.campaign_dir("forged"))
    run_id = run["spec"]["run_id"]
    assert writes >= 1, "the forger never saw the harness's verdict in the checkpoint"
    assert json.loads(cdir.run_dir(run_id).joinpath("checkpoint.json").read_text())["world_verdict"] == forged
    assert run["status"]["phase"] == "Finished" and run["status"]["score"] == 0.0, run["status"]
    reported = verdict_from_report(run["status"]["worldVerdict"])
    assert reported is not None and reported["success"] is False and reported["scenario_id"]
    result = cdir.result(run_id)
    assert result is not None and result.score == 0.0 and result.details["gaia2"]["success"] is False
    assert "EmailClientV2__send_email" in result.details["gaia2"]["rationale"]

    # The same stopped run graded as a grading pod is, but with no verdict from the world (it never judged): the
    # forged checkpoint does not stand in for one; the run is a world error, not a pass.
    copy = cluster.root / "regraded"
    shutil.copytree(cdir.run_dir(run_id), copy)
    (copy / "result.json").unlink()
    monkeypatch.setenv(WORLD_VERDICT_SOURCE, "operator")
    monkeypatch.delenv(WORLD_VERDICT_VARIABLE, raising=False)
    regraded = finalize_stopped(copy, StopReason.done)
    assert regraded.outcome is Outcome.world_error and regraded.score is None, regraded
    assert "reported no verdict" in (regraded.error or "")


async def test_the_worlds_clock_and_verdict_answer_nothing_on_the_pods_loopback_without_the_token(
    cluster: Cluster, plans: Path
) -> None:
    """#41 item 4: the world's control endpoints need the token only the harness holds. A process on the pod's
    loopback (here a thread of the test, as the agent's own processes would be: containers of a pod share it) calls
    `/clock/resume`, `/clock/pause`, `/finish` and `/oracle` without the token and with a wrong one, over and over
    while the run lives: every call is refused, and the run is judged and scored as if no call had been made."""
    right = send_to(plans, WHITFIELD)
    stop = threading.Event()
    answers: list[tuple[str, int]] = []
    endpoints = ("/clock/resume", "/clock/pause", "/finish", "/oracle")

    def neighbour() -> None:
        import httpx

        while not stop.is_set():
            for log in cluster.kubelet.work.glob(f"{NAMESPACE}-*/logs/world.out"):
                listening = re.fullmatch(r"LISTENING (\d+)\n", log.read_text(errors="replace"))
                if not listening:
                    continue
                for path in endpoints:
                    for headers in ({}, {CONTROL_HEADER: "not-the-token-" + "x" * 40}):
                        with contextlib.suppress(httpx.HTTPError):
                            url = f"http://127.0.0.1:{listening[1]}{path}"
                            answers.append((path, httpx.post(url, json={}, headers=headers, timeout=5).status_code))
            stop.wait(0.05)

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    try:
        async with cluster.operator(world=WORLD):
            cluster.campaign("loopback", tasks=[TASK], models=[right], seeds=1)
            await until_done(cluster, "loopback")
    finally:
        stop.set()
        thread.join()

    assert {path for path, _ in answers} == set(endpoints), answers
    assert {status for _, status in answers} == {403}, answers
    (run,) = cluster.runs("loopback")
    assert run["status"]["phase"] == "Finished" and run["status"]["score"] == 1.0, run["status"]
    reported = verdict_from_report(run["status"]["worldVerdict"])
    assert reported is not None and reported["success"] is True and not reported.get("oracle")
    result = CampaignDir(cluster.campaign_dir("loopback")).result(run["spec"]["run_id"])
    assert result is not None and result.score == 1.0 and result.details["gaia2"]["success"] is True
