"""Finished runs as training data: ATIF trajectories (Harbor's Agent Trajectory Interchange Format, the `atif`
package's models) and OpenAI chat fine-tuning JSONL. One file per run, one run in memory at a time.

Where the steps come from: `conversation.jsonl` (every message the model saw, tagged with its context epoch;
a hand-off starts a new epoch) read line by line, joined with `transcript.jsonl` (model calls with usage, cost
and latency; tool calls with duration; hand-offs) read by a cursor that moves forward only.

Rewards, each with its source (unknown is null, never 0):
- ResearchGym: `result.json` score_curve. Each grading after the first gives the change in normalised score
  (fraction of SOTA of the primary subtask) since the previous one to the agent step at which it was taken. A
  grading that failed is skipped; a clean grading that gave no value counts as 0 (ResearchGym's convention), and
  the reward says so (`no_value_as_zero`). The final normalised score and beat-baseline are terminal rewards on the
  last step (null when the run has no value). A Kubernetes run's periodic gradings ran in the agent's pod
  (`score_curve_source: agent_pod`): the rewards taken from them carry `agent_pod_claim`.
- Gaia2: ARE's judge verdict stored in `result.json` details["gaia2"] (success, rationale of the first failed
  hard check, soft-check verdict) as the terminal reward; each agent write action gets 1 when ARE's
  GraphPerEventJudge matched it to an oracle event (and which), 0 when not, from details["gaia2"]["matches"]
  (results written before the world reported matches have `oracle_match: null`).
- GAIA: the scorer's 0/1 (result score) at the end.

A run that ended in an error outcome (grader, judge, world, setup, model or harness error) is not a measurement of
the agent: it is not exported unless asked for (`include_errors`), and then its terminal rewards and Gaia2 action
matches are null, with the outcome beside them.

A run a person touched while it ran (cancelled, paused, resumed, extended, sent a message; a usage checkpoint) is
exported and marked, so that RL data from touched runs can be dropped: `extra.labkube.intervened` is true and
`extra.labkube.interventions` lists every intervention as result.json holds it; an operator's message the agent read
is its user step, marked `extra.operator_message` (with the intervention's id and who sent it). A cancelled run is
not an error, but not a measurement either: it is exported, with null terminal rewards and the outcome beside them.
`exclude_intervened` leaves touched runs out.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from labkube.agent.transcript import iter_jsonl
from labkube.interventions import Intervention, InterventionKind
from labkube.result import RunResult
from labkube.results.export_rewards import STEP_REWARD_SOURCE, Gaia2Matcher, step_rewards, terminal_rewards
from labkube.run_spec import CLI_AGENTS
from labkube.store import CampaignDir

ATIF_SCHEMA_VERSION = "ATIF-v1.8"
SCAFFOLD_VERSION = "labkube"
CLEAN_VERDICT = "PASS"


class ExportError(ValueError):
    """A campaign that cannot be exported (not a campaign directory)."""


@dataclass(frozen=True)
class ExportFilter:
    exclude_suspicious: bool = False
    min_score: float | None = None
    include_errors: bool = False
    exclude_intervened: bool = False

    def reason_to_skip(self, result: RunResult | None) -> str | None:
        if result is None or not result.final:
            return "not finished"
        if result.is_error and not self.include_errors:
            return f"{ERROR_SKIP} {result.outcome}" + (f": {last_line(result.error)}" if result.error else "")
        if self.exclude_intervened and result.intervened:
            kinds = ", ".join(dict.fromkeys(i.kind.value for i in result.interventions))
            return f"{INTERVENED_SKIP} ({kinds}), --exclude-intervened"
        if self.exclude_suspicious and result.integrity_verdict != CLEAN_VERDICT:
            return f"integrity verdict {result.integrity_verdict or 'missing'}"
        if self.min_score is not None and result.score is None:
            return f"no score (outcome {result.outcome}), --min-score {self.min_score}"
        if self.min_score is not None and result.score is not None and result.score < self.min_score:
            return f"score {result.score} below {self.min_score}"
        return None


ERROR_SKIP = "outcome"  # the start of the reason a run with an error outcome was left out
INTERVENED_SKIP = "intervened"  # the start of the reason a run a person touched was left out


def last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1].strip() if lines else ""


@dataclass
class ExportedRun:
    run_id: str
    path: Path | None
    skipped: str | None = None
    error_outcome: str | None = None  # the outcome of a run left out for ending in an error


def campaign_runs(campaigns: list[Path]) -> list[tuple[CampaignDir, str]]:
    found = []
    for root in campaigns:
        cdir = CampaignDir(root)
        if not cdir.exists():
            raise ExportError(f"{root}: not a campaign directory (no campaign.json)")
        found += [(cdir, run_id) for run_id in cdir.run_ids()]
    return found


# -- the transcript, forward only -----------------------------------------------------------------


class TranscriptCursor:
    """Walks transcript.jsonl forward; what it passes on the way (tool calls, hand-offs) is kept until asked for."""

    def __init__(self, path: Path) -> None:
        self._records = iter_jsonl(path)
        self.tool_calls: dict[str, dict[str, Any]] = {}
        self.handoffs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []  # (handoff event, its model call)
        self._handoff_call: dict[str, Any] | None = None
        self.start: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None  # a step's model call read ahead while looking for a hand-off

    def _take(self, record: dict[str, Any]) -> dict[str, Any] | None:
        kind = record.get("type")
        if kind == "tool_call" and record.get("call_id"):
            self.tool_calls[str(record["call_id"])] = record
        elif kind == "model_call" and record.get("purpose", "step") != "step":
            self._handoff_call = record
        elif kind == "model_call":
            return record
        elif kind == "handoff":
            self.handoffs.append((record, self._handoff_call))
            self._handoff_call = None
        elif kind in ("start", "resume") and self.start is None:
            self.start = record
        return None

    def next_model_call(self) -> dict[str, Any] | None:
        if self._pending is not None:
            call, self._pending = self._pending, None
            return call
        for record in self._records:
            call = self._take(record)
            if call is not None:
                return call
        return None

    def read_handoffs(self, n: int) -> None:
        """Read on until `n` hand-offs were seen, or up to the next step's model call."""
        while len(self.handoffs) < n and self._pending is None:
            record = next(self._records, None)
            if record is None:
                return
            self._pending = self._take(record)

    def tool_call(self, call_id: str) -> dict[str, Any] | None:
        while call_id not in self.tool_calls:
            if self._pending is not None:
                return None
            record = next(self._records, None)
            if record is None:
                return None
            call = self._take(record)
            if call is not None:  # a model call past this tool call: the tool call was not logged
                self._pending = call
                return None
        return self.tool_calls.pop(call_id)

    def drain(self) -> None:
        for record in self._records:
            self._take(record)


