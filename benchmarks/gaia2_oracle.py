"""Gaia2 oracle throughput: ARE's own runner against `labkube run`, same scenarios, seeds and concurrency.

One invocation runs both on labkube's bundled Gaia2 scenarios, each as its user runs it:

- `are-benchmark run -d DIR -o --num_runs SEEDS --max_concurrent_scenarios C` in ARE's virtualenv (one process;
  it wants `DIR/<capability>/*.json`, so the scenarios are laid out that way in a temporary folder);
- `labkube run gaia2 --model oracle --seeds SEEDS --concurrency C` (the CLI: Ray, supervisors, worlds, agents,
  the judge on every oracle trace, the audit, results on disk).

Printed: runs, wall seconds (the command's, start to exit) and scenarios per minute for each, their ratio, each
side's time once started (ARE from its first log line, after its imports; labkube from its first run's start to
its last result) and whether every verdict agrees (per scenario, the number of passing runs). ARE's oracle mode
does not judge; labkube's judges every oracle trace with ARE's GraphPerEventJudge, and the benchmark checks it did.

    python benchmarks/gaia2_oracle.py [--seeds 4 [20 ...]] [--concurrency 2] [--repeat 5] [--write-docs]

With `--repeat K`, each size runs K rounds, each side once a round and who goes first alternating, so a load that
comes and goes on a shared machine falls on both sides alike: the table shows each figure's median over the
rounds, and the ratio is the median of the rounds' own ratios (each printed), not a ratio of medians.

labkube's modules are compiled first, as `pip install .` leaves them (`as_installed.py`); ARE's virtualenv is
compiled by its installer.

`--write-docs` replaces the table in docs/gaia2-world-protocol.md (`<!-- benchmark:gaia2_oracle -->`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from as_installed import compile_labkube
from docs_block import REPO, markdown_table, write_block
from rich.console import Console
from rich.table import Table

from labkube.agent.containment import become_subreaper
from labkube.tasks.gaia2 import load_scenario, resolve_scenarios, setup_world_env

ARE_RESULT = re.compile(r"\[Scenario = (\S+), Run = (\d+)\] .*Result: ScenarioValidationResult\(success=(True|False)")
ARE_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)
console = Console(width=140)


@dataclass
class Side:
    name: str
    runs: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # user + system, of the command and every process below it
    started_s: float | None = None  # from the first run's start (after imports and start-up) to the last result
    passed: Counter[str] = field(default_factory=Counter)  # scenario id -> passing runs
    judged: int = 0
    error: str = ""

    @property
    def rate(self) -> float:
        return 60 * self.runs / self.wall_s if self.wall_s else 0.0


def layout(dest: Path) -> list[str]:
    """The bundled scenarios as `dest/<capability>/<name>.json`; their scenario ids."""
    ids = []
    for scenario in resolve_scenarios("gaia2"):
        path = Path(load_scenario(scenario.ref).source)
        capability = scenario.capabilities[0] if scenario.capabilities else "execution"
        (dest / capability).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / capability / path.name)
        ids.append(scenario.scenario_id)
    return ids


def timed(cmd: list[str], env: dict[str, str], limit_s: float, log: Path) -> tuple[float, float, int]:
    """Run `cmd` in its own process group, output to `log`; (wall seconds, CPU seconds, exit code). Killed past
    `limit_s`. The CPU is the command's and its descendants' (this process is their subreaper, so what they leave
    behind comes back here to be reaped and counted)."""
    become_subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd="/tmp")
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    wall = time.monotonic() - started
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # what outlived the command, once it has ended
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, code


def run_are(venv: Path, dataset: Path, seeds: int, concurrency: int, work: Path, limit_s: float) -> Side:
    side = Side("ARE `are-benchmark run -o` (one process)")
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(venv / "bin" / "are-benchmark"), "run", "-d", str(dataset), "-o", "--num_runs", str(seeds)]
    cmd += ["--max_concurrent_scenarios", str(concurrency), "--output_dir", str(work / "are-out")]
    log = work / "are.log"
    side.wall_s, side.cpu_s, code = timed(cmd, env, limit_s, log)
    text = log.read_text(errors="replace")
    seen: dict[tuple[str, str], bool] = {}
    for scenario, run, success in ARE_RESULT.findall(text):
        seen[(scenario, run)] = success == "True"
    side.runs = len(seen)
    for (scenario, _), ok in seen.items():
        side.passed[scenario] += ok
    stamps = [datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in ARE_TIME.findall(text)]
    if len(stamps) >= 2:
        side.started_s = (stamps[-1] - stamps[0]).total_seconds()
    if code != 0:
        side.error = f"are-benchmark exited {code}; see {log}"
    return side


def run_labkube(seeds: int, concurrency: int, work: Path, limit_s: float) -> Side:
    side = Side("labkube `run gaia2 --model oracle`")
    out = work / "labkube-campaign"
    cmd = [sys.executable, "-P", "-m", "labkube", "run", "gaia2", "--model", "oracle"]
    cmd += ["--seeds", str(seeds), "--concurrency", str(concurrency), "--out", str(out)]
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    log = work / "labkube.log"
    side.wall_s, side.cpu_s, code = timed(cmd, env, limit_s, log)
    starts, ends = [], []
    for result_json in sorted(out.glob("runs/*/result.json")):
        result = json.loads(result_json.read_text())
        verdict = (result.get("details") or {}).get("gaia2") or {}
        side.runs += 1
        side.passed[verdict.get("scenario_id", result["task"])] += bool(verdict.get("success"))
        checks = verdict.get("checks") or []
        side.judged += checks[:1] == ["oracle_run"] and len(checks) > 1  # the oracle trace went through the judge
        if result.get("started_at") and result.get("finished_at"):
            starts.append(datetime.fromisoformat(result["started_at"].replace("Z", "+00:00")))
            ends.append(datetime.fromisoformat(result["finished_at"].replace("Z", "+00:00")))
    if starts:
        side.started_s = (max(ends) - min(starts)).total_seconds()
    if code != 0:
        side.error = f"labkube run exited {code}; see {log}"
    return side


def one_round(
    venv: Path, seeds: int, concurrency: int, limit_s: float, are_first: bool
) -> tuple[Side, Side, list[str]]:
    """ARE's runner and `labkube run` once each on the same scenarios, one after the other in the order given."""
    with tempfile.TemporaryDirectory(prefix="gaia2-oracle-") as tmp:
        work = Path(tmp)
        ids = layout(work / "dataset")
        sides: dict[str, Side] = {}
        for which in ("are", "labkube") if are_first else ("labkube", "are"):
            if which == "are":
                sides[which] = run_are(venv, work / "dataset", seeds, concurrency, work, limit_s)
            else:
                sides[which] = run_labkube(seeds, concurrency, work, limit_s)
            if sides[which].error:
                console.print(f"[red]{sides[which].name}: {sides[which].error}[/]")
                console.print((work / f"{which}.log").read_text()[-3000:])
    return sides["are"], sides["labkube"], ids


