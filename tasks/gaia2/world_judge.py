"""ARE's judge in the world process: which judge a scenario gets (hard checks only, or with an LLM for the soft
checks), the caches that make building it cheap, what it matched and spent, and where its verdict is published.

Standalone like world_server.py (stdlib + ARE only), imported by name from the same folder.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import threading
from pathlib import Path
from typing import Any

from are.simulation.scenarios.scenario_imported_from_json import utils as are_scenario_utils
from are.simulation.utils.serialization import make_serializable
from are.simulation.validation import BaseJudge, BaseJudgeConfig, JudgeFactory, ScriptedGraphPerEventJudgeConfig
from are.simulation.validation import judge as are_judge
from are.simulation.validation import tool_judge as are_tool_judge
from are.simulation.validation.utils import llm_utils as are_llm_utils
from verdict_message import VERDICT_FILE_VARIABLE, verdict_report
from world_engines import llm_engine
from world_protocol import one_line

HARD_CHECKS = ["tool_call_counts", "hard_argument_checks", "causality", "time_window"]
log = logging.getLogger("labkube.world")


@functools.lru_cache(maxsize=8192)
def _template(text: str) -> tuple[Any, frozenset[str]]:
    import jinja2
    from jinja2 import meta

    variables = frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(text)))
    return jinja2.Template(text, keep_trailing_newline=True), variables


def install_judge_caches() -> None:
    """Building ARE's judge compiles about 8,000 jinja templates (seconds per scenario, even for hard
    checks only); compile each distinct template once, and build the hard-checks judge once
    (SharedHardChecksJudgeFactory). The checks and what is rendered are unchanged."""

    def jinja_format(template: str, skip_validation: bool = True, **kwargs: Any) -> str:
        compiled, variables = _template(template)
        if not skip_validation:
            if not all(k in kwargs for k in variables):
                raise ValueError(f"Expected: {set(variables)}, got: {sorted(kwargs)}.\nTemplate:\n{template}")
            kwargs = {k: kwargs[k] for k in variables}
        if all(isinstance(v, str) for v in kwargs.values()):  # a plain template of strings renders the same each time
            return _rendered(template, tuple(sorted(kwargs.items())))
        return compiled.render(**kwargs)

    are_llm_utils.jinja_format = jinja_format
    are_judge.jinja_format = jinja_format
    # Each judge builds about 900 LLM functions (a soft check per tool and argument, built even for hard checks only)
    # from the same dozen prompt templates, ARE's module constants, rendering their system prompt and examples again
    # each time: 4,000 renders per run. Render them once per templates object.
    are_llm_utils.LLMFunction.__init__ = _rendered_once(are_llm_utils.LLMFunction.__init__)
    # Each judge's tool judges read their checkers' parameter names: about 1,800 signatures per judge, the same ones.
    are_tool_judge.inspect = _SignatureCache()
    # ARE's preprocessing builds the judge a scenario is validated with through this name.
    are_scenario_utils.JudgeFactory = SharedHardChecksJudgeFactory
    are_llm_utils.LLMChecker.__call__ = _verdict_or_raise


class JudgeGaveNoVerdict(RuntimeError):
    """ARE's soft judge model answered without a verdict its checker accepts."""


def _verdict_or_raise(self: Any, user_prompt_args: dict[str, str]) -> bool:
    """ARE's `LLMChecker.__call__`, except that an answer with no verdict token (prose, an empty reply) raises
    instead of returning None, which ARE's tool judge takes for a failed check: a judge that gave no verdict is the
    judge's failure (ARE's judge records the exception, labkube makes the run a judge_error), not the agent's."""
    votes: list[bool] = []
    answers: list[str | None] = []
    for _ in range(self.num_votes):
        response = self.judge(user_prompt_args)
        answers.append(response)
        if response is None:
            continue
        if self.success_str in response:
            votes.append(True)
        elif self.failure_str in response:
            votes.append(False)
    if not votes:
        said = "; ".join(_answer_shown(a) for a in answers) or "nothing"
        raise JudgeGaveNoVerdict(
            f"the judge model answered without a verdict ({self.success_str} or {self.failure_str}): {said}"
        )
    return sum(votes) >= len(votes) / 2


def _answer_shown(answer: str | None) -> str:
    if answer is None:
        return "no text"
    text = " ".join(answer.split())
    return f"`{text[:200]}{'…' if len(text) > 200 else ''}`" if text else "an empty reply"


_LLM_FUNCTIONS: dict[int, tuple[Any, str, list[dict[str, str]]]] = {}  # id -> (templates, system prompt, examples)


def _rendered_once(original: Any) -> Any:
    """`LLMFunction.__init__`, with what it renders from its prompt templates remembered per templates object (kept
    alive with its entry, so its id names it); a templates object made on the fly is rendered as ARE does."""

    def init(self: Any, engine: Any, prompt_templates: Any) -> None:
        seen = _LLM_FUNCTIONS.get(id(prompt_templates))
        if seen is None or seen[0] is not prompt_templates:
            original(self, engine, prompt_templates)
            if len(_LLM_FUNCTIONS) < 256:
                _LLM_FUNCTIONS[id(prompt_templates)] = (prompt_templates, self.system_prompt, list(self.examples))
            return
        are_llm_utils.LLMFunctionBase.__init__(self, engine, prompt_templates)
        self.system_prompt = seen[1]
        self.user_prompt_template = prompt_templates.user_prompt_template
        self.examples = list(seen[2])

    return init


