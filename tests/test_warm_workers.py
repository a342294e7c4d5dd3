"""What a supervisor worker keeps warm (issue #26 items 1-2): pooled Gaia2 worlds and the agent zygote.

Real parts throughout: ARE world processes, the supervisor (`supervise_run`, as a Ray actor runs it) with its
`WarmWorker`, the zygote process and the `labkube agent` it forks, scripted models.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from labkube.campaign import CampaignSpec
from labkube.operator.supervisor import supervise_run
from labkube.operator.warm import EarlyWorlds, WarmWorker
from labkube.run_spec import RunSpec, make_run_id
from labkube.store import CampaignDir, write_model
from labkube.task_card import TaskFamily
from labkube.tasks import resolve_tasks
from labkube.tasks.gaia2 import WorldPool, WorldProcess, load_scenario
from labkube.tasks.gaia2.world_process import AdoptedWorld, start_world

pytestmark = pytest.mark.gaia2


def source(name: str) -> str:
    return load_scenario(f"gaia2/{name}").source


async def oracle_state(client, name: str, seed: int) -> dict:
    await client.load_scenario(source(name), seed=seed, oracle=True)
    verdict = await client.run_oracle()
    assert verdict.success, verdict.rationale
    return await client.state()


async def test_a_warm_world_serves_the_next_scenario_as_a_fresh_world_would(are_python: Path) -> None:
    """Scenario A then B in one world process: B's apps and event log equal B's in a fresh process."""
    with WorldPool(are_python, max_idle=1) as pool:
        with pool.world() as warm:
            async with warm.client() as client:
                a = await oracle_state(client, "adaptability_lunch_reschedule", seed=3)
                after_a = await oracle_state(client, "execution_budget_email", seed=1)
        with pool.world() as again:
            assert again is warm and pool.started == 1  # a healthy world goes back to the pool
    with WorldPool(are_python, max_idle=1) as other, other.world() as fresh:
        async with fresh.client() as client:
            alone = await oracle_state(client, "execution_budget_email", seed=1)
    assert after_a["event_log"]["past_events"] and after_a["apps"]
    assert alike(comparable(after_a), comparable(alone))
    assert not alike(comparable(a), comparable(alone))  # the dumps tell scenarios apart: the check above could fail


ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{32}\b")


def comparable(dump: dict) -> object:
    """A state dump without what differs between two fresh worlds too: ARE's random ids (uuid4; each becomes its
    order of first appearance, so what refers to what is kept). Simulated times differ by wall jitter: `alike`."""
    ids: dict[str, str] = {}

    def walk(value: object) -> object:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return ID.sub(lambda m: ids.setdefault(m.group(0), f"<id {len(ids)}>"), value)
        return value

    return walk(dump)


STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")


def alike(x: object, y: object, jitter_s: float = 2.0) -> bool:
    """Equal, except that simulated times (numbers, and date-time strings) may differ by the wall-clock jitter of a
    world's clock (under load, a second or so; rounding both to a grid fails whenever they straddle a step)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(alike(x[k], y[k], jitter_s) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(alike(a, b, jitter_s) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, int | float) and isinstance(y, int | float) and abs(x - y) <= jitter_s
    if isinstance(x, str) and isinstance(y, str) and STAMP.fullmatch(x) and STAMP.fullmatch(y):
        from datetime import datetime

        return abs((datetime.fromisoformat(x) - datetime.fromisoformat(y)).total_seconds()) <= jitter_s
    return x == y


def gaia2_run(root: Path, scenario: str, seed: int = 0) -> Path:
    (card,) = resolve_tasks(scenario)
    run = RunSpec(
        run_id=make_run_id(card.ref, "oracle", seed),
        campaign="warm",
        task=card.ref,
        task_path=card.path,
        model="oracle",
        seed=seed,
        family=TaskFamily.gaia2,
    )
    run_dir = root / "runs" / run.run_id
    write_model(run_dir / "run.json", run)
    return run_dir


async def test_pooled_worlds_are_reused_and_one_that_failed_a_load_is_replaced(are_python: Path, tmp_path) -> None:
    broken = tmp_path / "broken.json"
    scenario = json.loads(Path(source("time_door_code")).read_text())
    scenario["apps"][-1]["class_name"] = "NoSuchAppClass"  # ARE's importer refuses it: the load fails (422)
    broken.write_text(json.dumps(scenario))
    warm = WarmWorker()
    await warm.warm_up(1, tmp_path, worlds=1, fork_agents=True)
    try:
        pool = warm.worlds
        assert pool is not None and pool.started == 1
        first = await supervise_run(str(gaia2_run(tmp_path, "gaia2/time_door_code")), warm=warm)
        second = await supervise_run(str(gaia2_run(tmp_path, "gaia2/search_pediatrician_message")), warm=warm)
        assert first.score == 1.0 and second.score == 1.0
        assert pool.started == 1, "the second run reused the first run's world"
        failed = await supervise_run(str(gaia2_run(tmp_path, str(broken))), warm=warm)
        assert failed.stop_reason is not None and failed.stop_reason.value == "world_error", failed.error
        after = await supervise_run(str(gaia2_run(tmp_path, "gaia2/time_door_code", seed=1)), warm=warm)
        assert after.score == 1.0
        assert pool.started == 2, "the world whose scenario failed to load was replaced"
        run_log = tmp_path / "runs" / after.run_id / "logs" / "world.log"
        assert run_log.exists(), "the run's part of the world log is in its own logs"
    finally:
        await warm.close()


