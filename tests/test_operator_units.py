"""Plain functions of the operator that the cluster tests use but do not pin down: the termination report's
size limit, the API retry policy, what counts as a disruption, admission of every tenancy field, the run
policy kinds, and the standby's health endpoint. No cluster, no Ray."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from pydantic import ValidationError

from labkube.operator.admission import admission_violations, image_allowed
from labkube.operator.campaign_daemon import CampaignSpecError, plan_resource_campaign
from labkube.operator.k8s_models import OperatorConfig, PodOptions, PodSettings, RunResourceSpec, Tenancy
from labkube.operator.kube import backoff_delay, retry_after, retrying
from labkube.operator.pod_status import disruption_of
from labkube.operator.replica import LEADING, ReplicaState, serve_health
from labkube.operator.telemetry import OperatorMetrics
from labkube.result import TERMINATION_MESSAGE_LIMIT, RunResult, SubtaskScore, result_from_report, termination_report
from labkube.run_spec import RunPhase
from labkube.task_card import Resources

# -- the termination report -----------------------------------------------------------------------


def big_result(subtasks: int, error: str | None = None) -> RunResult:
    return RunResult(
        run_id="r",
        task="researchgym/x",
        model="openai:gpt-5",
        seed=1,
        status=RunPhase.failed if error else RunPhase.finished,
        score=0.7,
        error=error,
        subtasks=[SubtaskScore(id=f"table_{i}_metric_with_a_long_name", raw=float(i)) for i in range(subtasks)],
    )


def test_a_small_result_round_trips_through_the_termination_message() -> None:
    result = big_result(3)
    text = termination_report(result)
    assert result_from_report(text) == result.model_copy(
        update={"score_curve": [], "details": {}, "values_before_error": []}
    )


def test_a_large_result_is_cut_to_the_kubernetes_limit_keeping_the_outcome() -> None:
    for result in (big_result(200), big_result(200, error="x" * 10_000)):
        text = termination_report(result)
        assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
        back = result_from_report(text)
        # a failed run is an error outcome, which carries no score (its grader's values stay in result.json)
        assert back is not None and back.status == result.status and back.score == result.score
        assert back.score == (None if result.is_error else 0.7) and back.outcome == result.outcome
        assert back.subtasks == [] and (back.error is None or len(back.error) <= 300)


def test_a_log_tail_is_not_a_report() -> None:
    assert result_from_report("Traceback (most recent call last):\n  boom") is None
    assert result_from_report(None) is None and result_from_report('{"other": 1}') is None


# -- retries ----------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"({status})")
        self.status, self.headers = status, headers or {}


def test_backoff_is_capped_exponential_with_jitter() -> None:
    for attempt, ceiling in ((0, 0.5), (1, 1.0), (3, 4.0), (20, 30.0)):
        delays = {backoff_delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays) and len(delays) > 1


def test_retry_after_is_read_from_the_answer() -> None:
    assert retry_after(ApiError(429, {"Retry-After": "3"})) == 3.0
    assert retry_after(ApiError(503)) is None and retry_after(ApiError(503, {"Retry-After": "soon"})) is None


async def test_retrying_waits_out_transient_errors_and_honours_retry_after() -> None:
    answers: list[Exception | str] = [ApiError(503), ApiError(429, {"Retry-After": "0.6"}), ApiError(410), "ok"]
    started = time.monotonic()

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert await retrying(call, first_delay_s=0.01) == "ok"
    assert time.monotonic() - started >= 0.6  # the server asked for 0.6 s


async def test_retrying_gives_up_past_its_patience_and_never_retries_a_client_error() -> None:
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ApiError(503)

    started = time.monotonic()
    with pytest.raises(ApiError):
        await retrying(down, patience_s=0.5, first_delay_s=0.05)
    # it retried, and gave up rather than wait past its patience: before the wait (jittered) that would have passed
    # it, so anywhere from the first waits to the patience itself (the old lower bound, 0.2 s, failed when the jitter
    # made the fourth wait longer than what was left)
    assert time.monotonic() - started < 0.5 + 0.2 and calls > 2

    async def not_found() -> None:
        raise ApiError(404)

    with pytest.raises(ApiError):
        await asyncio.wait_for(retrying(not_found), 1.0)


# -- disruptions --------------------------------------------------------------------------------------


def pod(reason: str = "", conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"status": {"phase": "Failed", "reason": reason, "conditions": conditions or []}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            pod(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
            "PreemptionByScheduler",
        ),
        (
            pod(conditions=[{"type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue"}]),
            "StoppedByKueue",
        ),
        (pod(conditions=[{"type": "DisruptionTarget", "status": "False", "reason": "X"}]), None),
        (pod("Evicted"), "Evicted"),
        (pod("Terminated"), "Terminated"),  # graceful node shutdown (a spot reclaim)
        (pod("OOMKilled"), None),
        (pod(), None),
        (None, None),
    ],
)
def test_what_counts_as_a_disruption(obj: dict[str, Any] | None, expected: str | None) -> None:
    assert disruption_of(obj) == expected


# -- admission ----------------------------------------------------------------------------------------


def run(pod: PodSettings | None = None, **resources: Any) -> RunResourceSpec:
    return RunResourceSpec(
        run_id="r", campaign="c", task="t", task_path="/t", model="oracle", seed=0,
        resources=Resources(**resources), pod=pod or PodSettings(),
    )  # fmt: skip


OPTIONS = PodOptions(default_image="ghcr.io/labkube/labkube:1", priority_class_name="batch", runtime_class_name="runc")


def test_every_tenancy_field_is_refused_outside_its_list_and_allowed_inside() -> None:
    asking = run(
        PodSettings(
            priority_class_name="urgent",
            queue_name="fast",
            node_selector={"pool": "h100"},
            tolerations=[{"key": "dedicated", "operator": "Exists"}],
            runtime_class_name="kata",
            labels={"team": "nlp"},
            annotations={"example.com/owner": "me"},
        ),
        image="evil.example/x:1",
        runtime_class="gvisor",
        node_selector={"zone": "z9"},
    )
    refused = admission_violations([asking], OPTIONS, Tenancy())
    fields = [line.split(":", 1)[0] for line in refused]
    assert fields == [
        "spec.pod.priorityClassName",
        "spec.pod.queueName",
        "spec.pod.nodeSelector",
        "task t",  # resources.node_selector
        "spec.pod.tolerations",
        "spec.pod.runtimeClassName",
        "task t",  # resources.runtime_class
        "task t",  # resources.image
        "spec.pod.labels",
        "spec.pod.annotations",
    ]
    assert all("none allowed (chart value tenancy)" in line for line in refused)
    tenancy = Tenancy(
        priority_classes=["urgent"],
        queue_names=["fast"],
        node_selectors={"pool": ["h100"], "zone": ["z9"]},
        toleration_keys=["dedicated"],
        runtime_classes=["kata", "gvisor"],
        images=["evil.example/"],
        pod_labels=["team"],
        pod_annotations=["example.com/"],
    )
    assert admission_violations([asking], OPTIONS, tenancy) == []
    # What the chart itself sets is always allowed.
    chart_own = run(
        PodSettings(priority_class_name="batch", runtime_class_name="runc"), image="ghcr.io/labkube/labkube:1"
    )
    assert admission_violations([chart_own], OPTIONS, Tenancy()) == []


def test_an_image_entry_is_exact_or_a_registry_or_repository_prefix() -> None:
    allowed = ["ghcr.io/labkube/", "docker.io/library/python:", "quay.io/x/y:1"]
    assert image_allowed("ghcr.io/labkube/runner:0.1", allowed)
    assert image_allowed("docker.io/library/python:3.11", allowed) and image_allowed("quay.io/x/y:1", allowed)
    assert not image_allowed("ghcr.io/labkube-evil/x:1", allowed) and not image_allowed("quay.io/x/y:2", allowed)


# -- config ---------------------------------------------------------------------------------------------


def test_run_policies_of_an_unknown_kind_are_refused_at_start() -> None:
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p"}, "spec": {}}
    runs = {"defaultImage": "i"}
    assert OperatorConfig.model_validate({"runs": runs, "runPolicies": [policy]}).run_policies == [policy]
    with pytest.raises(ValidationError, match="is not a policy kind labkube applies"):
        OperatorConfig.model_validate({"runs": runs, "runPolicies": [{**policy, "kind": "AdminNetworkPolicy"}]})


def test_a_replica_answers_its_health_probe_whatever_it_is_doing() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    replica = ReplicaState()
    with serve_health(port, replica):
        for doing, leader in (("standing by for the leader lease", False), ("leading; connecting to Ray", True)):
            replica.now(doing, leader=leader)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                assert resp.status == 200 and resp.read().decode().strip() == doing
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)  # gone once the process ends


def test_a_leader_whose_kopf_loop_stopped_beating_fails_its_liveness_probe() -> None:
    """What kopf's own liveness endpoint caught: a hung event loop. A standby or a replica connecting to Ray has no
    loop to beat and stays healthy."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    replica = ReplicaState(stall_s=0.3)

    def probe() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    with serve_health(port, replica):
        replica.now("standing by for the leader lease", leader=False)
        time.sleep(0.4)  # the scenario: longer than stall_s without a beat
        assert probe()[0] == 200
        replica.now(LEADING, leader=True)
        assert probe() == (200, "leading\n")
        time.sleep(0.4)
        code, text = probe()
        assert code == 503 and "kopf's event loop has not answered" in text, (code, text)
        replica.beat()
        assert probe()[0] == 200


