"""What a supervisor worker keeps warm across the runs it supervises: Gaia2 world processes and an agent zygote.

One `WarmWorker` lives in each supervisor process (a Ray actor: per machine locally, per worker node on a
cluster) for the length of a campaign. Its worlds are started once, sized by the runs the worker may supervise
at once, and each is lent to one run at a time: the run's agent reaches it through LABKUBE_WORLD_URL as it would
a pod's sidecar. A world goes back to the pool only after the run's result is recorded and only when nothing went
wrong with it (no world error, no failed load, an agent that exited by itself); otherwise it is stopped and the
next run gets a fresh one. Scripted agents (oracle, noop, replay, cheat) are forked from the zygote instead of
started as a new interpreter; model-driven agents keep a process of their own, started as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from labkube.model_ref import SCRIPTED, SCRIPTED_WITH_ARG, UnknownModel, parse_model
from labkube.operator.zygote_handoff import SupervisorZygote
from labkube.run_spec import RunSpec
from labkube.settings import WARM_WORKERS
from labkube.store import CampaignDir, StoreError
from labkube.task_card import TaskFamily
from labkube.tasks.gaia2.world_client import CONTROL_TOKEN_VARIABLE
from labkube.tasks.gaia2.world_process import WorldHandoff, WorldPool, WorldProcess

log = logging.getLogger(__name__)

WORLDS_FOLDER = "worlds"  # under the campaign directory: the pooled worlds' logs


def forks_agent(spec: RunSpec) -> bool:
    """Runs whose agent needs no interpreter of its own: rg-agent on a scripted model (where the zygote can watch
    its children: Linux's pidfds)."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        provider = parse_model(spec.model).provider
    except UnknownModel:
        return False
    return spec.agent == "rg-agent" and provider in SCRIPTED + SCRIPTED_WITH_ARG


def uses_world(spec: RunSpec) -> bool:
    return spec.family == TaskFamily.gaia2


@dataclass
class WorldLease:
    world: WorldProcess
    log_offset: int  # where this run's part of the world's log starts

    @property
    def env(self) -> dict[str, str]:
        """What the run's agent process gets: the world's address and log, and its control token, which the local
        sandbox hands over on stdin with the API keys (`agent_keys.split_secrets`)."""
        env = {"LABKUBE_WORLD_URL": self.world.base_url, "LABKUBE_WORLD_LOG": str(self.world.log_path)}
        if self.world.control_token:
            env[CONTROL_TOKEN_VARIABLE] = self.world.control_token
        return env


def campaign_key_variables(campaign_root: Path) -> set[str]:
    """The environment variables a campaign names as its models' API keys (`api_key_env`), which its shared worlds
    must not inherit (the `*_API_KEY` ones they never do)."""
    try:
        return set(CampaignDir(campaign_root).load_spec().api_key_env.values())
    except StoreError:  # no campaign here (a supervisor driven by hand): the runs' own keys stay with them
        return set()


def warm_workers() -> bool:
    """Whether supervisors keep worlds and an agent zygote warm (`WarmWorker`); LABKUBE_WARM_WORKERS=0 (or
    false, no, off) turns it off: a world and an interpreter per run, as before (the benchmarks' "before")."""
    return WARM_WORKERS.read()


def early_world_count(runs: list[RunSpec], concurrency: int) -> int:
    """How many worlds the campaign's supervisors keep warm in all (one per run slot that a Gaia2 run may take)."""
    return min(concurrency, sum(1 for r in runs if uses_world(r))) if warm_workers() else 0


class WarmWorker:
    def __init__(self) -> None:
        self.zygote = SupervisorZygote()
        self.worlds: WorldPool | None = None
        self.slots = 1

    def _pool(self, campaign_root: Path) -> WorldPool | None:
        if self.worlds is None:
            from labkube.tasks.gaia2 import WorldEnvError, world_python

            try:
                python = world_python()
            except WorldEnvError:  # each run's agent says so in its own words (`labkube worlds setup`)
                return None
            self.worlds = WorldPool(
                python,
                max_idle=self.slots,
                log_dir=campaign_root / WORLDS_FOLDER,
                key_variables=campaign_key_variables(campaign_root),
            )
        return self.worlds

    async def warm_up(
        self, slots: int, campaign_root: Path, worlds: int, fork_agents: bool, adopt: list[WorldHandoff] | None = None
    ) -> None:
        """Before the first run: the zygote and `worlds` world processes (at most `slots`), started in parallel;
        the worlds in `adopt` (the driver started them while Ray started) count among them."""
        self.slots = max(1, slots)
        jobs = []
        if fork_agents:
            jobs.append(self.zygote.start())
        pool = self._pool(campaign_root) if worlds or adopt else None
        if pool is not None:
            pool.adopt(adopt or [])
            jobs.append(asyncio.to_thread(pool.prestart, min(worlds, self.slots)))
        await asyncio.gather(*jobs)

    async def lease_world(self, campaign_root: Path) -> WorldLease | None:
        """A warm world for one run; None when there is none to give (the agent then starts its own and says why it
        cannot)."""
        pool = self._pool(campaign_root)
        if pool is None:
            return None
        try:
            # An idle world is taken here; a thread (and its two wake-ups, a good part of the supervisor's CPU per
            # short run) only to start one.
            world = pool.acquire_idle() or await asyncio.to_thread(pool.acquire)
        except Exception as exc:  # a world that would not start: the run's agent meets the same and reports it
            log.warning("no warm world: %s", exc)
            return None
        try:
            offset = world.log_path.stat().st_size
        except OSError:
            offset = 0
        return WorldLease(world, offset)

    def return_world(self, lease: WorldLease, run_logs: Path, healthy: bool) -> None:
        """The run's part of the world's log goes to its `logs/world.log`; the world back to the pool if healthy."""
        with contextlib.suppress(OSError):
            if lease.world.log_path.stat().st_size > lease.log_offset:  # a world at WARNING mostly logs nothing
                with lease.world.log_path.open("rb") as src:
                    src.seek(lease.log_offset)
                    part = src.read()
                run_logs.mkdir(parents=True, exist_ok=True)
                with (run_logs / "world.log").open("ab") as dst:
                    dst.write(part)
        assert self.worlds is not None
        self.worlds.release(lease.world, healthy)

    async def close(self) -> None:
        if self.worlds is not None:
            await asyncio.to_thread(self.worlds.close)
        await self.zygote.close()


class EarlyWorlds:
    """The worlds `labkube run` starts on this machine while Ray starts (importing ARE takes seconds; so does Ray),
    handed to the supervisor actors to adopt (`WorldHandoff`). They are this process's children: they exit with it
    (a world exits when its parent does), and `close()` stops and reaps them after the campaign."""

    def __init__(self, count: int, campaign_root: Path) -> None:
        self.pool: WorldPool | None = None
        self._thread: threading.Thread | None = None
        if count <= 0:
            return
        from labkube.tasks.gaia2 import WorldEnvError, world_python

        try:
            python = world_python()
        except WorldEnvError:  # the runs' agents say so in their own words
            return
        self.pool = WorldPool(
            python,
            max_idle=count,
            log_dir=campaign_root / WORLDS_FOLDER,
            log_prefix="world-early",
            key_variables=campaign_key_variables(campaign_root),
        )
        # Warming (labkube/cpu_share.py): Ray's head and the supervisors, which the first run waits for, go first.
        self._thread = threading.Thread(target=self.pool.prestart, args=(count, True), daemon=True, name="early-worlds")
        self._thread.start()

    def handoffs(self) -> list[WorldHandoff]:
        """Once they listen: what the supervisors adopt (none when the worlds could not start: they start their own
        and meet the same error). Asked for when the supervisors are up: the worlds stop warming."""
        if self.pool is not None:
            self.pool.end_warming()
        if self._thread is not None:
            self._thread.join()
        return [world.handoff() for world in self.pool.idle()] if self.pool is not None else []

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.pool is not None:
            self.pool.close()