def test_a_world_adopted_from_another_process_is_watched_and_stopped_as_its_own(are_python: Path) -> None:
    """The driver starts worlds while Ray starts and the supervisor adopts them: the adopting pool is not their
    parent, so a killed world stays a zombie until its parent reaps it. Here this test process is the parent (it
    does not reap until the end) and a second pool adopts: the zombie must count as dead, and a pid that names
    another process (a stale start time) must too."""
    with WorldPool(are_python, max_idle=2) as parent:
        parent.prestart(2)
        first, second = parent.idle()
        stale = second.handoff().model_copy(update={"started_ticks": second.handoff().started_ticks + 1})
        with WorldPool(are_python, max_idle=1) as adopting:
            assert adopting.adopt([stale, first.handoff()]) == 1
            assert second.alive(), "a pid whose start time differs names another process: neither taken nor killed"
            (adopted,) = adopting.idle()
            assert adopted.pid == first.pid and adopted.alive()
            with adopting.world() as lent:
                assert lent is adopted  # lent as its own; its parent still holds it
            adopted.stop()
            os.waitid(os.P_PID, first.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, left unreaped: a zombie
            assert not adopted.alive() and first.proc.poll() is not None
            assert adopting.adopt([second.handoff()]) == 1 and second.alive()
            assert WorldPool(are_python, max_idle=1).adopt([first.handoff()]) == 0, "a dead world is not adopted"
        assert adopting.started == 0, "the adopting pool started no world of its own"


async def test_worlds_forked_from_one_import_of_are_are_independent_worlds(are_python: Path, tmp_path: Path) -> None:
    """prestart(3) imports ARE once and forks two copies: three processes, ports, process groups and logs; each
    serves its own scenario; stopping the first (the copies' parent) leaves the copies serving."""
    with WorldPool(are_python, max_idle=3, log_dir=tmp_path) as pool:
        pool.prestart(3)
        worlds = pool.idle()
        assert pool.started == 3 and len(worlds) == 3
        assert len({w.pid for w in worlds}) == 3 and len({w.port for w in worlds}) == 3
        assert len({os.getpgid(w.pid) for w in worlds}) == 3 and len({w.log_path for w in worlds}) == 3
        names = ["time_door_code", "execution_budget_email", "search_pediatrician_message"]
        states = []
        for world, name in zip(worlds, names, strict=True):
            async with world.client() as client:
                states.append(comparable(await oracle_state(client, name, seed=0)))
        assert len({json.dumps(s, sort_keys=True) for s in states}) == 3, "each world served its own scenario"
        first = next(w for w in worlds if isinstance(w, WorldProcess) and not isinstance(w, AdoptedWorld))
        first.stop()
        for copy in (w for w in worlds if w is not first):
            assert copy.alive()
            async with copy.client() as client:
                assert (await oracle_state(client, "time_door_code", seed=0))["apps"]  # its oracle passes there
        assert all(p.stat().st_size > 0 for p in tmp_path.glob("world-*.log")), "each world logs to its own file"


def test_worlds_keep_their_temporary_files_in_a_directory_removed_once_they_are_stopped(are_python: Path) -> None:
    """ARE makes a sandbox directory in the temporary directory when it is imported and never removes it: a world's
    TMPDIR is its pool's (the copies forked from one import share ARE's), removed when the pool closes, or, for a
    world started alone, its own, removed when it stops."""
    with WorldPool(are_python, max_idle=2) as pool:
        pool.prestart(2)
        worlds = pool.idle()
        temps = set()
        for world in worlds:
            environ = Path(f"/proc/{world.pid}/environ").read_bytes().split(b"\0")
            temps.update(Path(e.split(b"=", 1)[1].decode()) for e in environ if e.startswith(b"TMPDIR="))
        (temp,) = temps
        assert [p.name for p in temp.iterdir() if p.name.startswith("are_simulation_sandbox_")], "ARE's is in it"
        worlds[0].stop()
        assert temp.is_dir(), "a world's copies still use it"
    assert not temp.exists()
    alone = start_world(are_python)
    assert alone.temp_dir is not None and any(alone.temp_dir.iterdir())
    alone.stop()
    assert not alone.temp_dir.exists()


def test_a_world_holds_no_api_key_of_the_process_that_starts_it(
    are_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys reach a world in its requests' LLM specs, never its environment, which a shell of the same user reads."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-worlds")
    monkeypatch.setenv("LABKUBE_WORLD_TEST_MARK", "kept")
    with WorldPool(are_python, max_idle=2) as pool:
        pool.prestart(2)
        for world in pool.idle():
            environ = Path(f"/proc/{world.pid}/environ").read_bytes().split(b"\0")
            assert b"LABKUBE_WORLD_TEST_MARK=kept" in environ  # the rest of the environment is passed on
            assert not any(entry.startswith(b"OPENAI_API_KEY=") for entry in environ), world


def test_a_campaigns_worlds_hold_none_of_the_keys_it_names(
    are_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A campaign may name its models' keys anything (`api_key_env`); the worlds its runs share (those `labkube run`
    starts early, and a supervisor's pool) are started without those variables either."""
    monkeypatch.setenv("TEAM_LLM_SECRET", "sk-test-custom-name")
    monkeypatch.setenv("LABKUBE_WORLD_TEST_MARK", "kept")
    spec = CampaignSpec(
        name="keys", tasks=["gaia2/time_door_code"], models=["oracle"], api_key_env={"gpt-5": "TEAM_LLM_SECRET"}
    )
    CampaignDir(tmp_path).write_campaign(spec, [])
    early = EarlyWorlds(1, tmp_path)
    warm = WarmWorker()
    try:
        handed = early.handoffs()
        pool = warm._pool(tmp_path)
        assert pool is not None
        pool.prestart(1)
        pids = [h.pid for h in handed] + [w.pid for w in pool.idle()]
        assert len(pids) == 2
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"LABKUBE_WORLD_TEST_MARK=kept" in environ
            assert not any(entry.startswith(b"TEAM_LLM_SECRET=") for entry in environ), pid
    finally:
        early.close()
        asyncio.run(warm.close())


def test_forked_worlds_end_with_the_process_that_started_them(are_python: Path, tmp_path: Path) -> None:
    """The copies' parent is the first world, not the starter: they watch the starter itself, and a starter
    SIGKILLed takes every world with it."""
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from labkube.tasks.gaia2 import WorldPool\n"
        f"pool = WorldPool(Path({str(are_python)!r}), max_idle=2)\n"
        "pool.prestart(2)\n"
        "print(' '.join(str(w.pid) for w in pool.idle()), flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in starter.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 30
    while any(
        Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[1][:3] for p in pids
    ):
        assert time.monotonic() < deadline, f"worlds outlived their starter: {pids}"
        time.sleep(0.2)


def test_labkube_run_starts_its_worlds_while_ray_starts_and_stops_them(tmp_path: Path) -> None:
    """`labkube run` on Gaia2: the campaign's worlds are the driver's, started before Ray and adopted by the
    supervisor (which starts none of its own); every run's world log comes from them; none outlives the command."""
    from cli_helpers import labkube

    out = tmp_path / "camp"
    refs = ["gaia2/time_door_code", "gaia2/execution_budget_email"]
    temp = Path(tempfile.mkdtemp(prefix="lk-"))  # the command's TMPDIR; Ray keeps its own (RAY_TMPDIR)
    try:
        env = {"TMPDIR": str(temp), "RAY_TMPDIR": tempfile.gettempdir()}
        run = ["run", *refs, "--model", "oracle", "--concurrency", "2", "--out", str(out)]
        proc = labkube(*run, cwd=tmp_path, env=env)
        left = sorted(p.name for p in temp.iterdir())
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ARE makes a sandbox directory when it is imported (and one per scenario with files), and never removes them.
    assert not [n for n in left if n.startswith(("are_simulation", "labkube-world"))], left
    logs = sorted(p.name for p in (out / "worlds").iterdir())
    assert logs == ["world-early-1.log", "world-early-2.log"], logs
    results = [json.loads(p.read_text()) for p in (out / "runs").glob("*/result.json")]
    assert len(results) == 2 and all(r["score"] == 1.0 for r in results)
    assert all((p / "logs" / "world.log").stat().st_size > 0 for p in (out / "runs").iterdir())
    holders = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith(str(out / "worlds")):
                holders.append(fd)
    assert holders == [], f"world processes outlived the command: {holders}"


def gaia_question(root: Path, task_id: str, commands: list[str], answer: str, sandbox: str = "bwrap") -> Path:
    """A GAIA run whose scripted model runs `commands` in bash, then answers. `sandbox="none"` for commands that
    reach the agent process itself (`$PPID`): from the run's sandbox they cannot (docs/sandbox.md)."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = [{"task_id": t, "Question": "What is 2+2?", "Level": 1, "Final answer": "4", "file_name": ""} for t in "ab"]
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (card,) = resolve_tasks(f"{data}#{task_id}")
    calls = [{"name": "bash", "arguments": {"command": c}} for c in commands]
    calls.append({"name": "end_task", "arguments": {"summary": f"FINAL ANSWER: {answer}"}})
    plan = root / f"{task_id}.jsonl"
    plan.write_text("".join(json.dumps({"type": "model_call", "message": {"tool_calls": [c]}}) + "\n" for c in calls))
    model = f"replay:{plan}"
    run = RunSpec(
        run_id=make_run_id(card.ref, model, 0),
        campaign="warm",
        task=card.ref,
        task_path=card.path,
        task_id=task_id,
        model=model,
        seed=0,
        family=TaskFamily.gaia,
        sandbox=sandbox,
    )
    run_dir = root / "runs" / run.run_id
    write_model(run_dir / "run.json", run)
    return run_dir


async def test_a_forked_agent_that_crashes_ends_only_its_own_run(tmp_path: Path) -> None:
    """Two runs forked from one zygote at once: one agent is killed (SIGKILL, by its own command) on every attempt;
    the other finishes, the zygote lives on and serves the next run."""
    warm = WarmWorker()
    await warm.warm_up(2, tmp_path, worlds=0, fork_agents=True)
    try:
        zygote = warm.zygote.pid
        assert zygote is not None
        crash = gaia_question(tmp_path / "crash", "a", ["kill -9 $PPID"], "4", sandbox="none")
        calm = gaia_question(tmp_path / "calm", "b", ["sleep 1", "echo $PPID > agent.pid"], "4", sandbox="none")
        crashed, finished = await asyncio.gather(
            supervise_run(str(crash), warm=warm), supervise_run(str(calm), warm=warm)
        )
        stderr = (crash / "logs" / "agent.stderr").read_text(errors="replace")[-2000:]
        assert crashed.stop_reason is not None and crashed.stop_reason.value == "killed", (crashed.error, stderr)
        assert finished.score == 1.0 and finished.status.value == "Finished"
        agent_pid = int((calm / "workspace" / "agent.pid").read_text())
        assert agent_pid not in (os.getpid(), zygote), "the agent was a process of its own"
        assert warm.zygote.pid == zygote, "the zygote survived the crash"
        again = await supervise_run(str(gaia_question(tmp_path / "again", "b", [], "4")), warm=warm)
        assert again.score == 1.0 and warm.zygote.pid == zygote
    finally:
        await warm.close()


async def test_a_forked_agent_writes_its_series_where_the_campaign_reads_them(tmp_path: Path) -> None:
    """The zygote imported prometheus_client before any run's environment named a metrics directory: the child
    still writes its series to the campaign's (LABKUBE_METRICS_DIR), where the driver's /metrics reads them."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    warm = WarmWorker()
    await warm.warm_up(1, tmp_path, worlds=0, fork_agents=True)
    metrics = tmp_path / "metrics"
    try:
        run_dir = gaia_question(tmp_path, "a", [], "4")
        result = await supervise_run(str(run_dir), env={"LABKUBE_METRICS_DIR": str(metrics)}, warm=warm)
    finally:
        await warm.close()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics))
    finished = [s for m in registry.collect() if m.name == "labkube_run_finished" for s in m.samples]
    assert [(s.labels["run_id"], s.value) for s in finished] == [(result.run_id, 1.0)]


def test_what_a_forked_agent_leaves_running_ends_with_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked agent is contained as a started one is: its escaped processes (setsid, a double fork, an async
    job's escapee) are gone when the run ends on its wall budget (tests/test_run_processes.py's checks, on the
    containment under the sandbox: unsandboxed, as there)."""
    from test_run_processes import ESCAPES, WAIT, alive, assert_nothing_left, started_pids
    from tinytask import make_run_dir, make_tiny_task

    from labkube.agent.containment import MODE_VARIABLE
    from labkube.budgets import Budgets

    monkeypatch.setenv(MODE_VARIABLE, "processes")
    task = make_tiny_task(tmp_path, [*ESCAPES, *WAIT])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=6 / 3600), sandbox="none")
    pids: dict[str, int] = {}

    async def run() -> str:
        warm = WarmWorker()
        await warm.warm_up(1, tmp_path, worlds=0, fork_agents=True)
        try:
            supervising = asyncio.create_task(supervise_run(str(run_dir), warm=warm))
            pids.update(await asyncio.to_thread(started_pids, run_dir / "workspace"))
            assert all(alive(p) for p in pids.values()), "the processes ran while the run did"
            stop_reason = (await supervising).stop_reason
            assert warm.zygote.pid is not None, "the run was forked from the zygote"
            return stop_reason
        finally:
            await warm.close()

    assert asyncio.run(run()) == "time"
    assert_nothing_left(run_dir, pids)