# -- ATIF -----------------------------------------------------------------------------------------


@dataclass
class _Steps:
    """Steps as they are made, in bounded memory. Counting (the first pass over a run) keeps none; writing (the
    second) holds only the newest step, which may still get its observations and tool calls, and writes each
    earlier one out, with its rewards (planned from the first pass), as soon as it is complete."""

    sink: IO[str] | None = None
    rewards_at: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # step index -> rewards to add
    count: int = 0
    agent_steps: dict[int, int] = field(default_factory=dict)  # run step number -> index of its agent step
    with_metrics: int = 0
    oracle_matches: int = 0
    last: Any = None

    def add(self, **kwargs: Any) -> Any:
        import atif

        step = atif.Step(step_id=self.count + 1, **kwargs)
        self._flush()
        self.last = step
        self.count += 1
        self.with_metrics += step.metrics is not None
        return step

    def mark_agent(self, run_step: int) -> None:
        self.agent_steps[run_step] = self.count - 1

    def _flush(self) -> None:
        step, self.last = self.last, None
        if step is None:
            return
        placed = self.rewards_at.get(step.step_id - 1)
        if placed:
            step.extra = step.extra or {}
            step.extra.setdefault("rewards", []).extend(placed)
        rewards = (step.extra or {}).get("rewards", [])
        self.oracle_matches += sum(1 for r in rewards if r.get("kind") == "oracle_match")
        if self.sink is not None:
            self.sink.write(
                ("," if step.step_id > 1 else "")
                + json.dumps(step.model_dump(mode="json", exclude_none=True), ensure_ascii=False, default=str)
            )

    def close(self) -> None:
        self._flush()


