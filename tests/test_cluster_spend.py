"""Issue 41, item 3: on a cluster a run's spend, stop reason and GPU time come from what the agent's container cannot
write. The gateway sidecar (which alone holds the keys, for rg-agent's own calls too) counts the spend in its own HOME
and its termination message; the operator keeps the largest it saw in the Run's status (`clusterSpend`) and gives it
to every later pod; the grading pod charges the run with the operator's account, never the checkpoint's.

The pod's layout is played by processes, as in tests/test_cli_agents.py: `labkube gateway` (the sidecar, with the
key, its own HOME and its own termination-message file) and `labkube agent` (the agent container: the sidecar's
address and token file, no key)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import labkube
from fakellm import FakeLLM, Reply
from fakellm import Usage as FakeUsage
from tinytask import make_run_dir, make_tiny_task

from labkube.agent.checkpoint import Checkpoint
from labkube.agent.gateway.ledger import (
    CLUSTER_SPEND_VARIABLE,
    PRIVATE_STATE_VARIABLE,
    GatewayReport,
    report_from_message,
    report_message,
    starting_spend,
)
from labkube.agent.harness.entrypoint import cluster_stop_reason
from labkube.budgets import Budgets, Spend, StopReason, Usage, spend_floor
from labkube.operator.k8s_grading import gateway_report_of, grading_manifest
from labkube.result import RunResult
from labkube.run_spec import CLUSTER_ACCOUNT_VARIABLE, ClusterAccount
from labkube.store import read_model, write_model

REAL_KEY = "sk-real-provider-key-cluster-spend-0123"
USAGE = FakeUsage(input=1000, output=100)
# What earlier pods' gateways reported, as the operator gives it to this pod.
EARLIER = Spend(steps=5, usage=Usage(input=50_000, output=5_000), usd=1.25, wall_seconds=0.0)
# The agent zeroes every account it can write: the run folder's gateway.json and checkpoint.json.
ZERO_THE_BOOKS = (
    "echo '{\"spend\": {}}' > ../gateway.json; "
    "python3 -c \"import json; p='../checkpoint.json'; c=json.load(open(p)); c['spend']={}; "
    "json.dump(c, open(p, 'w'))\" 2>/dev/null; echo 5 > result.txt"
)


def _sidecar(tmp_path: Path, rd: Path, server: FakeLLM, token_file: Path, seed: Spend | None) -> subprocess.Popen:
    env = {
        **os.environ,
        "OPENAI_API_KEY": REAL_KEY,
        "OPENAI_BASE_URL": server.base_url + "/v1",
        "LABKUBE_RUN_SPEC": (rd / "run.json").read_text(),  # the Run's spec, as the pod manifest gives it
        "HOME": str(tmp_path / "gateway-home"),  # `gateway-tmp`: no other container mounts it
        PRIVATE_STATE_VARIABLE: str(tmp_path / "gateway-home" / "spend.json"),
        "LABKUBE_TERMINATION_LOG": str(tmp_path / "gateway-termination-log"),
        **({CLUSTER_SPEND_VARIABLE: seed.model_dump_json()} if seed is not None else {}),
    }
    (tmp_path / "gateway-home").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "gateway", "--run-dir", str(rd), "--token-file", str(token_file)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_rg_agents_calls_go_through_the_sidecar_which_counts_on_from_the_clusters_record(tmp_path: Path) -> None:
    """rg-agent in a pod: its model calls go through the gateway sidecar with the run token (the agent container has
    no key), the harness writes the transcript of them once, and the sidecar's termination message holds the
    operator's record plus this pod's calls, whatever the agent wrote into gateway.json and the checkpoint. The
    harness starts from the cluster's record too: a pod whose checkpoint was zeroed does not get a new budget."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model="openai:gpt-5", sandbox="pod")
    token_file = tmp_path / "gateway-volume" / "token"
    with FakeLLM() as server:
        server.script(
            Reply.tool_call("bash", {"command": ZERO_THE_BOOKS}, usage=USAGE),
            Reply.tool_call("end_task", {"summary": "done"}, usage=USAGE),
        )
        sidecar = _sidecar(tmp_path, rd, server, token_file, EARLIER)
        try:
            assert sidecar.stdout is not None
            listening = sidecar.stdout.readline()
            assert listening.startswith("LISTENING http://127.0.0.1:"), sidecar.communicate(timeout=10)
            agent_env = {
                "LABKUBE_GATEWAY_URL": listening.split()[1],
                "LABKUBE_GATEWAY_TOKEN_FILE": str(token_file),
                CLUSTER_SPEND_VARIABLE: EARLIER.model_dump_json(),
            }
            assert not any(k.endswith("_API_KEY") for k in os.environ)
            ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path, env=agent_env)
        finally:
            sidecar.send_signal(signal.SIGTERM)
            sidecar.communicate(timeout=30)
        requests = server.requests
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert len(requests) == 2 and all(r.headers.get("authorization") == f"Bearer {REAL_KEY}" for r in requests)
    calls = [json.loads(line) for line in (rd / "transcript.jsonl").read_text().splitlines()]
    assert sum(c["type"] == "model_call" for c in calls) == 2  # the harness's lines; the sidecar writes none
    report = report_from_message((tmp_path / "gateway-termination-log").read_text())
    assert report is not None
    assert report.spend.steps == EARLIER.steps + 2
    assert report.spend.usage.input == EARLIER.usage.input + 2 * 1000
    assert report.spend.usd > EARLIER.usd
    # the sidecar's own HOME keeps the same totals, for an instance the kubelet restarts in this pod
    kept = GatewayReport.model_validate_json((tmp_path / "gateway-home" / "spend.json").read_text())
    assert kept.spend == report.spend
    # the agent's zeroing reached only its own files
    assert json.loads((rd / "gateway.json").read_text())["spend"]["steps"] >= 0
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.spend.steps == EARLIER.steps + 2 and result.spend.usage.input >= EARLIER.usage.input


