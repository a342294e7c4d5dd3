"""ARE's own default agent as a reference scaffold (`--agent are-default`).

The agent runs inside the world process (ARE's environment, ARE's ReAct loop, ARE's LiteLLM engine) on
the run's model string, so a campaign can put rg-agent and ARE's agent side by side on the same
scenarios and model. labkube hands it the model (with its key, in the request), the think-time policy,
the wall budget and the step budget; ARE's judge decides, exactly as for rg-agent. What the agent did
comes back as ARE's agent log and is written to the run's transcript.
"""

from __future__ import annotations

import time

from labkube.agent.checkpoint import Checkpoint
from labkube.agent.pricing import cost_usd
from labkube.agent.providers.provider import ProviderError
from labkube.agent.providers.registry import api_key_for
from labkube.agent.rg.world_session import WorldSession
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.budgets import StopReason, Usage
from labkube.model_ref import parse_model
from labkube.run_spec import RunSpec
from labkube.tasks.gaia2 import AreAgentRun, WorldError, WorldLLMError, world_llm

DEFAULT_WALL_SECONDS = 3600.0  # a run without a wall budget still ends
# How ARE's agent stopped (the world's `agent.stopped`) as a run's stop reason: out of time or steps is a
# budget stop, judged as it stands; a model that never answered is the model's failure.
STOP_REASONS = {
    "finished": StopReason.done,
    "timeout": StopReason.time,
    "max_iterations": StopReason.steps,
    "model_failed": StopReason.model_error,
    "error": StopReason.error,
}


async def run_are_default(
    spec: RunSpec, ckpt: Checkpoint, world: WorldSession, transcript: JsonlLog
) -> tuple[StopReason, str | None]:
    """Run ARE's agent in the loaded world; keeps the verdict and the spend in `ckpt`."""
    ref = parse_model(spec.model)
    try:
        llm = world_llm(ref, api_key_for(ref, spec), "agent are-default")
    except ProviderError as exc:
        return exc.reason, str(exc)
    except WorldLLMError as exc:
        return StopReason.error, str(exc)
    start = {"type": "start", "ts": now_iso(), "run_id": spec.run_id, "model": spec.model, "agent": "are-default"}
    transcript.append(start)
    started = time.monotonic()
    try:
        run = await world.client.run_are_agent(
            llm.model_dump(exclude_none=True),
            think_time=spec.think_time_s,
            timeout=spec.budgets.wall_seconds or DEFAULT_WALL_SECONDS,
            max_iterations=spec.budgets.steps,
        )
    except WorldError as exc:
        failure = world.failed(exc)
        transcript.append({"type": "world_error", "ts": now_iso(), "error": str(failure)})
        return StopReason.world_error, f"the Gaia2 world failed: {failure}"
    finally:
        ckpt.spend.wall_seconds = time.monotonic() - started
    for entry in run.agent.logs:
        logged = entry.model_dump(exclude_none=True)
        transcript.append({"type": "are_agent", "ts": now_iso(), "log": logged.pop("type"), **logged})
    record_spend(ckpt, run, spec)
    ckpt.world_verdict = run.model_dump(mode="json", exclude={"agent": {"logs"}})  # the logs are in the transcript
    transcript.append({"type": "verdict", "ts": now_iso(), "verdict": ckpt.world_verdict})
    reason = STOP_REASONS[run.agent.stopped]
    failed = reason in (StopReason.model_error, StopReason.error)
    return reason, run.agent.error if failed else None


def record_spend(ckpt: Checkpoint, run: AreAgentRun, spec: RunSpec) -> None:
    """Tokens and dollars from ARE's log of each model call (its token counts, our prices)."""
    outputs = [e for e in run.agent.logs if e.type == "llm_output"]
    usage = Usage(
        input=sum(e.prompt_tokens or 0 for e in outputs),
        output=sum(e.completion_tokens or 0 for e in outputs),
        reasoning=sum(e.reasoning_tokens or 0 for e in outputs),
    )
    ckpt.spend.steps = len(outputs)
    ckpt.spend.usage = usage
    ckpt.spend.usd, ckpt.spend.unpriced = 0.0, []
    ckpt.spend.add_cost(spec.model, cost_usd(spec.model, usage, dict(spec.prices)))