def _metrics(call: dict[str, Any] | None) -> Any:
    import atif

    if call is None:
        return None
    usage = call.get("usage") or {}
    return atif.Metrics(
        prompt_tokens=usage.get("input"),
        completion_tokens=usage.get("output"),
        cached_tokens=usage.get("cached"),
        cost_usd=call.get("cost_usd"),
        extra={
            "reasoning_tokens": usage.get("reasoning"),
            "latency_s": call.get("duration_s"),
            "backoff_s": call.get("backoff_s"),
            "attempts": call.get("attempts"),
        },
    )


def _walk(run_dir: Path, result: RunResult, acc: _Steps) -> TranscriptCursor:
    """Every step of the run, in order, into `acc` (a pass over its conversation and transcript, line by line)."""
    import atif

    cursor = TranscriptCursor(run_dir / "transcript.jsonl")
    gaia2 = "gaia2" in result.details
    matcher = Gaia2Matcher(result.details.get("gaia2") or {}, None if result.measured else str(result.outcome))
    operator_messages = [i for i in result.interventions if i.kind is InterventionKind.message and i.message]
    epoch = 0
    last_agent: Any = None
    handoffs_done = 0

    def emit_handoffs() -> None:
        nonlocal handoffs_done
        for event, call in cursor.handoffs[handoffs_done:]:
            acc.add(
                source="agent",
                message=str(event.get("summary") or ""),
                model_name=(call or {}).get("model"),
                metrics=_metrics(call),
                timestamp=event.get("ts"),
                extra={"handoff": event.get("n"), "purpose": "handoff summary"},
            )
        handoffs_done = len(cursor.handoffs)

    for message in iter_jsonl(run_dir / "conversation.jsonl"):
        if int(message.get("epoch", 0)) != epoch:
            epoch = int(message.get("epoch", 0))
            cursor.read_handoffs(epoch)
            emit_handoffs()
        role = message.get("role")
        extra: dict[str, Any] = {"epoch": epoch}
        if role in ("system", "user"):
            content = str(message.get("content") or "")
            if role == "user" and (sent := _operator_message(content, operator_messages)) is not None:
                operator_messages.remove(sent)
                extra |= {"operator_message": True, "intervention_id": sent.id, "by": sent.by}
            acc.add(source=role, message=content, extra=extra)
            last_agent = None
        elif role == "assistant":
            call = cursor.next_model_call()
            emit_handoffs()
            last_agent = _agent_step(acc, message, call, extra)
        elif role == "tool" and last_agent is not None:
            call_id = message.get("tool_call_id")
            logged = cursor.tool_call(str(call_id)) if call_id else None
            result_extra: dict[str, Any] = {"tool": message.get("name")}
            if logged is not None:
                result_extra |= {"ok": logged.get("ok"), "duration_s": logged.get("duration_s")}
                result_extra["access"] = logged.get("access")
                reward = (
                    matcher.reward(str(logged.get("tool")), logged.get("access"), logged.get("ok")) if gaia2 else None
                )
                if reward:
                    last_agent.extra.setdefault("rewards", []).append({**reward, "tool_call_id": call_id})
            observed = atif.ObservationResult(
                source_call_id=call_id, content=str(message.get("content") or ""), extra=result_extra
            )
            _observe(last_agent, observed)
    cursor.drain()
    emit_handoffs()
    if not acc.count and result.agent == "are-default":
        _are_agent_steps(run_dir / "transcript.jsonl", acc, matcher)
    if not acc.count and result.agent in CLI_AGENTS:
        _gateway_steps(run_dir / "transcript.jsonl", acc, matcher if gaia2 else None)
    if not acc.count:  # e.g. a Gaia2 oracle run: ARE replayed the scenario's oracle events, no model was called
        what = "ARE ran the scenario's oracle events" if gaia2 and result.model == "oracle" else "no model call"
        acc.add(source="system", message=f"{result.task}: no conversation was recorded ({what}).", extra={})
    return cursor


