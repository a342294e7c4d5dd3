"""A Gaia2 run's world in the harness: the world opened and its scenario loaded (the oracle run there), the models
the world itself calls (ARE's soft judge, the agent2agent app agents), and the grade ARE's judge gives."""

from __future__ import annotations

from typing import Any

from labkube.agent.checkpoint import Checkpoint
from labkube.agent.providers.provider import ProviderError
from labkube.agent.providers.registry import api_key_for
from labkube.agent.rg.world_errors import WorldFailure
from labkube.agent.rg.world_session import WorldSession, open_world
from labkube.agent.transcript import JsonlLog, now_iso
from labkube.budgets import StopReason
from labkube.model_ref import parse_model
from labkube.result import Grade, SubtaskScore
from labkube.run_spec import RunSpec
from labkube.store import RunDir
from labkube.task_card import TaskCard
from labkube.tasks.gaia2 import WorldError, WorldLLMError, world_llm


def gaia2_grade(ckpt: Checkpoint) -> Grade:
    """ARE's judge decides: 1 when it passed the run, 0 when it failed it, no number without a verdict or when
    the judge itself raised (an unreachable judge model is not an agent that failed)."""
    verdict = ckpt.world_verdict
    judge_error = judge_failure(verdict)
    passed = bool(verdict and verdict.get("success"))
    raw = None if verdict is None or judge_error else (1.0 if passed else 0.0)
    score = SubtaskScore(
        id="passed", raw=raw, fraction_of_sota=raw, gap_closed=raw, beat_baseline=None if raw is None else passed
    )
    return Grade(
        at_seconds=round(ckpt.spend.wall_seconds, 3),
        step=ckpt.step,
        tokens=ckpt.spend.usage.total,
        usd=ckpt.spend.usd,
        subtasks=[score],
        score=raw,
        error=judge_error,
    )


def judge_failure(verdict: dict[str, Any] | None) -> str | None:
    """ARE's judge raised instead of judging (its verdict carries the exception): what it said."""
    exception = (verdict or {}).get("exception")
    return f"ARE's judge failed: {exception}" if exception else None


async def start_gaia2(
    rd: RunDir, spec: RunSpec, card: TaskCard, ckpt: Checkpoint, transcript: JsonlLog, oracle: bool
) -> tuple[WorldSession | None, tuple[StopReason, str | None] | None]:
    """Open the world and load the scenario; for the oracle, run it and keep ARE's verdict."""
    assert card.gaia2 is not None
    if ckpt.step > 0:
        return None, (
            StopReason.world_error,
            "a Gaia2 run cannot resume: its world died with the previous agent; "
            "run it again into a new campaign directory",
        )
    world = None
    try:
        world = await open_world(rd.logs, spec.think_time_s)
        info = await world.client.load_scenario(
            card.gaia2.source,
            seed=spec.seed,
            oracle=oracle,
            noise={"env_events_seed": spec.seed} if spec.gaia2_noise else None,  # ARE's --noise, seeded per run
            judge=judge_model(spec),
            agent2agent=None if oracle else agent2agent_config(spec),
        )
        world.nb_turns = info.nb_turns
        transcript.append({"type": "world", "ts": now_iso(), "scenario": info.model_dump(mode="json")})
        if not oracle:
            return world, None
        verdict = await world.client.run_oracle()
        ckpt.world_verdict = verdict.model_dump(mode="json")
        transcript.append({"type": "oracle", "ts": now_iso(), "verdict": ckpt.world_verdict})
        await world.close()
        return None, (StopReason.done, None)
    except (WorldFailure, WorldError) as exc:
        failure = world.failed(exc) if world is not None and isinstance(exc, WorldError) else exc
        if world is not None:
            await world.close()
        transcript.append({"type": "world_error", "ts": now_iso(), "error": str(failure)})
        return None, (StopReason.world_error, f"the Gaia2 world failed: {failure}")
    except (ProviderError, WorldLLMError) as exc:  # a judge or app-agent model without a key, or scripted
        if world is not None:
            await world.close()
        transcript.append({"type": "model_error", "ts": now_iso(), "error": str(exc)})
        reason = exc.reason if isinstance(exc, ProviderError) else StopReason.error
        return None, (reason, str(exc))


def world_model(spec: RunSpec, model: str | None, what: str) -> dict[str, Any] | None:
    """A model the world itself calls (ARE's soft judge, app agents), with its key, as ARE's LLM spec."""
    if not model:
        return None
    ref = parse_model(model)
    return world_llm(ref, api_key_for(ref, spec), what).model_dump(exclude_none=True)


def judge_model(spec: RunSpec) -> dict[str, Any] | None:
    """ARE's soft judge, with its own time-out per check, dollar budget and the price the world counts it by."""
    from labkube.agent.pricing import price_for

    llm = world_model(spec, spec.judge_model, "the Gaia2 judge")
    if llm is None:
        return None
    llm["timeout_s"] = spec.gaia2_judge_timeout_s
    if spec.gaia2_judge_budget_usd is None:
        return llm
    assert spec.judge_model is not None
    price = price_for(spec.judge_model, dict(spec.prices))
    if price is None:  # refused when the campaign was planned; a hand-made run.json says so here
        raise WorldLLMError(f"the Gaia2 judge {spec.judge_model} has no price, so its dollar budget cannot be kept")
    return {**llm, "budget_usd": spec.gaia2_judge_budget_usd, "usd_per_million": list(price)}


def agent2agent_config(spec: RunSpec) -> dict[str, Any] | None:
    """ARE's agent2agent: a seeded share of the apps become app agents on the a2a model (default: the run's)."""
    if not spec.gaia2_a2a:
        return None
    llm = world_model(spec, spec.gaia2_a2a_model or spec.model, "agent2agent's app agents")
    return {"proportion": spec.gaia2_a2a, "llm": llm}