def test_same_named_campaigns_in_two_namespaces_are_two_series_under_one_help_line() -> None:
    """promtool (the real parser Prometheus ships) checks the exposition; a repeated `# HELP` or two identical
    series fail it."""
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    replica = ReplicaState()
    replica.now("leading", leader=True)
    metrics = OperatorMetrics(replica)
    for namespace, gpu_hours_cap in (("team-a", 1.0), ("team-b", 2.0)):
        metrics.telemetry(namespace, "sweep", gpu_hours_cap)
    registry = CollectorRegistry()
    registry.register(metrics)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert text.count("# HELP labkube_campaign_gpu_seconds_cap ") == 1, text
    for namespace, cap in (("team-a", 3600.0), ("team-b", 7200.0)):
        labels = {"campaign": "sweep", "namespace": namespace}
        assert registry.get_sample_value("labkube_campaign_gpu_seconds_cap", labels) == cap
    assert registry.get_sample_value("labkube_operator_leader") == 1.0
    proc = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # fenced (or standing by): the leader gauge alone, no frozen copy of the campaigns' series
    replica.now("fenced: lost the leader lease", leader=False)
    fenced = generate_latest(registry).decode()
    assert registry.get_sample_value("labkube_operator_leader") == 0.0 and "labkube_campaign_" not in fenced