def median_side(rounds: list[Side]) -> Side:
    """One row for a side's rounds: the median of each figure (the rounds' counts are equal where verdicts agree)."""
    last = rounds[-1]
    started = [r.started_s for r in rounds if r.started_s is not None]
    return Side(
        last.name,
        runs=last.runs,
        wall_s=statistics.median(r.wall_s for r in rounds),
        cpu_s=statistics.median(r.cpu_s for r in rounds),
        started_s=statistics.median(started) if len(started) == len(rounds) else None,
        passed=last.passed,
        judged=last.judged,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[4], help="runs of every scenario (ARE's --num_runs); several sizes"
    )
    parser.add_argument("--concurrency", type=int, default=2, help="runs at once on each side")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of each size, each side once a round, who goes first alternating"
    )
    parser.add_argument("--limit", type=float, default=600.0, help="seconds before either command is killed")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/gaia2-world-protocol.md")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "gaia2-world-protocol.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    venv = setup_world_env()
    compile_labkube()
    header = ("runner", "runs", "wall s", "scenarios/min", "once started s", "CPU s", "passed", "judged")
    rows, ratios, failed = [], [], False
    for seeds in args.seeds:
        are_rounds: list[Side] = []
        lk_rounds: list[Side] = []
        round_ratios: list[float] = []
        agree = True
        for n in range(args.repeat):
            are, lk, ids = one_round(venv, seeds, args.concurrency, args.limit, are_first=n % 2 == 0)
            expected = len(ids) * seeds
            agreed = are.runs == lk.runs == expected and all(are.passed[i] == lk.passed[i] for i in ids)
            agree &= agreed
            failed |= not agreed or bool(are.error or lk.error)
            are_rounds.append(are)
            lk_rounds.append(lk)
            round_ratios.append(lk.rate / are.rate if are.rate else float("nan"))
            console.print(
                f"{expected} runs, round {n + 1} of {args.repeat}: ARE {are.wall_s:.2f} s, labkube {lk.wall_s:.2f} s, "
                f"ratio {round_ratios[-1]:.2f}; verdicts agree: {'yes' if agreed else 'no'} (passing runs per "
                f"scenario: ARE {dict(are.passed)}, labkube {dict(lk.passed)})"
            )
        are, lk = median_side(are_rounds), median_side(lk_rounds)
        for side in (are, lk):
            rows.append(
                (
                    side.name,
                    str(side.runs),
                    f"{side.wall_s:.1f}",
                    f"{side.rate:.0f}",
                    "unknown" if side.started_s is None else f"{side.started_s:.1f}",
                    f"{side.cpu_s:.1f}",
                    str(sum(side.passed.values())),
                    "no (oracle mode skips the judge)" if side is are else f"{side.judged}/{side.runs}",
                )
            )
        ratio = statistics.median(round_ratios)
        spread = (
            f" (median of {args.repeat} rounds, each side once a round; rounds "
            + ", ".join(f"{r:.2f}" for r in round_ratios)
            + ")"
            if args.repeat > 1
            else ""
        )
        ratios.append(
            f"{expected} runs ({len(ids)} scenarios x {seeds} seeds): labkube / ARE scenarios per minute "
            f"{ratio:.2f}{spread}, every verdict agrees: {'yes' if agree else 'no'}"
        )
        console.print(ratios[-1])
    sizes = "/".join(map(str, args.seeds))
    rounds = f", median of {args.repeat} rounds" if args.repeat > 1 else ""
    title = f"Gaia2 oracle, {len(ids)} bundled scenarios x {sizes} seeds, concurrency {args.concurrency}{rounds}"
    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if args.write_docs:
        sizes = " ".join(map(str, args.seeds))
        command = f"python benchmarks/gaia2_oracle.py --seeds {sizes} --concurrency {args.concurrency}"
        command += f" --repeat {args.repeat}" if args.repeat > 1 else ""
        body = markdown_table(header, rows, [False] + [True] * 7)
        body += "\n\n" + "\n".join(f"- {line}." for line in ratios)
        write_block(args.doc, "gaia2_oracle", body, command)
        console.print(f"written: {args.doc}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
