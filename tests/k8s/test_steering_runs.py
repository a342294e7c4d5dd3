"""Live control of runs on a cluster (issue 44 item 3), against the fake API and kubelet: `labkube runs VERB` appends
to a Run's `spec.interventions` (`k8s_control.steer`), and the operator follows it.

- pause: the run's pod is deleted, the Run shows `Paused` with who and why, its pod's GPU time is closed, no pod is
  made while it is paused, also by an operator that restarts; resume: a new pod resumes from the checkpoint and the
  run finishes, its paused time charged nowhere;
- cancel one run of three: it ends `cancelled` (graded as it stands), the others finish;
- refusals (an unknown run, a finished run, resuming a run that is not paused) are one line each, and nothing is
  patched; a cluster that does not answer is one line.

The fake API was more lenient than kube-apiserver where this touches it: it served no ConfigMaps (added, with the
kubelet projecting a `configMap` volume and its updates into the pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from datetime import datetime
from typing import Any

import pytest
from conftest import NAMESPACE, Cluster, eventually, tiny_task
from prometheus_client import CollectorRegistry
from test_cli_k8s import kubeconfig, labkube_async

from labkube.control import PAUSED_EXIT
from labkube.interventions import ControlError, ControlVerb, Intervention, InterventionKind, SteerRequest
from labkube.operator.k8s_control import CONTROL_KEY, config_map_name, steer
from labkube.operator.k8s_models import OperatorConfig, PodOptions
from labkube.operator.k8s_submit import run_rows
from labkube.operator.kube import KubeError, KubeTarget
from labkube.operator.telemetry import OperatorMetrics
from labkube.store import CampaignDir

pytestmark = pytest.mark.slow

CONFIG_MAPS = ("", "v1", "configmaps")
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}
READ = {"tool": "read_file", "args": {"path": "result.txt"}}


def sleep(seconds: float) -> dict[str, Any]:
    return {"tool": "bash", "args": {"command": f"sleep {seconds:g}"}}


def config(cluster: Cluster, pause_grace_s: int = 1) -> OperatorConfig:
    runtime = cluster.runtime()
    runs = runtime.config.runs.model_copy(update={"pause_grace_seconds": pause_grace_s})
    return runtime.config.model_copy(update={"runs": PodOptions.model_validate(runs.model_dump())})


def request(verb: ControlVerb, campaign: str, *run_ids: str, all_runs: bool = False, **fields: Any) -> SteerRequest:
    kind = InterventionKind.pause if verb is ControlVerb.drain else InterventionKind(verb.value)
    made = Intervention(kind=kind, by="alice@laptop", **fields)
    return SteerRequest(verb=verb, campaign=campaign, run_ids=list(run_ids), all_runs=all_runs, intervention=made)


def campaign_phase(cluster: Cluster, name: str) -> str | None:
    return ((cluster.get_campaign(name) or {}).get("status") or {}).get("phase")


async def steer_on(cluster: Cluster, req: SteerRequest) -> list[str]:
    return await asyncio.to_thread(steer, req, None, NAMESPACE, target=KubeTarget(server=cluster.url))


def run_of(cluster: Cluster, campaign: str, run_id: str) -> dict[str, Any]:
    return next(r for r in cluster.runs(campaign) if r["spec"]["run_id"] == run_id)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def spec_patches(cluster: Cluster) -> list[tuple[str, str, str, str]]:
    """Every change a client made to a Run other than its status (the steerer's patches)."""
    return [a for a in cluster.api.audit if a[0] == "update" and a[1] == "runs"]


async def past_first_step(cluster: Cluster, campaign: str, run_id: str) -> None:
    cdir = CampaignDir(cluster.campaign_dir(campaign))

    def there() -> bool:
        status = cdir.status(run_id) if cdir.exists() else None
        running = [p for p in cluster.pods(campaign) if (p.get("status") or {}).get("phase") == "Running"]
        return bool(running) and status is not None and status.step >= 1

    await eventually(there, 90, what=f"run {run_id} running past its first step")


def agent_exit_code(pod: dict[str, Any]) -> int | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    agent = next((c for c in statuses if c["name"] == "agent"), {})
    return ((agent.get("state") or {}).get("terminated") or {}).get("exitCode")


@pytest.mark.parametrize("now", [False, True], ids=["at-the-next-step", "now"])
async def test_a_paused_run_frees_its_pod_survives_a_restart_and_resumes(cluster: Cluster, now: bool) -> None:
    """A pause with a grace far longer than the test: the harness reads it from the mounted ConfigMap, saves at its
    next step and exits 76 by itself; `now`: the operator deletes the pod at once (SIGTERM)."""
    task = tiny_task(cluster.root, "pausing", [WRITE, sleep(2), sleep(2), sleep(2), READ], resources={"gpus": 1})
    cluster.campaign("ctl", tasks=[str(task)], models=["oracle"], seeds=1)
    async with cluster.operator(config=config(cluster, pause_grace_s=600)):
        await eventually(lambda: cluster.runs("ctl"), 60, what="the Run")
        (run_id,) = [r["spec"]["run_id"] for r in cluster.runs("ctl")]
        await past_first_step(cluster, "ctl", run_id)
        # a message reaches the pod's mounted copy of the Run's interventions
        await steer_on(cluster, request(ControlVerb.message, "ctl", run_id, message="try harder"))

        def mounted() -> dict[str, Any] | None:
            cm = cluster.api.read_object(
                CONFIG_MAPS, NAMESPACE, config_map_name(run_of(cluster, "ctl", run_id)["metadata"]["name"])
            )
            return json.loads(cm["data"][CONTROL_KEY]) if cm else None

        await eventually(lambda: (mounted() or {}).get("interventions"), 30, what="the ConfigMap of interventions")
        assert [i["kind"] for i in mounted()["interventions"]] == ["message"]  # type: ignore[index]

        pause = request(ControlVerb.pause, "ctl", run_id, reason="lunch", now=now)
        assert await steer_on(cluster, pause) == [run_id]
        paused_at = datetime.now().astimezone()

        def paused() -> dict[str, Any] | None:
            run = run_of(cluster, "ctl", run_id)
            return run if run["status"]["phase"] == "Paused" and not cluster.pods("ctl") else None

        run = await eventually(paused, 60, what="the Run Paused and its pod gone")
        held = condition(run, "Paused")
        assert held is not None and held["status"] == "True" and held["reason"] == "PausedByRequest", held
        assert "alice@laptop" in held["message"] and "lunch" in held["message"], held
        (row,) = run_rows([run])  # `labkube status --backend k8s`
        assert row["phase"] == "Paused" and row["message"].startswith("PausedByRequest: paused: pause"), row
        assert all(p["end"] for p in run["status"]["podTimes"]), "the paused pod's GPU time is still open"
        assert [i["kind"] for i in mounted()["interventions"]] == ["message", "pause"]  # type: ignore[index]
        made = len(cluster.agent_pods_created("ctl"))
        stopped = cluster.last_pod_state(cluster.agent_pods_created("ctl")[-1])
        if now:
            assert ("delete", "pods", NAMESPACE, stopped["metadata"]["name"]) in cluster.api.audit
            assert agent_exit_code(stopped) != PAUSED_EXIT
        else:
            assert agent_exit_code(stopped) == PAUSED_EXIT, stopped["status"]  # saved and exited by itself
        campaign = cluster.get_campaign("ctl") or {}
        await eventually(
            lambda: (cluster.get_campaign("ctl") or {}).get("status", {}).get("runs", {}).get("paused"), 10
        )
        assert campaign.get("status", {}).get("phase") != "Finished"

    # a new operator (a restart, a failover) reads the pause from the spec: it starts no pod
    async with cluster.operator(config=config(cluster, pause_grace_s=600)):
        await asyncio.sleep(4)
        assert run_of(cluster, "ctl", run_id)["status"]["phase"] == "Paused"
        assert not cluster.pods("ctl") and len(cluster.agent_pods_created("ctl")) == made
        await asyncio.sleep(1)
        resumed_at = datetime.now().astimezone()
        assert await steer_on(cluster, request(ControlVerb.resume, "ctl", run_id)) == [run_id]
        await eventually(
            lambda: (cluster.get_campaign("ctl") or {}).get("status", {}).get("phase") == "Finished",
            120,
            what="the campaign to finish",
        )

    run = run_of(cluster, "ctl", run_id)
    status = run["status"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
    assert status["crashes"] == 0 and status["disruptions"] == 0, status
    assert condition(run, "Paused")["status"] == "False"  # type: ignore[index]
    agents = cluster.agent_pods_created("ctl")
    assert len(agents) == made + 1
    assert "--resume" in cluster.created_pod(agents[-1])["spec"]["containers"][0]["command"]
    # the time paused is in no pod's interval: not charged to the run or the campaign's GPU-hours
    times = sorted(status["podTimes"], key=lambda p: p["start"])
    agent_times = [p for p in times if p["pod"] in agents]
    first_end = stamp(agent_times[made - 1]["end"])
    second_start = stamp(agent_times[made]["start"])
    assert first_end < resumed_at and second_start >= resumed_at.replace(microsecond=0)
    assert (second_start - first_end).total_seconds() >= (resumed_at - paused_at).total_seconds() - 3
    seconds = sum(max(1.0, (stamp(p["end"]) - stamp(p["start"])).total_seconds()) for p in times)
    assert status["gpuHours"] == pytest.approx(seconds / 3600, abs=1e-4)


async def test_cancelling_one_run_of_three_ends_it_cancelled_and_the_others_finish(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "cancelling", [WRITE, sleep(3), sleep(3), READ])
    cluster.campaign("cx", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=3)
    before = len(spec_patches(cluster))
    metrics = OperatorMetrics()
    async with cluster.operator(metrics, config=config(cluster)):
        await eventually(lambda: len(cluster.runs("cx")) == 3, 60, what="three Runs")
        ids = sorted(r["spec"]["run_id"] for r in cluster.runs("cx"))
        await past_first_step(cluster, "cx", ids[0])
        # refused, one line each, and nothing patched
        refusals = [
            (request(ControlVerb.resume, "cx", ids[0]), "is not paused"),
            (request(ControlVerb.pause, "cx", "no-such-run"), "no run no-such-run"),
            (request(ControlVerb.cancel, "nope", ids[0]), "no Campaign nope"),
        ]
        for req, said in refusals:
            with pytest.raises(ControlError) as refused:
                await steer_on(cluster, req)
            assert said in str(refused.value) and "\n" not in str(refused.value), refused.value
        assert len(spec_patches(cluster)) == before

        assert await steer_on(cluster, request(ControlVerb.cancel, "cx", ids[0], reason="wrong seed")) == [ids[0]]
        await eventually(
            lambda: (cluster.get_campaign("cx") or {}).get("status", {}).get("phase") == "Finished",
            180,
            what="the campaign to finish",
        )

    cancelled = run_of(cluster, "cx", ids[0])["status"]
    assert cancelled["phase"] == "Finished" and cancelled["stopReason"] == "cancelled", cancelled
    assert cancelled["outcome"] == "cancelled", cancelled
    for other in ids[1:]:
        status = run_of(cluster, "cx", other)["status"]
        assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
        assert status["stopReason"] == "done", status
    # graded as it stands, by a grading pod told of the cancel
    (grader,) = [
        g for g in cluster.grading_pods_created("cx") if g.startswith(run_of(cluster, "cx", ids[0])["metadata"]["name"])
    ]
    env = {e["name"]: e.get("value") for e in cluster.created_pod(grader)["spec"]["containers"][0]["env"]}
    account = json.loads(env["LABKUBE_CLUSTER_ACCOUNT"])
    assert [i["kind"] for i in account["interventions"]] == ["cancel"], account
    assert "--finalize" in cluster.created_pod(grader)["spec"]["containers"][0]["command"]
    assert "LABKUBE_CONTROL_FILE" not in env
    # a finished run cannot be steered
    with pytest.raises(ControlError, match="has finished"):
        await steer_on(cluster, request(ControlVerb.cancel, "cx", ids[1]))
    assert len(spec_patches(cluster)) == before + 1
    # the operator's campaign series counts it, from the Runs' records
    registry = CollectorRegistry()
    registry.register(metrics)  # type: ignore[arg-type]
    counted = {"namespace": NAMESPACE, "campaign": "cx", "kind": "cancel"}
    assert registry.get_sample_value("labkube_campaign_interventions_total", counted) == 1.0


def test_a_cluster_that_does_not_answer_is_one_line() -> None:
    req = request(ControlVerb.pause, "c", "r")
    with pytest.raises(KubeError) as failed:
        steer(req, None, "default", target=KubeTarget(server="http://127.0.0.1:9"))
    assert "\n" not in str(failed.value) and "127.0.0.1:9" in str(failed.value), failed.value


async def test_drain_pauses_the_runs_not_started_and_resume_all_runs_them(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "draining", [WRITE, sleep(3), READ])
    cluster.campaign("dr", tasks=[str(task)], models=["oracle"], seeds=3, concurrency=1)
    async with cluster.operator(config=config(cluster)):
        await eventually(lambda: len(cluster.runs("dr")) == 3, 60, what="three Runs")
        ids = sorted(r["spec"]["run_id"] for r in cluster.runs("dr"))
        await eventually(lambda: cluster.agent_pods_created("dr"), 60, what="the first pod")
        first = await eventually(
            lambda: next((r["spec"]["run_id"] for r in cluster.runs("dr") if r["status"].get("attempts")), None),
            30,
            what="the run that started",
        )
        drained = await steer_on(cluster, request(ControlVerb.drain, "dr", reason="cluster maintenance"))
        assert drained == [i for i in ids if i != first]

        def settled() -> bool:
            phases = {i: run_of(cluster, "dr", i)["status"]["phase"] for i in ids}
            return phases[first] == "Finished" and all(phases[i] == "Paused" for i in drained)

        await eventually(settled, 90, what="the started run finished and the others paused")
        await asyncio.sleep(2)
        assert len(cluster.agent_pods_created("dr")) == 1  # a drained run never started
        assert campaign_phase(cluster, "dr") == "Running"
        # through the CLI, as a person steers: the refusal is one line and patches nothing; then resume --all
        where = ("--backend", "k8s", "--kube-context", "fake", "--namespace", NAMESPACE)
        env = {"KUBECONFIG": str(kubeconfig(cluster.root / "kubeconfig", cluster.url))}
        patches = len(spec_patches(cluster))
        code, out, err = await labkube_async("runs", "resume", "dr", first, *where, env=env, cwd=cluster.root)
        assert code == 2 and err.strip().splitlines() == [f"error: campaign dr: run {first}: it has finished; nothing "
                                                          "is left to steer"], err  # fmt: skip
        assert len(spec_patches(cluster)) == patches
        code, out, err = await labkube_async("runs", "resume", "dr", "--all", *where, env=env, cwd=cluster.root)
        assert code == 0, err
        assert sorted(line.split()[1] for line in out.splitlines() if line.startswith("resumed:")) == drained
        await eventually(lambda: campaign_phase(cluster, "dr") == "Finished", 120, what="the campaign to finish")
    for run_id in ids:
        status = run_of(cluster, "dr", run_id)["status"]
        assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
    # resumed runs wait for room under the campaign's concurrency (1): no two pods of it at once
    times = sorted(
        ((stamp(p["start"]), stamp(p["end"])) for r in ids for p in run_of(cluster, "dr", r)["status"]["podTimes"]),
    )
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(times)), times


async def test_an_extended_time_budget_moves_the_run_to_a_pod_with_the_new_deadline(cluster: Cluster) -> None:
    """A pod's activeDeadlineSeconds cannot be raised: the run goes on from its checkpoint in a pod built with the
    extended budget, which is neither a crash nor a disruption."""
    task = tiny_task(cluster.root, "extending", [WRITE, sleep(2), sleep(2), sleep(2), READ])
    cluster.campaign("ex", tasks=[str(task)], models=["oracle"], seeds=1, budgets={"wall_hours": 1})
    async with cluster.operator(config=config(cluster)):
        await eventually(lambda: cluster.runs("ex"), 60, what="the Run")
        (run_id,) = [r["spec"]["run_id"] for r in cluster.runs("ex")]
        await past_first_step(cluster, "ex", run_id)
        (first,) = cluster.agent_pods_created("ex")
        assert cluster.created_pod(first)["spec"]["activeDeadlineSeconds"] <= 3600 + 60
        await steer_on(cluster, request(ControlVerb.extend, "ex", run_id, budgets={"wall_hours": 2}))
        await eventually(lambda: campaign_phase(cluster, "ex") == "Finished", 120, what="the campaign to finish")
    run = run_of(cluster, "ex", run_id)
    status = run["status"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
    assert status["crashes"] == 0 and status["disruptions"] == 0, status
    assert condition(run, "Resumed")["reason"] == "BudgetsExtended"  # type: ignore[index]
    first, second = cluster.agent_pods_created("ex")
    made = cluster.created_pod(second)["spec"]
    assert made["activeDeadlineSeconds"] > 3600 + 60 and "--resume" in made["containers"][0]["command"]
    (prepare,) = [c for c in made["initContainers"] if c["name"] == "prepare"]  # writes the pod's run.json
    (spec_env,) = [e["value"] for e in prepare["env"] if e["name"] == "LABKUBE_RUN_SPEC"]
    assert json.loads(spec_env)["budgets"]["wall_hours"] == 2


def kubectl_patch_campaign(cluster: Cluster, name: str, spec: dict[str, Any]) -> None:
    """`kubectl patch lkc NAME --type=merge -p '{"spec": ...}'`."""
    from kubernetes.client import CustomObjectsApi

    from labkube.operator.kube import api_client

    client = api_client(KubeTarget(server=cluster.url))
    try:
        CustomObjectsApi(client).patch_namespaced_custom_object(
            "labkube.dev", "v1alpha1", NAMESPACE, "campaigns", name, {"spec": spec}
        )
    finally:
        client.close()


async def test_a_suspended_campaign_pauses_its_runs_and_resumes_them_unsuspended(cluster: Cluster) -> None:
    """`spec.suspend` as a Job has it: every unfinished run is paused (by `Campaign spec.suspend`, on the record), and
    unsuspending resumes those, not a run a person paused."""
    task = tiny_task(cluster.root, "suspending", [WRITE, sleep(2), sleep(2), sleep(2), READ])
    cluster.campaign("sus", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=2)
    async with cluster.operator(config=config(cluster, pause_grace_s=0)):
        await eventually(lambda: len(cluster.runs("sus")) == 2, 60, what="two Runs")
        ids = sorted(r["spec"]["run_id"] for r in cluster.runs("sus"))
        await past_first_step(cluster, "sus", ids[0])
        await steer_on(cluster, request(ControlVerb.pause, "sus", ids[1], reason="mine"))
        await asyncio.to_thread(kubectl_patch_campaign, cluster, "sus", {"suspend": True})

        def all_paused() -> bool:
            return all(run_of(cluster, "sus", i)["status"]["phase"] == "Paused" for i in ids) and not cluster.pods(
                "sus"
            )

        await eventually(all_paused, 60, what="every run Paused and no pod")
        by = [[(i["kind"], i["by"]) for i in run_of(cluster, "sus", r)["spec"]["interventions"]] for r in ids]
        assert by == [[("pause", "Campaign spec.suspend")], [("pause", "alice@laptop")]], by
        await asyncio.to_thread(kubectl_patch_campaign, cluster, "sus", {"suspend": False})
        await eventually(
            lambda: run_of(cluster, "sus", ids[0])["status"]["phase"] == "Finished", 90, what="the suspended run"
        )
        assert run_of(cluster, "sus", ids[1])["status"]["phase"] == "Paused"  # a person's pause stands
        await steer_on(cluster, request(ControlVerb.resume, "sus", ids[1]))
        await eventually(lambda: campaign_phase(cluster, "sus") == "Finished", 90, what="the campaign to finish")
    for run_id in ids:
        status = run_of(cluster, "sus", run_id)["status"]
        assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status


async def test_a_usage_checkpoint_pauses_a_run_on_the_clusters_count_until_it_is_resumed(cluster: Cluster) -> None:
    """The agent pod saves and exits at its usage checkpoint; the operator records the checkpoint on the Run at the
    multiple of the pods' time it saw (never the pod's word), so the run stays paused, with no pod, until resumed."""
    every_h = 2.0 / 3600
    task = tiny_task(cluster.root, "metered", [WRITE, sleep(1), sleep(1), sleep(1), sleep(1), READ])
    cluster.campaign("meter", tasks=[str(task)], models=["oracle"], seeds=1, pause_every_hours=every_h)
    async with cluster.operator(config=config(cluster, pause_grace_s=600)):
        await eventually(lambda: cluster.runs("meter"), 60, what="the Run")
        (run_id,) = [r["spec"]["run_id"] for r in cluster.runs("meter")]

        def paused() -> dict[str, Any] | None:
            run = run_of(cluster, "meter", run_id)
            return run if run["status"].get("phase") == "Paused" and not cluster.pods("meter") else None

        run = await eventually(paused, 90, what="the run paused at its usage checkpoint")
        (checkpoint,) = run["spec"]["interventions"]
        assert checkpoint["kind"] == "usage_checkpoint" and checkpoint["by"] == "labkube", checkpoint
        multiple = checkpoint["crossed"]["hours"] / every_h
        assert multiple >= 1 and abs(multiple - round(multiple)) < 1e-6, checkpoint  # a whole multiple
        pods = len(cluster.agent_pods_created("meter"))
        await asyncio.sleep(3)
        assert len(cluster.agent_pods_created("meter")) == pods  # it waits for a person: no pod restarts meanwhile
        for _ in range(10):  # each crossing pauses it again until its plan ends
            if run_of(cluster, "meter", run_id)["status"].get("phase") == "Finished":
                break
            if paused() is not None:
                with contextlib.suppress(ControlError):  # resumed already
                    await steer_on(cluster, request(ControlVerb.resume, "meter", run_id))
            await asyncio.sleep(1)
        await eventually(lambda: campaign_phase(cluster, "meter") == "Finished", 120, what="the campaign to finish")
    status = run_of(cluster, "meter", run_id)["status"]
    assert status["phase"] == "Finished" and status["score"] == pytest.approx(0.6), status
