"""Is the world sound? ARE's environment with its failures recorded, and the checks that end a run on a broken
world instead of judging it.

Standalone like world_server.py (stdlib + ARE only), imported by name from the same folder.

ARE's event loop runs in a thread that catches nothing: an event that raises (an oracle event for an app the
scenario lacks: `KeyError: 'Messages'`) kills the thread, the simulated world stands still, and ARE's judge
then compares whatever was logged. Its oracle loop the same: the trace it leaves is cut short, and the judge
built from it expects less. So the world records what killed the loop, checks at load that every app an
oracle event calls exists and that ARE's oracle run executed every oracle event, and answers every later
request with `WorldBroken`.
"""

from __future__ import annotations

import logging
import threading
import traceback
from pathlib import Path
from typing import Any

from are.simulation.environment import Environment
from are.simulation.notification_system import MessageType
from are.simulation.types import EnvironmentState, EventType, OracleEvent

log = logging.getLogger("labkube.world")
MAX_FIRST_MESSAGE_TICKS = 100_000  # ticks jumped before the first user message; every tick moves the clock on


class WorldBroken(Exception):
    """The world cannot give a faithful run: ARE's event loop died, or the scenario is unsound."""


def describe_failure(exc: BaseException) -> str:
    """The exception in one line, with the frame that raised it (what the world log's traceback ends with)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (in {frames[-1].name}, {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {text}{where}"[:2000]


class WorldEnvironment(Environment):
    """ARE's Environment plus a lock around ticks, so HTTP requests and the event loop thread never tick at
    once; a flag set once the first tick has run; and the first exception that escaped a tick or the loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tick_lock = threading.RLock()
        self.first_tick = threading.Event()
        self.failure: str | None = None

    def tick(self) -> None:
        try:
            with self.tick_lock:
                super().tick()
        except Exception as exc:
            self._record(exc)
            raise
        finally:
            self.first_tick.set()

    def _event_loop(self) -> None:
        try:
            super()._event_loop()
        except Exception as exc:
            self._record(exc)
            raise  # Python's thread hook prints the traceback to the world log

    def _record(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = describe_failure(exc)
            log.error("ARE's event loop failed: %s\n%s", self.failure, traceback.format_exc())

    def broken(self) -> str | None:
        """Why this world can no longer run faithfully, or None."""
        if self.failure is not None:
            return f"ARE's event loop died: {self.failure}"
        thread = getattr(self, "thread", None)
        running = self.state in (EnvironmentState.RUNNING, EnvironmentState.PAUSED)
        if thread is not None and not thread.is_alive() and running:
            return "ARE's event loop thread ended while the world was still running"
        return None


def check_alive(env: WorldEnvironment | None) -> None:
    if env is None:
        return
    why = env.broken()
    if why is not None:
        raise WorldBroken(f"{why}; the run cannot be judged (load a scenario again)")


def oracle_apps_missing(scenario: Any) -> dict[str, str]:
    """Oracle events whose app the scenario does not have: {event id: app name}. ARE imports them (it looks
    the app up only when the event fires) and its event loop dies on the first one."""
    apps = {app.name for app in getattr(scenario, "apps", None) or []}
    missing = {}
    for event in getattr(scenario, "events", None) or []:
        desc = getattr(event, "action_desc", None)
        if isinstance(event, OracleEvent) and desc is not None and desc.app and desc.app not in apps:
            missing[event.event_id] = desc.app
    return missing


def check_oracle_apps(scenario: Any) -> None:
    missing = oracle_apps_missing(scenario)
    if missing:
        apps = sorted(set(missing.values()))
        raise WorldBroken(
            f"the scenario's oracle events call apps it does not have: {', '.join(apps)} "
            f"(events {', '.join(sorted(missing))}); add them to the scenario's apps"
        )


def oracle_events_not_run(scenario: Any, completed: list[Any]) -> list[str]:
    """Oracle events of `scenario` that an oracle run's log `completed` lacks, or holds as failed."""
    ran = {e.event_id: e for e in completed if e.event_type == EventType.AGENT}
    expected = [e.event_id for e in getattr(scenario, "events", None) or [] if isinstance(e, OracleEvent)]
    return [eid for eid in expected if eid not in ran or ran[eid].failed()]


def check_oracle_trace(scenario: Any, completed: list[Any], what: str) -> None:
    """Every oracle event ran, and ran cleanly: a trace cut short would give the judge less to expect."""
    short = oracle_events_not_run(scenario, completed)
    if short:
        failed = [e.metadata.exception for e in completed if e.event_id in short and e.failed()]
        detail = f"; failed: {failed[0]}" if failed else ""
        raise WorldBroken(
            f"{what} did not execute {len(short)} of the scenario's oracle events ({', '.join(short[:5])}){detail}"
        )


def user_message_waiting(env: Environment) -> bool:
    queue = env.notification_system.message_queue if env.notification_system is not None else None
    return queue is not None and any(m.message_type == MessageType.USER_MESSAGE for m in queue.list_view())


def is_user_message(event: Any) -> bool:
    """A message from the user to the agent: a USER event in Gaia2 JSON, an ENV event of AgentUserInterface's
    send_message_to_agent in ARE's registry scenarios."""
    action = getattr(event, "action", None)
    sends = getattr(action, "app_name", None) == "AgentUserInterface" and (
        getattr(action, "function_name", None) == "send_message_to_agent"
    )
    return sends or getattr(event, "event_type", None) == EventType.USER


def has_user_message(scenario: Any) -> bool:
    return any(is_user_message(e) for e in getattr(scenario, "events", None) or [])


def deliver_first_user_message(env: WorldEnvironment, scenario: Any) -> float:
    """Run the world, in simulated time, until the scenario's first user message is delivered; returns the
    simulated seconds this advanced. ARE's tutorials send it seconds after t=0: without this an agent's first
    model request would hold no task. The clock jumps from event to event (as ARE's wait_for_notification
    does, without its SystemApp event in the log); nothing is charged to the agent, which has not started."""
    if not has_user_message(scenario):
        return 0.0
    clock = env.time_manager
    with env.tick_lock:
        start = clock.time()
        for _ in range(MAX_FIRST_MESSAGE_TICKS):
            if user_message_waiting(env) or env.state != EnvironmentState.RUNNING or env.broken():
                break
            next_time = env.get_next_event_time()
            if next_time is None or (env.duration is not None and next_time - env.start_time > env.duration):
                break
            now = clock.time()
            if next_time > now:
                clock.add_offset(next_time - now)
            try:
                env.tick()
            except Exception:  # recorded by the environment: check_alive says what
                break
        check_alive(env)
        return clock.time() - start