def _operator_message(content: str, sent: list[Intervention]) -> Intervention | None:
    """The operator's message (`labkube runs message`) a user turn carries: the harness puts its text into the
    conversation, perhaps framed by a line of its own, so a turn that holds the text is the one."""
    return next((i for i in sent if i.message and i.message.strip() in content), None)


def write_trajectory(run_dir: Path, result: RunResult, path: Path) -> None:
    """One run as an ATIF trajectory file, in memory bounded by one step: a first pass counts the steps and plans
    where the rewards go, the second writes the steps as they are made, then the envelope (agent, final metrics,
    labkube's fields) is validated with `atif.Trajectory` around a placeholder step and written around them."""
    import atif

    counted = _Steps()
    _walk(run_dir, result, counted)
    rewards_at, placed = plan_rewards(counted, result)
    steps_file = path.with_suffix(".steps.tmp")
    try:
        with steps_file.open("w", encoding="utf-8") as sink:
            acc = _Steps(sink=sink, rewards_at=rewards_at)
            cursor = _walk(run_dir, result, acc)
            acc.close()
        terminal = terminal_rewards(result)
        placed_any = bool(step_rewards(result))
        rewards = {
            "outcome": str(result.outcome),
            "step_reward_sum": placed if placed_any else None,
            "step_reward_source": STEP_REWARD_SOURCE if placed_any else None,
            "gradings_without_value": sum(g.score is None and g.error is None for g in result.score_curve),
            "gradings_failed": sum(g.error is not None for g in result.score_curve),
            "score_curve_source": result.score_curve_source,  # agent_pod: the step rewards are the agent's claim
            "terminal": terminal,
            "write_actions": acc.oracle_matches or None,
        }
        envelope = atif.Trajectory(
            schema_version=ATIF_SCHEMA_VERSION,
            session_id=result.run_id,
            trajectory_id=result.run_id,
            agent=atif.Agent(
                name=result.agent,
                version=str((result.details.get("cli") or {}).get("reported_version") or "")
                or SCAFFOLD_VERSION + "-" + _labkube_version(),
                model_name=result.model,
                extra={"scaffold": result.agent},
            ),
            steps=[atif.Step(step_id=1, source="system", message="")],
            final_metrics=atif.FinalMetrics(
                total_prompt_tokens=result.spend.usage.input,
                total_completion_tokens=result.spend.usage.output,
                total_cached_tokens=result.spend.usage.cached,
                total_cost_usd=result.spend.cost_usd,  # None: a model the run called has no price
                total_steps=acc.count,
                extra={
                    "reasoning_tokens": result.spend.usage.reasoning,
                    "wall_seconds": result.spend.wall_seconds,
                    "agent_steps": result.spend.steps,
                    "model_calls_exported": acc.with_metrics,
                    # calls whose answer did not say its usage: the totals above are lower bounds
                    **({"partial_model_calls": result.spend.partial_calls} if result.spend.partial_calls else {}),
                },
            ),
            extra={
                "labkube": {
                    "run_id": result.run_id,
                    "task": result.task,
                    "seed": result.seed,
                    "status": result.status.value if hasattr(result.status, "value") else str(result.status),
                    "stop_reason": str(result.stop_reason.value) if result.stop_reason else None,
                    "outcome": str(result.outcome),
                    "error": result.error,
                    "message": result.message,
                    "integrity_verdict": result.integrity_verdict,
                    "sandbox": result.sandbox.value if result.sandbox else None,
                    "score_curve_source": result.score_curve_source,
                    "score": result.score,
                    "beat_baseline": result.beat_baseline,
                    "completion": result.completion,
                    "capabilities": result.capabilities,
                    "resumes": result.resumes,
                    "intervened": result.intervened,
                    "interventions": [i.model_dump(mode="json") for i in result.interventions],
                    "handoffs": [
                        {"n": e.get("n"), "ts": e.get("ts"), "summary": e.get("summary")} for e, _ in cursor.handoffs
                    ],
                    "started": (cursor.start or {}).get("ts"),
                    "details": result.details,
                },
                "rewards": rewards,
            },
        ).to_json_dict()
        envelope["steps"] = [STEPS_MARK]
        head, tail = json.dumps(envelope, ensure_ascii=False, default=str).split(json.dumps(STEPS_MARK))
        staged = path.with_suffix(".tmp")
        with staged.open("w", encoding="utf-8") as out, steps_file.open(encoding="utf-8") as steps:
            out.write(head)
            shutil.copyfileobj(steps, out)
            out.write(tail)
        staged.replace(path)
    finally:
        steps_file.unlink(missing_ok=True)


