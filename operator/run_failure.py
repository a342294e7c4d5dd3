"""A run that ends without a result of its agent's: the failed result the harness records for it.

Both supervisors write it, the local one (`supervisor`: a setup error, a full disk, an agent that exited without
a result) and the Kubernetes one (`k8s_backend`: a pod that cannot start, attempts used up, the API gone past the
run's deadline), to `result.json` and `status.json`, as the agent would have.
"""

from __future__ import annotations

from labkube.budgets import Spend, StopReason
from labkube.result import RunResult
from labkube.run_spec import RunPhase, RunStatus
from labkube.store import RunDir, read_model, utcnow, write_model

__all__ = ["harness_failure", "last_error_line"]


def last_error_line(rd: RunDir) -> str | None:
    try:
        lines = (rd.logs / "agent.stderr").read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[-1].removeprefix("error: ").strip() if lines else None


def harness_failure(rd: RunDir, message: str, reason: StopReason = StopReason.error, log_tail: str = "") -> RunResult:
    spec = rd.spec()
    status = read_model(rd.status_json, RunStatus)
    result = RunResult.of_run(
        spec,
        status=RunPhase.failed,
        stop_reason=reason,
        error=message,
        details={"setup_log_tail": log_tail} if log_tail else {},
        spend=status.spend if status else Spend(),
        finished_at=utcnow(),
    )
    try:  # on a full disk this fails too; the result still reaches the driver
        write_model(rd.result_json, result)
    except OSError:
        return result
    write_model(
        rd.status_json,
        RunStatus(
            run_id=spec.run_id,
            phase=RunPhase.failed,
            message=message,
            updated_at=utcnow(),
            spend=result.spend,
            stop_reason=reason,
        ),
    )
    return result
