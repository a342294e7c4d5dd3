"""The spend a pod's gateway counted, as the cluster keeps it: nothing the agent's container can write.

On a cluster the agent's container writes the run folder (`checkpoint.json`, `gateway.json`) and its own termination
message, so none of them is a record of what the run spent. The gateway sidecar, which alone holds the keys and
forwards every model call, keeps its totals where only it writes:

- its own volume (`gateway-tmp`, which the agent's container does not mount; `PRIVATE_STATE_VARIABLE` names the
  file): a sidecar the kubelet restarts within the pod goes on from there;
- its termination message (`report_message`): what the operator reads from the API when the pod ends, and records
  in the Run's status (`clusterSpend`), never lower than what it recorded before (`labkube.budgets.spend_floor`);
- the operator gives that record back to every later pod (`CLUSTER_SPEND_VARIABLE`): the next gateway counts on from
  it and enforces the budgets with it, and the grading pod takes the run's spend from it, never from the checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from labkube.agent.gateway.state import GatewayState
from labkube.budgets import Spend, StopReason, spend_floor
from labkube.store import write_json_atomic

CLUSTER_SPEND_VARIABLE = "LABKUBE_CLUSTER_SPEND"  # the Run status's record of the spend, as the operator gives it
REPORT_KEY = "labkube.gateway/v1"
MESSAGE_LIMIT = 4096  # a termination message's bytes that the kubelet keeps
# Where a pod's gateway keeps its totals, in its own volume (the pod manifest sets it); unset: nowhere of its own (a
# gateway outside a pod, whose HOME other runs share).
PRIVATE_STATE_VARIABLE = "LABKUBE_GATEWAY_STATE"


class GatewayReport(BaseModel):
    """What the gateway counted for the run, spend of earlier pods included, and the budget it refused calls for."""

    model_config = ConfigDict(extra="forbid")

    spend: Spend
    stop_reason: StopReason | None = None
    calls: int = 0


def report_of(state: GatewayState) -> GatewayReport:
    return GatewayReport(spend=state.spend, stop_reason=state.stop_reason, calls=state.calls)


def report_message(report: GatewayReport) -> str:
    """`report` as a termination message (at most `MESSAGE_LIMIT` bytes): a long list of models without a price is cut
    to the first ones, which keeps the cost unknown, as it is."""
    message = json.dumps({REPORT_KEY: report.model_dump(mode="json")}, separators=(",", ":"))
    unpriced = list(report.spend.unpriced)
    while len(message.encode()) > MESSAGE_LIMIT and len(unpriced) > 1:
        unpriced = unpriced[: len(unpriced) // 2]
        cut = report.model_copy(update={"spend": report.spend.model_copy(update={"unpriced": unpriced})})
        message = json.dumps({REPORT_KEY: cut.model_dump(mode="json")}, separators=(",", ":"))
    return message


def report_from_message(message: str | None) -> GatewayReport | None:
    """The report in a gateway container's termination message; None for anything else."""
    if not message:
        return None
    try:
        body = json.loads(message)
        return GatewayReport.model_validate(body[REPORT_KEY]) if isinstance(body, dict) else None
    except (ValueError, KeyError, TypeError, ValidationError):
        return None


def cluster_spend(environ: Mapping[str, str] | None = None) -> Spend | None:
    """The spend the operator recorded for the run before this pod (`CLUSTER_SPEND_VARIABLE`); None where it gave
    none (a local run, a run's first pod). A value that is not a spend is an error: the operator wrote it."""
    text = (os.environ if environ is None else environ).get(CLUSTER_SPEND_VARIABLE)
    if not text:
        return None
    try:
        return Spend.model_validate_json(text)
    except ValidationError as exc:
        raise ValueError(f"${CLUSTER_SPEND_VARIABLE} is not a spend: {exc}") from None


def private_state_path(environ: Mapping[str, str] | None = None) -> Path | None:
    path = (os.environ if environ is None else environ).get(PRIVATE_STATE_VARIABLE)
    return Path(path) if path else None


def starting_spend(environ: Mapping[str, str] | None = None) -> Spend:
    """Where a gateway sidecar starts counting: the larger of the operator's record and what an earlier instance of
    this sidecar in the same pod kept in its own volume (the kubelet restarted it). Never the run folder's checkpoint
    or `gateway.json`: the agent's container writes those."""
    kept, path = None, private_state_path(environ)
    if path is not None:
        with contextlib.suppress(OSError, ValueError, ValidationError):
            kept = GatewayReport.model_validate_json(path.read_bytes()).spend
    return spend_floor(cluster_spend(environ), kept)


def keep_report(state: GatewayState, termination_log: Path | None) -> None:
    """Write the gateway's totals where only it writes: its own volume, and its termination message."""
    report = report_of(state)
    if (path := private_state_path()) is not None:
        write_json_atomic(path, report.model_dump(mode="json"))
    if termination_log is not None:
        termination_log.write_text(report_message(report))