STEPS_MARK = "\u0000labkube-steps\u0000"


def build_trajectory(run_dir: Path, result: RunResult) -> Any:
    """One run as an `atif.Trajectory` object (the file `write_trajectory` writes, read back and validated)."""
    import atif

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trajectory.json"
        write_trajectory(run_dir, result, path)
        return atif.Trajectory.model_validate_json(path.read_text(encoding="utf-8"))


def _are_agent_steps(transcript: Path, acc: _Steps, matcher: Gaia2Matcher) -> None:
    """ARE's own agent (`--agent are-default`): its log, as the world reported it (`are_agent` events), as steps.
    ARE's agent writes its actions as text (Thought/Action JSON); the parsed tool call is attached to the step.
    Which tools write is not in the log: a tool counts as a write when ARE's judge weighed a call of it."""
    import atif

    last: Any = None
    calls = 0
    for record in iter_jsonl(transcript):
        if record.get("type") != "are_agent":
            continue
        kind, content = record.get("log"), record.get("content")
        text = content if isinstance(content, str) else json.dumps(content, default=str) if content else ""
        if kind == "system_prompt":
            acc.add(source="system", message=text, extra={"are_log": kind})
        elif kind == "task":
            acc.add(source="user", message=text, extra={"are_log": kind})
        elif kind == "llm_output":
            usage = {k: record.get(k) for k in ("prompt_tokens", "completion_tokens", "reasoning_tokens")}
            metrics = None
            if any(v is not None for v in usage.values()):
                metrics = atif.Metrics(
                    prompt_tokens=usage["prompt_tokens"],
                    completion_tokens=usage["completion_tokens"],
                    extra={"reasoning_tokens": usage["reasoning_tokens"]},
                )
            last = acc.add(
                source="agent",
                message=text,
                metrics=metrics,
                timestamp=record.get("ts"),
                extra={"are_log": kind, "simulated_time": record.get("timestamp")},
            )
        elif kind == "tool_call" and last is not None:
            calls += 1
            call_id = f"are_call_{calls}"
            tool = str(record.get("tool") or "")
            arguments = record.get("arguments")
            call = atif.ToolCall(
                tool_call_id=call_id,
                function_name=tool,
                arguments=arguments if isinstance(arguments, dict) else {"input": arguments},
            )
            last.tool_calls = [*(last.tool_calls or []), call]
            access = "write" if tool in matcher.tools else None
            if reward := matcher.reward(tool, access, True):
                last.extra.setdefault("rewards", []).append({**reward, "tool_call_id": call_id})
        elif kind in ("observation", "error") and last is not None:
            source = last.tool_calls[-1].tool_call_id if last.tool_calls else None
            observed = atif.ObservationResult(source_call_id=source, content=text, extra={"are_log": kind})
            _observe(last, observed)


