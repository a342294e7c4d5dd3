"""The scenario a world process serves (`WorldSession`): loading it, the agent's tools, notifications and
simulated clock, ARE's own agent and the oracle, and the judge's verdict. Every method returns the JSON body of
its endpoint; world_server.py maps the endpoints to them.

Standalone like world_server.py (stdlib + ARE only), imported by name from the same folder.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from are.simulation.apps.agent_user_interface import AgentUserInterface
from are.simulation.apps.system import SystemApp
from are.simulation.environment import Environment
from are.simulation.notification_system import MessageType
from are.simulation.scenarios.scenario_imported_from_json.utils import get_scenario_duration, preprocess_scenario
from are.simulation.types import ConditionCheckEvent, EnvironmentState, EventLog
from are.simulation.utils.serialization import make_serializable
from verdict_message import ONE_SCENARIO_VARIABLE
from world_engines import agent_log_entry, engine_builder, gave_up, llm_spec
from world_health import (
    WorldBroken,
    WorldEnvironment,
    check_alive,
    check_oracle_apps,
    check_oracle_trace,
    deliver_first_user_message,
)
from world_judge import judge_config_for, judge_matches, judge_usd, publish_verdict
from world_protocol import UTC, VALIDATION_DEADLINE_S, ProtocolError, iso, one_line, with_deadline
from world_scenario import (
    a2a_params,
    apply_agent2agent,
    capability_tags,
    close_apps,
    environment_for,
    import_json,
    noise_configs,
    read_source,
    registry_scenario,
    seed_tool_failures,
    tool_spec,
)

MAX_SCENARIO_DURATION = 1800  # ARE's Gaia2 runner defaults (scenarios/config.py)
MAX_TIME_SCENARIO_DURATION = 420
# Tools ARE's own agent removes: user messages reach the agent as notifications instead.
HIDDEN_TOOLS = {
    "AgentUserInterface__get_last_message_from_user",
    "AgentUserInterface__get_last_message_from_agent",
    "AgentUserInterface__get_last_unread_messages",
    "AgentUserInterface__get_all_messages",
}
SEND_TO_USER = "AgentUserInterface__send_message_to_user"
DEADLINES = {
    "load": 180.0,
    "tool": 60.0,
    "wait": 60.0,
    "finish": VALIDATION_DEADLINE_S,
    "oracle": 180.0,
    "app_agent": 300.0,
}
ARE_AGENT_DEADLINE = 3600.0  # POST /are_agent: the caller may ask for less (its wall budget)


class WorldSession:
    """The scenario currently served. Every method returns the JSON body of its endpoint."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.scenario: Any = None
        self.env: WorldEnvironment | None = None
        self.kind = ""
        self.source_text = ""
        self.oracle = False
        self.finished = False
        self.broken = False
        self.judge_spec: dict[str, Any] | None = None
        self.judge_label = ""
        self.checks: list[str] = []
        self.tools: dict[str, Any] = {}
        self.paused_at: float | None = None
        self.loaded_wall = 0.0
        self.load_params: dict[str, Any] = {}
        self.loaded_once = False

    # -- helpers ------------------------------------------------------------------------------------

    def _deadline(self, fn: Callable[[], Any], kind: str, what: str) -> Any:
        try:
            return with_deadline(fn, DEADLINES[kind], what)
        except ProtocolError as exc:
            if exc.status == 504:  # the stuck call may still hold ARE's locks: serve nothing more from it
                self.broken = True
            raise

    def _require(self, *, agent: bool | None = None, running: bool = False) -> WorldEnvironment:
        if self.broken:
            raise ProtocolError(409, "an earlier request timed out and the world may be stuck: load a scenario again")
        if self.scenario is None:
            raise ProtocolError(409, "no scenario is loaded: POST /scenario first")
        if agent is True and self.oracle:
            raise ProtocolError(
                409, "the scenario was loaded with oracle: true; load it with oracle: false for an agent"
            )
        if agent is False and not self.oracle:
            raise ProtocolError(
                409, "the scenario was loaded for an agent; load it with oracle: true to run the oracle"
            )
        if running and self.finished:
            raise ProtocolError(409, f"scenario {self.scenario.scenario_id} is finished: load the next one")
        if self.env is None:
            raise ProtocolError(409, "the scenario has no running environment")
        check_alive(self.env)
        return self.env

    def _now(self) -> float:
        assert self.env is not None
        return self.env.time_manager.time()

    def _sends_to_user(self) -> int:
        assert self.env is not None
        return sum(
            1
            for e in self.env.event_log.list_view()
            if e.event_type.value == "AGENT" and getattr(e, "tool_name", "") == SEND_TO_USER and not e.failed()
        )

    def _nb_turns(self) -> int:
        scenario = self.scenario
        if getattr(scenario, "nb_turns", None):
            return int(scenario.nb_turns)
        if self.kind == "json" and scenario is not None and scenario.events:
            # Oracle mode does not initialise ARE's turns; count them the way ARE does.
            return max(scenario.build_event_id_to_turn_idx().values(), default=0) + 1
        return 1

    def _unload(self) -> None:
        env, scenario = self.env, self.scenario
        self.env, self.scenario, self.tools, self.paused_at = None, None, {}, None
        if env is not None:
            env.stop()  # its loop thread notices within a tick and exits; nothing waits for it
        if scenario is not None:
            close_apps(scenario)

    def info(self) -> dict[str, Any]:
        with self.lock:
            return self._info()

    def state(self) -> dict[str, Any]:
        """ARE's own dumps of the loaded scenario: its apps' state and its event log (a warm world's next
        scenario is checked against a fresh world's with these)."""
        with self.lock:
            if self.env is None:
                raise ProtocolError(404, "no scenario is loaded")
            return {
                "apps": json.loads(self.env.apps_state_json())["apps"],
                "event_log": json.loads(self.env.event_log_json())["event_log"],
            }

    def _info(self) -> dict[str, Any]:
        if self.scenario is None:
            raise ProtocolError(404, "no scenario is loaded")
        s = self.scenario
        body = {
            "scenario_id": s.scenario_id,
            "kind": self.kind,
            "oracle": self.oracle,
            "seed": s.seed,
            "start_time": s.start_time,
            "duration": self.env.duration if self.env is not None and not self.oracle else s.duration,
            "nb_turns": self._nb_turns(),
            "capabilities": capability_tags(s),
            "judge": self.judge_label,
            "finished": self.finished,
        }
        if self.env is not None:
            body["time"] = self._now()
            body["datetime"] = iso(self._now())
        return body

    # -- loading ------------------------------------------------------------------------------------

    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        source = req.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ProtocolError(400, "POST /scenario needs source: an ARE registry id, a JSON file path or JSON text")
        if req.get("agent2agent") and req.get("oracle"):
            raise ProtocolError(400, "agent2agent augments an agent run; the oracle replays its events without agents")
        a2a = a2a_params(req["agent2agent"]) if req.get("agent2agent") else None
        if req.get("judge") is not None:
            llm_spec(req["judge"], "judge")
        with self.lock:
            if self.loaded_once and os.environ.get(ONE_SCENARIO_VARIABLE) == "1":
                # A pod's sidecar serves the one scenario its harness loaded before the agent started; the agent's
                # shell reaches this port too, and a reload (say, as an oracle run) would replace what it is judged on.
                raise ProtocolError(409, "this world serves one run's scenario, loaded already: start a new world")
            self.loaded_once = True
            self._unload()
            self.finished = False
            self.broken = False
            self.oracle = bool(req.get("oracle", False))
            self.judge_spec = req.get("judge")
            self.load_params = req
            kind, payload = read_source(source)
            self.kind, self.source_text = kind, payload if kind == "json" else ""
            try:
                self._deadline(lambda: self._build(kind, payload, req, a2a), "load", "loading the scenario")
            except WorldBroken:
                self._unload()
                raise
            self.loaded_wall = time.monotonic()
            return self._info()

    def _prepare(self, scenario: Any, req: dict[str, Any]) -> None:
        if req.get("seed") is not None:
            scenario.seed = int(req["seed"])
        tools_noise, events_noise = noise_configs(req.get("noise"))
        scenario.tool_augmentation_config = tools_noise
        scenario.env_events_config = events_noise

    def _build(self, kind: str, payload: str, req: dict[str, Any], a2a: tuple[float, dict[str, Any]] | None) -> None:
        if kind == "json":
            scenario = import_json(payload)
        else:
            scenario = self._call_are(lambda: registry_scenario(payload), "creating the scenario")
        self._prepare(scenario, req)
        if kind == "json":
            self.judge_label, self.checks = "", []
            if not self.oracle:
                judge_config, self.judge_label, self.checks = judge_config_for(self.judge_spec)
                self.judge_engine = getattr(judge_config, "engine", None)
                duration = req.get("duration") or get_scenario_duration(
                    scenario, MAX_TIME_SCENARIO_DURATION, MAX_SCENARIO_DURATION
                )
                self._call_are(
                    lambda: preprocess_scenario(
                        scenario,
                        judge_config=judge_config,
                        max_scenario_duration=int(duration),
                        tool_augmentation_config=scenario.tool_augmentation_config,
                        env_events_config=scenario.env_events_config,
                    ),
                    "preparing the scenario",
                )
                check_oracle_apps(scenario)
                # ARE's preprocessing ran the oracle to record what the judge expects: it must be whole.
                check_oracle_trace(scenario, getattr(scenario, "oracle_run_event_log", None) or [], "ARE's oracle run")
            else:
                self._call_are(scenario.initialize, "initializing the scenario")
                check_oracle_apps(scenario)
                scenario.patch_oracle_user_message_order()
        else:
            self.judge_label, self.checks = (
                "the scenario's own validation (ARE registry scenario)",
                ["scenario.validate"],
            )
            if req.get("duration"):
                scenario.duration = float(req["duration"])
            self._call_are(scenario.initialize, "initializing the scenario")
            check_oracle_apps(scenario)
            if not self.oracle and not any(isinstance(a, SystemApp) for a in scenario.apps or []):
                scenario.apps.append(SystemApp())  # wait_for_notification / get_current_time, as Gaia2 has
        env = environment_for(scenario, self.oracle)
        if a2a is not None:
            self._call_are(lambda: apply_agent2agent(scenario, env, *a2a), "agent2agent")
        self.scenario, self.env = scenario, env
        seed_tool_failures(scenario)
        if self.oracle:
            return
        self.env.run(scenario, wait_for_end=False)
        aui = self.env.get_app_with_class(AgentUserInterface)
        if aui is not None:
            aui.wait_for_user_response = False  # as ARE's agent does: user replies arrive as notifications
        self.tools = {}
        for tool in scenario.get_tools():
            if tool.name not in HIDDEN_TOOLS:
                self.tools[tool._public_name or tool.name] = tool
        self.env.first_tick.wait(10)
        deliver_first_user_message(self.env, scenario)

    @staticmethod
    def _call_are(fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except ProtocolError:
            raise
        except Exception as exc:
            raise ProtocolError(422, f"{what} failed in ARE: {one_line(exc)}") from None

    # -- the agent's side ---------------------------------------------------------------------------

    def list_tools(self) -> dict[str, Any]:
        with self.lock:
            self._require(agent=True)
            return {"tools": [tool_spec(t) for t in self.tools.values()]}

    def call_tool(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req.get("name")
        arguments = req.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise ProtocolError(400, "POST /tools/call needs name (string) and arguments (object)")
        with self.lock:
            env = self._require(agent=True, running=True)
            tool = self.tools.get(name)
            if tool is None:
                return {"ok": False, "error": f"unknown tool {name!r}", "result": None, "text": "", "time": self._now()}
            if name == "SystemApp__wait_for_notification":  # same path as POST /wait_for_notification
                try:
                    waited = self.wait({"timeout": arguments.get("timeout", 0)})
                except ProtocolError as exc:
                    if exc.status != 400:
                        raise
                    return {"ok": False, "error": str(exc), "result": None, "text": "", "time": self._now()}
                ok = waited["error"] is None
                return {
                    "ok": ok,
                    "error": waited["error"],
                    "result": None,
                    "text": "None" if ok else "",
                    "time": waited["time"],
                }

            def run() -> Any:
                with env.tick_lock:
                    return tool(**arguments)

            try:
                kind = "app_agent" if name.endswith("__expert_agent") else "tool"
                result = self._deadline(run, kind, f"tool {name}")
            except ProtocolError:
                raise
            except Exception as exc:
                return {"ok": False, "error": one_line(exc), "result": None, "text": "", "time": self._now()}
            body = {"ok": True, "error": None, "result": make_serializable(result), "text": str(result)}
            if tool.name == SEND_TO_USER:
                body.update(self._after_turn_end())
            check_alive(env)
            body["time"] = self._now()
            return body

    def _after_turn_end(self) -> dict[str, Any]:
        self._deadline(self._settle_turn_conditions, "finish", "judging the turn")
        return {"turn_ended": True, "turns_completed": self._sends_to_user(), "world_stopped": self._stopped()}

    def _stopped(self) -> bool:
        """True once ARE stopped the world (its duration ran out, or the judge rejected a turn)."""
        env = self.env
        if env is None:
            return False
        return env.stop_event.is_set() or env.state not in (EnvironmentState.RUNNING, EnvironmentState.PAUSED)

    def _settle_turn_conditions(self) -> None:
        """ARE checks a finished turn in a ConditionCheckEvent on its next tick (about a second of wall time);
        run that tick now, so the judge's verdict and the next user message do not depend on wall-clock luck."""
        env = self.env
        if env is None or self.paused_at is not None or self.oracle:
            return
        sends = self._sends_to_user()
        with env.tick_lock:
            for _ in range(5):
                due = [
                    e
                    for e in env.event_queue.list_view()
                    if isinstance(e, ConditionCheckEvent)
                    and e.event_id.startswith("condition_turn_")
                    and int(e.event_id.rsplit("_", 1)[1]) <= sends
                ]
                if not due or self._stopped():
                    return
                next_time = min(e.event_time for e in due)
                now = env.time_manager.time()
                if next_time > now:
                    env.time_manager.add_offset(next_time - now)
                try:
                    env.tick()
                except Exception:
                    check_alive(env)
                    raise

    def pull_notifications(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True)
            with env.tick_lock:
                now = self._now()
                messages = env.notification_system.message_queue.get_by_timestamp(datetime.fromtimestamp(now, tz=UTC))
            kinds = {
                MessageType.USER_MESSAGE: "user_message",
                MessageType.ENVIRONMENT_NOTIFICATION: "environment",
                MessageType.ENVIRONMENT_STOP: "environment_stop",
            }
            return {
                "notifications": [
                    {
                        "type": kinds.get(m.message_type, str(m.message_type)),
                        "message": m.message,
                        "timestamp": m.timestamp.timestamp(),
                        "datetime": m.timestamp.strftime("%Y-%m-%d %H:%M:%S"),
                    }
                    for m in messages
                ],
                "time": now,
                "world_stopped": self._stopped(),
            }

    def wait(self, req: dict[str, Any]) -> dict[str, Any]:
        timeout = req.get("timeout", 60)
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ProtocolError(400, "POST /wait_for_notification needs timeout: seconds of simulated time (>= 0)")
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is paused: resume it before waiting")
            tool = self.tools.get("SystemApp__wait_for_notification")
            if tool is None:
                raise ProtocolError(409, "this scenario has no SystemApp, so it cannot wait for notifications")
            before = self._now()
            pending = env.notification_system.message_queue.has_new_messages(datetime.fromtimestamp(before, tz=UTC))
            error = None
            if not pending and not self._stopped():
                # ARE jumps the clock to the next event or notification (or to the timeout): no wall-time sleep.
                def run() -> None:
                    with env.tick_lock:
                        tool(timeout=int(timeout))

                try:
                    self._deadline(run, "wait", "wait_for_notification")
                except ProtocolError:
                    raise
                except Exception as exc:  # e.g. a failure injected by ARE's noise augmentation
                    error = one_line(exc)
            check_alive(env)
            after = self._now()
            return {
                "time": after,
                "datetime": iso(after),
                "advanced": after - before,
                "world_stopped": self._stopped(),
                "error": error,
            }

    def clock(self) -> dict[str, Any]:
        with self.lock:
            env = self._require()
            now = self._now()
            return {
                "time": now,
                "datetime": iso(now),
                "start_time": env.start_time,
                "elapsed": now - env.start_time,
                "paused": self.paused_at is not None,
            }

    def pause(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is already paused")
            with env.tick_lock:
                env.pause()
            self.paused_at = time.monotonic()
            return {"time": self._now(), "paused": True}

    def resume(self, req: dict[str, Any]) -> dict[str, Any]:
        mode = req.get("mode", "measured")
        seconds = req.get("seconds")
        if mode not in ("measured", "fixed") or (seconds is not None and not isinstance(seconds, (int, float))):
            raise ProtocolError(400, "POST /clock/resume takes mode: measured|fixed and seconds: number")
        if mode == "fixed" and seconds is None:
            raise ProtocolError(400, "mode fixed needs seconds: the simulated think time to charge")
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is None:
                raise ProtocolError(409, "the clock is not paused")
            charged = float(seconds) if seconds is not None else time.monotonic() - self.paused_at
            if charged < 0:
                raise ProtocolError(400, "seconds must be >= 0")
            with env.tick_lock:
                if env.state == EnvironmentState.PAUSED:
                    env.resume_with_offset(charged)  # ARE's own call after a model generation
                else:
                    charged = 0.0  # the world stopped meanwhile: its clock no longer matters
            self.paused_at = None
            return {"time": self._now(), "paused": False, "charged": charged}

    def message_to_user(self, req: dict[str, Any]) -> dict[str, Any]:
        content = req.get("content")
        if not isinstance(content, str):
            raise ProtocolError(400, "POST /message_to_user needs content (string)")
        body = self.call_tool({"name": SEND_TO_USER, "arguments": {"content": content}})
        if not body["ok"]:
            raise ProtocolError(409, f"sending the message failed in ARE: {body['error']}")
        return {k: body[k] for k in ("time", "turn_ended", "turns_completed", "world_stopped")} | {
            "nb_turns": self._nb_turns()
        }

    # -- verdicts -----------------------------------------------------------------------------------

    def finish(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                self.resume({"mode": "fixed", "seconds": 0})
            self._deadline(self._settle_turn_conditions, "finish", "judging the last turn")
            with env.tick_lock:
                env.pause()  # no event may fire while the judge reads the log
            check_alive(env)
            scenario = self.scenario
            result = self._deadline(lambda: scenario.validate(env), "finish", "validation")
            body = self._verdict(result, simulated=self._now() - env.start_time)
            self.finished = True
            env.stop()
            return body

    def run_are_agent(self, req: dict[str, Any]) -> dict[str, Any]:
        """ARE's own default agent (the reference scaffold) runs the loaded scenario, then the judge decides."""
        llm = llm_spec(req.get("llm"), "llm")
        think = req.get("think_time") or {"mode": "measured"}
        timeout = req.get("timeout", ARE_AGENT_DEADLINE)
        max_iterations = req.get("max_iterations")
        if not isinstance(think, dict) or think.get("mode") not in ("measured", "fixed"):
            raise ProtocolError(400, 'think_time is {"mode": "measured"} or {"mode": "fixed", "seconds": N}')
        if think["mode"] == "fixed" and not isinstance(think.get("seconds"), (int, float)):
            raise ProtocolError(400, "think_time mode fixed needs seconds: the simulated time charged per model call")
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ProtocolError(400, "timeout is the wall-clock seconds ARE's agent may run (> 0)")
        if max_iterations is not None and (not isinstance(max_iterations, int) or max_iterations < 1):
            raise ProtocolError(400, "max_iterations is a positive integer (ARE's default is 80 per turn)")
        from are.simulation.agents.agent_builder import AgentBuilder
        from are.simulation.agents.agent_config_builder import AgentConfigBuilder
        from are.simulation.agents.are_simulation_agent_config import LLMEngineConfig
        from are.simulation.types import SimulatedGenerationTimeConfig

        with self.lock:
            env = self._require(agent=True, running=True)
            if self.paused_at is not None:
                raise ProtocolError(409, "the clock is paused: resume it before starting ARE's agent")
            scenario = self.scenario
            config = AgentConfigBuilder().build(agent_name="default")
            base = config.get_base_agent_config()
            base.llm_engine_config = LLMEngineConfig(
                model_name=llm["model"], provider=llm.get("provider"), endpoint=llm.get("endpoint")
            )
            base.simulated_generation_time_config = SimulatedGenerationTimeConfig(
                mode=think["mode"], seconds=think.get("seconds", 1.0)
            )
            agent = self._call_are(
                lambda: AgentBuilder(engine_builder(llm, "llm")).build(agent_config=config, env=env),
                "building ARE's agent",
            )
            if max_iterations is not None:
                # ARE's AgentBuilder drops the config's max_iterations: its ARESimulationAgent resets the
                # ReAct agent to its own default (80). Set it where the termination check reads it.
                agent.max_iterations = agent.react_agent.max_iterations = max_iterations
            output, stopped, error = None, "finished", None
            try:
                output = with_deadline(
                    lambda: agent.run_scenario(scenario=scenario, notification_system=env.notification_system),
                    float(timeout),
                    "ARE's agent",
                ).output
                stopped, error = gave_up(agent.react_agent)
            except ProtocolError as exc:  # out of time: stop it and judge what it did
                agent.stop()
                stopped, error = "timeout", str(exc).split(";")[0]
            except Exception as exc:  # an agent failure: judged as it stands, the error reported
                stopped, error = "error", one_line(exc)
            body = self.finish()
            body["agent"] = {
                "name": "are-default",
                "model": llm["model"],
                "output": None if output is None else str(output),
                "stopped": stopped,
                "error": error,
                "logs": [agent_log_entry(log) for log in agent.react_agent.logs],
            }
            return body

    def run_oracle(self) -> dict[str, Any]:
        with self.lock:
            env = self._require(agent=False, running=True)
            scenario = self.scenario

            def run() -> dict[str, Any]:
                try:
                    env.run(scenario, wait_for_end=True)
                    check_alive(env)
                    check_oracle_trace(scenario, env.event_log.list_view(), "ARE's oracle run")
                    ran = scenario.validate(env)
                    simulated = self._now() - env.start_time
                finally:
                    env.stop()
                if self.kind != "json":
                    self.judge_label = "the scenario's own validation (ARE registry scenario)"
                    self.checks = ["scenario.validate"]
                    return self._verdict(ran, simulated)
                return self._judge_oracle_run(ran, env.event_log.list_view(), simulated)

            body = self._deadline(run, "oracle", "the oracle run")
            self.finished = True
            return body

    def _judge_oracle_run(self, ran: Any, completed: list[Any], simulated: float) -> dict[str, Any]:
        """A Gaia2 JSON scenario's oracle trace, judged offline by ARE's GraphPerEventJudge (its judge-only
        path): proof that the scenario's oracle passes the same judge an agent faces."""
        if not ran.success:
            self.judge_label, self.checks = "ARE oracle run", ["oracle_run"]
            return self._verdict(ran, simulated)
        fresh = import_json(self.source_text)
        self._prepare(fresh, self.load_params)
        judge_config, label, checks = judge_config_for(self.judge_spec)
        self.judge_engine = getattr(judge_config, "engine", None)
        self.judge_label, self.checks = label, ["oracle_run", *checks]
        self._call_are(
            lambda: preprocess_scenario(fresh, judge_config=judge_config, offline_validation=True),
            "preparing the judge",
        )
        judged_env = Environment()
        judged_env.event_log = EventLog.from_list_view(completed)
        return self._verdict(fresh.validate(judged_env), simulated, getattr(fresh, "judge", None))

    def _verdict(self, result: Any, simulated: float, judge: Any = None) -> dict[str, Any]:
        exception = getattr(result, "exception", None)
        soft = "judged" if "soft_llm_checks" in self.checks else "not judged (no judge model configured)"
        if soft == "judged" and exception is not None:
            soft = "failed (the judge raised; see exception)"
        if self.kind != "json":
            soft = "not applicable"
        success = bool(result.success)
        rationale = getattr(result, "rationale", None)
        if rationale in ("None", ""):  # ARE's judge stringifies a missing failure
            rationale = None
        if not success and not rationale:
            if exception is not None:
                rationale = one_line(exception)
            elif result.success is None:
                rationale = "ARE gave no verdict (success=None): the scenario has no oracle events to judge against"
            else:
                rationale = "the scenario's validation returned success=False (ARE gives no rationale for it)"
        turns_total = self._nb_turns()
        body = {
            "scenario_id": self.scenario.scenario_id,
            "success": success,
            "rationale": rationale,
            "exception": one_line(exception) if exception is not None else None,
            "judge": self.judge_label,
            "judge_usd": judge_usd(getattr(self, "judge_engine", None)),
            "checks": self.checks,
            "soft_checks": soft,
            "oracle": self.oracle,
            "turns_completed": self._sends_to_user() if self.env else 0,
            "nb_turns": turns_total,
            "simulated_seconds": simulated,
            "wall_seconds": time.monotonic() - self.loaded_wall,
            "matches": judge_matches(judge if judge is not None else getattr(self.scenario, "judge", None)),
        }
        publish_verdict(body)
        return body