# -- planning a Campaign resource with task overlays --------------------------------------------------------


def campaign_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "labkube.dev/v1alpha1",
        "kind": "Campaign",
        "metadata": {"name": "cl", "namespace": "default", "uid": "u-1"},
        "spec": {"tasks": ["researchgym/continual-learning-lite"], "models": ["oracle"], **spec},
    }


def test_a_campaign_resources_overlay_reaches_its_runs_and_their_cards() -> None:
    overlay = {"subtasks": [{"id": "avg_acc", "sota": 0.9}], "budgets": {"steps": 12}}
    spec, runs, cards = plan_resource_campaign(campaign_body(task_overlays={"continual-learning-lite": overlay}))
    assert spec.task_overlays == {"continual-learning-lite": overlay}
    (run,) = runs
    assert run.task_overlay == overlay and run.budgets.steps == 12
    card = cards[run.run_id]
    assert card.primary is not None and card.primary.sota == 0.9
    assert card.overlay == "campaign overlay for continual-learning-lite"


@pytest.mark.parametrize(
    ("spec", "reason", "expected"),
    [
        (
            {"overlay": "/home/me/overlays"},
            "InvalidSpec",
            "Campaign cl: spec: overlay is a path on your machine, which the cluster cannot read: give the "
            "labkube.yaml mappings in task_overlays (task folder name -> mapping), or use "
            "`labkube run --backend k8s --overlay PATH`, which reads the files",
        ),
        (
            {"task_overlays": {"continual-learning-lite": {"subtasks": [{"id": "avg_acc", "sotta": 1}]}}},
            "InvalidOverlay",
            "Campaign cl: task continual-learning-lite: campaign overlay for continual-learning-lite: "
            "subtasks.0.sotta: unknown key (did you mean `sota`?)",
        ),
        (
            {"task_overlays": {"continual-learning": {}}},
            "InvalidOverlay",
            "Campaign cl: task_overlays: continual-learning is not a task folder this campaign runs "
            "(did you mean continual-learning-lite?)",
        ),
        (
            {"task_overlays": {"continual-learning-lite": "sota: 1"}},
            "InvalidSpec",
            "Campaign cl: spec.task_overlays.continual-learning-lite: Input should be a valid dictionary",
        ),
    ],
)
def test_a_bad_overlay_in_a_campaign_resource_is_one_line(spec: dict[str, Any], reason: str, expected: str) -> None:
    with pytest.raises(CampaignSpecError) as caught:
        plan_resource_campaign(campaign_body(**spec))
    assert (caught.value.reason, str(caught.value)) == (reason, expected)