@functools.lru_cache(maxsize=65536)
def _rendered(template: str, kwargs: tuple[tuple[str, str], ...]) -> str:
    return _template(template)[0].render(**dict(kwargs))


class _SignatureCache:
    """`inspect` for ARE's tool judges, with `signature` remembered per function (a bound method's by its function:
    the same parameters, less the first)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, bool], inspect.Signature] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    def signature(self, fn: Any) -> inspect.Signature:
        function = getattr(fn, "__func__", None)
        if function is None or not inspect.ismethod(fn):
            return inspect.signature(fn)
        key = (function, True)
        if key not in self._seen:
            self._seen[key] = inspect.signature(fn)
        return self._seen[key]


def _no_llm(*_: Any, **__: Any) -> Any:
    raise RuntimeError("no judge model is configured (hard checks only)")


# One config object for every hard-checks-only judge: what SharedHardChecksJudgeFactory recognises by identity.
HARD_CHECKS_CONFIG = ScriptedGraphPerEventJudgeConfig(engine=_no_llm, event_id_to_checker_params={})


class SharedHardChecksJudgeFactory(JudgeFactory):
    """ARE's `JudgeFactory`, except that every hard-checks-only judge is a copy of one built once per process.

    Building a GraphPerEventJudge (its per-tool judges and their 900 LLM checkers, built even when no LLM is called)
    was half of a world's CPU per oracle run, for the same judge every time: it depends only on its config, and
    what it learns of a scenario and a run lives in `state` (set by `initialize_state`, grown by validation) and
    `error_logs`. A copy gets both fresh and shares the rest, which validation only reads. A judge with an LLM engine
    is built as ARE builds it: its engine counts what that run's judge spent."""

    _pristine: BaseJudge | None = None
    _building = threading.Lock()

    def __call__(self, config: BaseJudgeConfig) -> BaseJudge:
        if config is not HARD_CHECKS_CONFIG:
            return super().__call__(config)
        cls = SharedHardChecksJudgeFactory
        with cls._building:
            if cls._pristine is None:
                cls._pristine = super().__call__(config)
            pristine = cls._pristine
        judge = copy.copy(pristine)
        judge.state = type(pristine.state)()
        judge.error_logs = []
        return judge


def judge_config_for(judge: dict[str, Any] | None) -> tuple[Any, str, list[str]]:
    """ARE's Gaia2 judge: hard checks only unless a judge model is given for the soft (LLM) checks."""
    if not judge:
        return HARD_CHECKS_CONFIG, "hard checks only", list(HARD_CHECKS)
    from are.simulation.validation.configs import GraphPerEventJudgeConfig

    engine = llm_engine(judge, "judge")
    label = f"hard and soft checks (LLM judge {judge['model']})"
    return GraphPerEventJudgeConfig(engine=engine), label, [*HARD_CHECKS, "soft_llm_checks"]


def publish_verdict(body: dict[str, Any]) -> None:
    """Also write the verdict where `LABKUBE_WORLD_VERDICT_FILE` says: in a pod, the world container's termination
    message, which only this container can write. The operator hands it to the grading pod; the copy the agent's
    harness keeps in its checkpoint is on a volume the agent can write, so on a cluster it is not the record."""
    path = os.environ.get(VERDICT_FILE_VARIABLE)
    if path:
        Path(path).write_text(verdict_report(body))


def judge_usd(engine: Any) -> float | None:
    """What ARE's soft judge spent on its model, where its price was given (with its budget); else unknown."""
    if getattr(engine, "usd_per_million", None) is None:
        return None
    return round(engine.spent_usd, 6)


def judge_matches(judge: Any) -> list[dict[str, Any]] | None:
    """The agent events a GraphPerEventJudge weighed, in order, each with the oracle event it matched (ARE keeps
    this in the judge's state only); None for judges without per-event matching."""
    state = getattr(judge, "state", None)
    matched = getattr(state, "agent_idx_to_oracle_id", None)
    if state is None or matched is None:
        return None
    out = []
    index = 0
    for turn, events in enumerate(getattr(state, "turn_to_agent_events", []) or []):
        for event in events:
            try:
                tool = f"{event.app_name()}__{event.function_name()}"
                args = make_serializable(dict(getattr(event.action, "args", {}) or {}))
            except Exception:  # an event ARE could not describe: keep its place in the order
                tool, args = "unknown", {}
            out.append(
                {
                    "tool": tool,
                    "args": {k: v for k, v in args.items() if k != "self"},
                    "turn": turn,
                    "simulated_time": getattr(event, "event_time", None),
                    "oracle_event_id": matched.get(index),
                }
            )
            index += 1
    return out


def warm_judge() -> None:
    """Build ARE's judge once in the background: the hard-checks judge every copy is made from, and the template
    cache warm for a judge with an LLM."""
    try:
        SharedHardChecksJudgeFactory()(HARD_CHECKS_CONFIG)
    except Exception as exc:  # only an optimisation
        log.warning("warming the judge failed: %s", one_line(exc))
