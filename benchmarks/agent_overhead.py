"""Harness overhead per agent step, early and late in one long run.

A zero-latency scripted model calls a trivial tool (`read_file` of a one-line
file) for 10,020 steps through the real loop: transcript, conversation log,
checkpoint and status after every step, context hand-offs as they come. The
harness time per step is read from the transcript's timestamps around step 10
and around step 10,000. Target: the late figure is at most 1.5x the early one.

Then the cost of the run's sandbox per command: the same loop calls `bash true`
for `--commands` steps, once in the local sandbox (bubblewrap, docs/sandbox.md)
and once with `--sandbox none`; the difference of the medians is what starting a
sandbox adds to each command. A third pass runs them for a `network: proxy` task,
each command behind the relay to the run's proxy (agent/sandbox_proxy.py).

    python benchmarks/agent_overhead.py [--steps 10020] [--commands 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from labkube.agent.harness.entrypoint import run_agent
from labkube.run_spec import RunSpec
from labkube.sandbox import SandboxMode
from labkube.store import write_model


def make_task(
    root: Path, steps: int, step: dict | None = None, name: str = "bench-task", network: str = "none"
) -> Path:
    task = root / name
    (task / "grading").mkdir(parents=True)
    (task / "oracle").mkdir()
    (task / "task_description.md").write_text(
        "# Bench\n\n| Method | Score ↑ |\n| :--- | ---: |\n| B | 1 |\n| Your Method | -- |\n"
    )
    (task / "grading" / "grade.sh").write_text("echo no grading\n")
    (task / "notes.txt").write_text("one line\n")
    (task / "labkube.yaml").write_text(yaml.safe_dump({"oracle": "oracle/plan.yaml", "network": network}))
    plan = {"steps": [step or {"tool": "read_file", "args": {"path": "notes.txt"}}] * steps}
    (task / "oracle" / "plan.yaml").write_text(yaml.safe_dump(plan))
    return task


def per_step_seconds(transcript: Path) -> dict[int, float]:
    stamps: dict[int, float] = {}
    with transcript.open() as fh:
        for line in fh:
            record = json.loads(line)
            if record["type"] == "model_call" and record.get("purpose") == "step":
                stamps[record["step"]] = datetime.fromisoformat(record["ts"]).timestamp()
    return {s: stamps[s + 1] - stamps[s] for s in stamps if s + 1 in stamps}


def window(durations: dict[int, float], center: int, half: int = 10) -> float:
    return statistics.median(durations[s] for s in range(center - half, center + half) if s in durations)


def command_seconds(root: Path, commands: int, sandbox: SandboxMode, network: str = "none") -> float:
    """The median seconds a step takes when each step runs `bash true`, in the run's sandbox or not."""
    name = f"{sandbox.value}-{network}"
    task = make_task(root, commands, {"tool": "bash", "args": {"command": "true"}}, f"commands-{name}", network)
    run_dir = root / f"run-{name}"
    spec = RunSpec(
        run_id="bench", campaign="bench", task=str(task), task_path=str(task), model="oracle", seed=0, sandbox=sandbox
    )
    write_model(run_dir / "run.json", spec)
    asyncio.run(run_agent(run_dir))
    return statistics.median(per_step_seconds(run_dir / "transcript.jsonl").values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_020)
    parser.add_argument("--commands", type=int, default=200, help="bash steps in and out of the sandbox")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        task = make_task(root, args.steps)
        run_dir = root / "run"
        write_model(
            run_dir / "run.json",
            RunSpec(run_id="bench", campaign="bench", task=str(task), task_path=str(task), model="oracle", seed=0),
        )
        started = time.perf_counter()
        result = asyncio.run(run_agent(run_dir))
        total = time.perf_counter() - started
        durations = per_step_seconds(run_dir / "transcript.jsonl")
        handoffs = sum(1 for line in (run_dir / "transcript.jsonl").open() if '"type": "handoff"' in line)
    late_center = min(10_000, args.steps - 15)
    early, late = window(durations, 10), window(durations, late_center)
    table = Table(title="rg-agent harness overhead per step (zero-latency model, trivial tool)")
    for col in ("around step", "median seconds/step", "ratio to step 10"):
        table.add_column(col, justify="right")
    table.add_row("10", f"{early * 1000:.2f} ms", "1.00")
    table.add_row(f"{late_center:,}", f"{late * 1000:.2f} ms", f"{late / early:.2f}")
    console = Console()
    console.print(table)
    console.print(
        f"{result.spend.steps:,} steps in {total:.1f} s ({total / result.spend.steps * 1000:.2f} ms/step "
        f"overall), {handoffs} context hand-offs; target: ratio <= 1.5 -> "
        f"{'met' if late / early <= 1.5 else 'NOT met'}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        sandboxed = command_seconds(Path(tmp), args.commands, SandboxMode.bwrap)
        bare = command_seconds(Path(tmp), args.commands, SandboxMode.none)
        proxied = command_seconds(Path(tmp), args.commands, SandboxMode.bwrap, "proxy")
    sandbox_table = Table(title=f"a `bash true` step, median of {args.commands}")
    for col in ("agent's commands", "median seconds/step", "sandbox start per command"):
        sandbox_table.add_column(col, justify="right")
    sandbox_table.add_row("unsandboxed (--sandbox none)", f"{bare * 1000:.2f} ms", "")
    sandbox_table.add_row(
        "in the run's sandbox (bwrap)", f"{sandboxed * 1000:.2f} ms", f"{(sandboxed - bare) * 1000:.2f} ms"
    )
    sandbox_table.add_row(
        "in the sandbox, behind the proxy's relay (network: proxy)",
        f"{proxied * 1000:.2f} ms",
        f"{(proxied - bare) * 1000:.2f} ms",
    )
    console.print(sandbox_table)


if __name__ == "__main__":
    main()