def test_a_sidecar_starts_from_the_operators_record_and_its_own_home_never_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted sidecar goes on from the larger of the operator's record and its own HOME; the run folder's
    checkpoint.json and gateway.json (the agent writes both) are not read."""
    kept = tmp_path / "spend.json"
    monkeypatch.setenv(PRIVATE_STATE_VARIABLE, str(kept))
    monkeypatch.delenv(CLUSTER_SPEND_VARIABLE, raising=False)
    assert starting_spend() == Spend()
    monkeypatch.setenv(CLUSTER_SPEND_VARIABLE, EARLIER.model_dump_json())
    assert starting_spend() == EARLIER
    later = EARLIER.model_copy(update={"steps": 9, "usd": 2.5})
    kept.write_text(GatewayReport(spend=later).model_dump_json())
    assert starting_spend() == later
    # a forged private file lower than the operator's record changes nothing (and the agent cannot write it anyway)
    kept.write_text(GatewayReport(spend=Spend()).model_dump_json())
    assert starting_spend() == EARLIER
    # outside a pod a gateway keeps nothing of its own: its HOME is shared with other runs
    monkeypatch.delenv(PRIVATE_STATE_VARIABLE)
    kept.write_text(GatewayReport(spend=later).model_dump_json())
    assert starting_spend() == EARLIER
    monkeypatch.setenv(CLUSTER_SPEND_VARIABLE, "{not json")
    with pytest.raises(ValueError, match=CLUSTER_SPEND_VARIABLE):
        starting_spend()


def test_the_operator_reads_both_termination_messages_of_a_restarted_gateway_and_never_goes_down() -> None:
    """A native sidecar the kubelet restarted has its earlier instance's message in `lastState`: the larger counts.
    The agent container's own termination message, and any other container's, are not read for spend."""
    first = GatewayReport(spend=EARLIER.model_copy(update={"steps": 7}), calls=2)
    second = GatewayReport(spend=EARLIER.model_copy(update={"steps": 6}), stop_reason=StopReason.usd, calls=1)
    forged = GatewayReport(spend=Spend(steps=10**6, usd=10**6))
    pod = {
        "metadata": {"name": "r-0", "labels": {"labkube.dev/run": "r"}},
        "status": {
            "phase": "Succeeded",
            "initContainerStatuses": [
                {
                    "name": "gateway",
                    "restartCount": 1,
                    "state": {"terminated": {"exitCode": 0, "message": report_message(second)}},
                    "lastState": {"terminated": {"exitCode": 1, "message": report_message(first)}},
                }
            ],
            "containerStatuses": [
                {"name": "agent", "state": {"terminated": {"exitCode": 0, "message": report_message(forged)}}}
            ],
        },
    }
    report = gateway_report_of(pod)
    assert report is not None
    assert report.spend.steps == 7 and report.stop_reason is StopReason.usd
    assert spend_floor(report.spend, Spend(steps=3)).steps == 7
    assert gateway_report_of({"status": {"containerStatuses": pod["status"]["containerStatuses"]}}) is None
    grading = {**pod, "metadata": {"name": "r-0-grade", "labels": {"labkube.dev/finalize": "done"}}}
    assert gateway_report_of(grading) is None


def test_a_long_list_of_unpriced_models_still_fits_a_termination_message() -> None:
    spend = Spend(unpriced=[f"openai:model-{i:04d}-{'x' * 40}" for i in range(400)])
    message = report_message(GatewayReport(spend=spend))
    assert len(message.encode()) <= 4096
    report = report_from_message(message)
    assert report is not None and report.spend.unpriced and report.spend.cost_usd is None


def test_the_grading_pod_is_given_the_operators_account_and_no_spend_seed() -> None:
    from test_pod_manifest import OWNER, make_options, make_run

    from labkube.operator.pod_manifest import build_pod_manifest

    pod = build_pod_manifest(make_run(), make_options(), owner=OWNER, cluster_spend=EARLIER)
    by_name = {c["name"]: c for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    for name in ("agent", "gateway"):
        env = {e["name"]: e.get("value") for e in by_name[name]["env"]}
        assert Spend.model_validate_json(env[CLUSTER_SPEND_VARIABLE]) == EARLIER
    assert by_name["gateway"]["terminationMessagePath"] == "/dev/termination-log"
    account = ClusterAccount(spend=EARLIER, wall_seconds=5400.0, attempts=3)
    grade = grading_manifest(pod, StopReason.done, 900, account=account)
    (container,) = grade["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert ClusterAccount.model_validate_json(env[CLUSTER_ACCOUNT_VARIABLE]) == account
    assert CLUSTER_SPEND_VARIABLE not in env


@pytest.mark.parametrize(
    ("operator", "claimed", "account", "expected"),
    [
        # the agent's loop ended (exit 0): done, unless what the cluster saw reached a budget
        (StopReason.done, None, ClusterAccount(spend=None, wall_seconds=10, attempts=1), StopReason.done),
        (StopReason.done, StopReason.done, ClusterAccount(spend=Spend(steps=9), wall_seconds=10, attempts=1), "steps"),
        (StopReason.done, None, ClusterAccount(spend=Spend(usd=3.0), wall_seconds=10, attempts=1), "usd"),
        (StopReason.done, None, ClusterAccount(spend=None, wall_seconds=7200, attempts=1), "time"),
        (
            StopReason.done,
            StopReason.done,
            ClusterAccount(spend=Spend(), wall_seconds=10, attempts=1, budget_stop=StopReason.tokens),
            "tokens",
        ),
        # a checkpoint claiming a budget the cluster never saw is not believed
        (StopReason.done, StopReason.usd, ClusterAccount(spend=Spend(usd=0.1), wall_seconds=10, attempts=1), "done"),
        # it failed (exit 1): the checkpoint may name which failure, never that it did not fail
        (
            StopReason.error,
            StopReason.model_error,
            ClusterAccount(spend=None, wall_seconds=1, attempts=1),
            "model_error",
        ),
        (StopReason.error, StopReason.done, ClusterAccount(spend=None, wall_seconds=1, attempts=1), "error"),
        # the operator's own reasons stand
        (StopReason.killed, StopReason.done, ClusterAccount(spend=None, wall_seconds=1, attempts=3), "killed"),
        (StopReason.time, StopReason.done, ClusterAccount(spend=None, wall_seconds=1, attempts=1), "time"),
    ],
)
def test_the_stop_reason_is_the_clusters(
    operator: StopReason, claimed: StopReason | None, account: ClusterAccount, expected: str
) -> None:
    budgets = Budgets(wall_hours=1, usd=2.0, steps=8, tokens=10**6)
    assert cluster_stop_reason(operator, claimed, account, budgets).value == expected


@pytest.mark.slow
def test_a_grading_pod_charges_the_operators_account_not_the_zeroed_checkpoint(tmp_path: Path) -> None:
    """The agent zeroed its checkpoint's spend and wrote `done` there; the operator saw the gateways count $4.20
    and 3 pods over 2 hours and stopped the run as `killed`: the result says so, and so do its resumes."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model="noop", sandbox="pod")
    started = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
    assert started.returncode in (0, 1), started.stderr[-2000:]
    ckpt = read_model(rd / "checkpoint.json", Checkpoint) or Checkpoint()
    write_model(rd / "checkpoint.json", ckpt.model_copy(update={"spend": Spend(), "stop_reason": StopReason.done}))
    seen = Spend(steps=40, usage=Usage(input=400_000, output=20_000), usd=4.2)
    account = ClusterAccount(spend=seen, wall_seconds=7200.0, attempts=3)
    graded = labkube(
        "agent", "--run-dir", str(rd), "--finalize", "killed", cwd=tmp_path,
        env={CLUSTER_ACCOUNT_VARIABLE: account.model_dump_json()},
    )  # fmt: skip
    assert graded.returncode in (0, 1), graded.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.stop_reason is StopReason.killed
    assert result.spend.usd == pytest.approx(4.2) and result.spend.steps == 40
    assert result.spend.wall_seconds == 7200.0 and result.resumes == 2