def gateway_conversation(transcript: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """A vendor CLI's run as a conversation (it keeps its own; labkube holds what crossed the gateway and the tool
    calls from its event stream): the task prompt, each model call's answer, each tool result, in order, with the
    `model_call` record beside an assistant message. A tool result takes the id of the call it answers; Codex's
    events carry ids of their own, so those take the next open call of the last answer, in order."""
    open_calls: list[str] = []
    for record in iter_jsonl(transcript):
        kind = record.get("type")
        if kind in ("start", "resume") and record.get("prompt"):
            yield {"role": "user", "content": str(record["prompt"])}, None
        elif kind == "model_call" and record.get("via") == "gateway" and not record.get("error"):
            message = dict(record.get("message") or {"role": "assistant", "content": ""})
            open_calls = [str(c.get("id")) for c in message.get("tool_calls") or []]
            yield message, record
        elif kind == "tool_call":
            call_id = str(record.get("call_id") or "")
            if call_id in open_calls:
                open_calls.remove(call_id)
            elif open_calls:
                call_id = open_calls.pop(0)
            native = record.get("native_tool") or record.get("tool")
            yield (
                {"role": "tool", "tool_call_id": call_id, "name": native, "content": str(record.get("output") or "")},
                record,
            )


def _agent_step(acc: _Steps, message: dict[str, Any], call: dict[str, Any] | None, extra: dict[str, Any]) -> Any:
    """An assistant message as an agent step, with its model call's metrics; numbered by the call's run step."""
    import atif

    step_no = int(call["step"]) if call and call.get("step") is not None else None
    calls = [
        atif.ToolCall(tool_call_id=str(c["id"]), function_name=str(c["name"]), arguments=_arguments(c))
        for c in message.get("tool_calls") or []
    ]
    step = acc.add(
        source="agent",
        message=str(message.get("content") or ""),
        reasoning_content=message.get("thinking"),
        tool_calls=calls or None,
        model_name=(call or {}).get("model"),
        metrics=_metrics(call),
        timestamp=(call or {}).get("ts"),
        extra={**extra, "run_step": step_no},
    )
    if step_no is not None:
        acc.mark_agent(step_no)
    return step


def _observe(step: Any, observed: Any) -> None:
    import atif

    if step.observation is None:
        step.observation = atif.Observation(results=[observed])
    else:
        step.observation.results.append(observed)


def _gateway_steps(transcript: Path, acc: _Steps, matcher: Gaia2Matcher | None) -> None:
    """A vendor CLI's run as steps. In a Gaia2 world its tool calls carry the world's tool names; which of them
    write is not in its log: a tool counts as a write when ARE's judge weighed a call of it (as for ARE's agent)."""
    import atif

    last: Any = None
    for message, record in gateway_conversation(transcript):
        role = message["role"]
        if role == "user":
            acc.add(source="user", message=message["content"], extra={})
            last = None
        elif role == "assistant":
            last = _agent_step(acc, message, record, {"via": "gateway"})
        elif role == "tool" and last is not None and record is not None:
            tool = str(record.get("tool") or "")
            if matcher is not None and (
                reward := matcher.reward(tool, "write" if tool in matcher.tools else None, record.get("ok"))
            ):
                last.extra.setdefault("rewards", []).append({**reward, "tool_call_id": message["tool_call_id"]})
            observed = atif.ObservationResult(
                source_call_id=message["tool_call_id"] or None,
                content=message["content"],
                extra={"tool": record.get("tool"), "native_tool": message["name"], "ok": record.get("ok")},
            )
            _observe(last, observed)


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = call.get("arguments")
    if args is None:
        return {}
    return args if isinstance(args, dict) else {"input": args}


def plan_rewards(counted: _Steps, result: RunResult) -> tuple[dict[int, list[dict[str, Any]]], float]:
    """Which step gets which reward (by index), from the first pass's count: a grading's score change goes to the
    agent step of its run step, else the last agent step before it, else the last step; the terminal rewards to
    the last step. Also the sum of the step rewards placed."""
    at: dict[int, list[dict[str, Any]]] = {}
    agent_indices = sorted(counted.agent_steps.items())
    last = counted.count - 1 if counted.count else None
    placed = 0.0
    for run_step, rewards in step_rewards(result).items():
        index = next((i for n, i in reversed(agent_indices) if n <= run_step), last)
        for reward in rewards:
            placed += reward["value"]
            if index is not None:
                at.setdefault(index, []).append(reward)
    if last is not None:
        at.setdefault(last, []).extend({**r, "terminal": True} for r in terminal_rewards(result))
    return at, placed


def _labkube_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("labkube")
    except PackageNotFoundError:
        return "dev"


# -- SFT JSONL ------------------------------------------------------------------------------------


def sft_conversations(run_dir: Path) -> Iterator[list[dict[str, Any]]]:
    """The run's conversation as OpenAI chat fine-tuning messages, one list per context epoch (a vendor CLI's run:
    one, rebuilt from what crossed the gateway)."""
    if not (run_dir / "conversation.jsonl").exists() or (run_dir / "conversation.jsonl").stat().st_size == 0:
        messages = [openai_message(m) for m, _ in gateway_conversation(run_dir / "transcript.jsonl")]
        if messages:
            yield messages
        return
    epoch: int | None = None
    messages: list[dict[str, Any]] = []
    for message in iter_jsonl(run_dir / "conversation.jsonl"):
        this = int(message.get("epoch", 0))
        if epoch is not None and this != epoch and messages:
            yield messages
            messages = []
        epoch = this
        messages.append(openai_message(message))
    if messages:
        yield messages


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    content = str(message.get("content") or "")
    if role == "tool":
        return {"role": "tool", "tool_call_id": str(message.get("tool_call_id") or ""), "content": content}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": content or None}
        calls = message.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [
                {
                    "id": str(c["id"]),
                    "type": "function",
                    "function": {"name": str(c["name"]), "arguments": json.dumps(c.get("arguments") or {})},
                }
                for c in calls
            ]
        return out
    return {"role": role, "content": content}


# -- files ----------------------------------------------------------------------------------------


def export_run(cdir: CampaignDir, run_id: str, fmt: str, out: Path, flt: ExportFilter) -> ExportedRun:
    result = cdir.result(run_id)
    skip = flt.reason_to_skip(result)
    if skip is not None:
        error_outcome = str(result.outcome) if result is not None and result.is_error else None
        return ExportedRun(run_id, None, skip, error_outcome if skip.startswith(ERROR_SKIP) else None)
    assert result is not None
    run_dir = cdir.run_dir(run_id)
    campaign = cdir.root.name
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "atif":
        path = out / f"{campaign}--{run_id}.atif.json"
        write_trajectory(run_dir, result, path)
        return ExportedRun(run_id, path)
    path = out / f"{campaign}--{run_id}.sft.jsonl"
    tmp = path.with_suffix(".tmp")
    lines = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for messages in sft_conversations(run_dir):
            if not any(m["role"] == "assistant" for m in messages):
                continue
            fh.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
            lines += 1
    if not lines:
        tmp.unlink()
        return ExportedRun(run_id, None, "no assistant messages")
    tmp.replace(path)
    return ExportedRun(run_id, path)


def export_campaigns(
    campaigns: list[Path], fmt: str, out: Path, flt: ExportFilter, progress: bool = False
) -> list[ExportedRun]:
    runs = campaign_runs(campaigns)
    done: list[ExportedRun] = []
    if not progress:
        return [export_run(cdir, run_id, fmt, out, flt) for cdir, run_id in runs]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(f"export {fmt}", total=len(runs))
        for cdir, run_id in runs:
            done.append(export_run(cdir, run_id, fmt, out, flt))
            bar.advance(task)
    return done