async def test_api_turns_let_status_patches_go_before_pod_creations() -> None:
    """While a campaign starts, a Run's status patch goes before the creation of other Runs' pods (at 1,000 Runs the
    Running patches queued behind creations for 1.5 s); among equals, first come first served; a waiter cancelled as
    it is handed a turn passes it on, so no turn is lost."""
    import asyncio

    from labkube.operator.kube_session import OTHER_CALLS, STATUS_FIRST, Turns

    turns = Turns(1)
    order: list[str] = []

    async def call(name: str, priority: int) -> None:
        async with turns.take(priority):
            order.append(name)

    async with turns.take(OTHER_CALLS):  # held while the others queue
        doomed = asyncio.create_task(call("cancelled", STATUS_FIRST))
        await asyncio.sleep(0)  # one turn of the loop, not a wait: the task queues before the others
        waiters = [
            asyncio.create_task(call("create-a", OTHER_CALLS)),
            asyncio.create_task(call("create-b", OTHER_CALLS)),
            asyncio.create_task(call("status-a", STATUS_FIRST)),
            asyncio.create_task(call("status-b", STATUS_FIRST)),
        ]
        await asyncio.sleep(0)  # one turn of the loop: the waiters queue while the turn is held
    doomed.cancel()  # handed the turn as the block ended, cancelled before it ran: it passes the turn on
    await asyncio.gather(*waiters)
    assert order == ["status-a", "status-b", "create-a", "create-b"]
    assert turns.free == 1 and not turns.waiting


def test_pod_label_and_annotation_keys_are_allowed_by_exact_key_or_prefix_and_labkubes_own_never() -> None:
    tenancy = Tenancy(pod_labels=["team", "cost.example.com/*"], pod_annotations=["example.com/", "prometheus.io/*"])
    allowed = run(
        PodSettings(
            labels={"team": "nlp", "cost.example.com/center": "42"},
            annotations={"example.com/owner": "me", "prometheus.io/scrape": "true"},
        )
    )
    assert admission_violations([allowed], OPTIONS, tenancy) == []
    too_wide = run(PodSettings(labels={"teams": "x"}, annotations={"example.community/x": "1"}))
    assert [line.split(":", 1)[0] for line in admission_violations([too_wide], OPTIONS, tenancy)] == [
        "spec.pod.labels",
        "spec.pod.annotations",
    ]
    # labkube's own keys are refused even when tenancy would allow them (a selector, an owner, the queue label)
    everything = Tenancy(pod_labels=["app.kubernetes.io/", "labkube.dev/", "kueue.x-k8s.io/*"], pod_annotations=["*"])
    own = run(
        PodSettings(
            labels={"app.kubernetes.io/component": "x", "labkube.dev/run": "other", "kueue.x-k8s.io/queue-name": "q"},
            annotations={"labkube.dev/run-id": "forged"},
        )
    )
    refused = admission_violations([own], OPTIONS, everything)
    assert len(refused) == 4 and all("is set by labkube itself" in line for line in refused), refused
    # what the chart itself sets (runs.podLabels) is allowed with the chart's value
    chart = PodOptions(default_image="i", labels={"team": "vision"})
    assert admission_violations([run(PodSettings(labels={"team": "vision"}))], chart, Tenancy()) == []
    assert admission_violations([run(PodSettings(labels={"team": "nlp"}))], chart, Tenancy())