@pytest.mark.slow
@pytest.mark.parametrize("harness_told", [True, False], ids=["harness-stops", "gateway-refuses"])
def test_a_budget_the_cluster_saw_spent_is_spent_for_a_new_pod(tmp_path: Path, harness_told: bool) -> None:
    """Earlier pods spent $1.25 of a $1 budget; the agent zeroed its checkpoint and made its pod restart. The new
    pod's harness starts from the cluster's record and stops at once (`usd`); a harness that was not told (an agent
    that got rid of the variable would be one) is refused by the gateway, which counts on from the record, and reads
    the refusal as the budget's stop, not a rate limit to retry. No call reaches the provider either way."""
    task = make_tiny_task(tmp_path, [])
    rd = make_run_dir(tmp_path, task, model="openai:gpt-5", sandbox="pod", budgets=Budgets(usd=1.0))
    token_file = tmp_path / "gateway-volume" / "token"
    with FakeLLM() as server:
        server.script(Reply.tool_call("end_task", {"summary": "done"}, usage=USAGE))
        sidecar = _sidecar(tmp_path, rd, server, token_file, EARLIER)
        try:
            assert sidecar.stdout is not None
            listening = sidecar.stdout.readline()
            assert listening.startswith("LISTENING http://127.0.0.1:"), sidecar.communicate(timeout=10)
            agent_env = {"LABKUBE_GATEWAY_URL": listening.split()[1], "LABKUBE_GATEWAY_TOKEN_FILE": str(token_file)}
            if harness_told:
                agent_env[CLUSTER_SPEND_VARIABLE] = EARLIER.model_dump_json()
            ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path, env=agent_env, timeout=120)
        finally:
            sidecar.send_signal(signal.SIGTERM)
            sidecar.communicate(timeout=30)
        requests = server.requests
    assert requests == []
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.stop_reason is StopReason.usd, (result.stop_reason, result.error, ran.stderr[-1500:])
    report = report_from_message((tmp_path / "gateway-termination-log").read_text())
    assert report is not None and report.spend.usd == EARLIER.usd
