"""GAIA campaign throughput with scripted answers: what labkube costs per run when the agent costs nothing.

A synthetic GAIA dataset the size of the validation split (165 questions, metadata.jsonl in GAIA's layout, a
fifth of them with an attachment) runs as `labkube run DATASET --model oracle --seeds 3 --concurrency 4`: the
oracle answers each question with its annotated answer in one scripted step, so everything measured is labkube's
own per-run work (sandbox, agent start, grading, audit, results). Run twice: with the warm workers (the agent
forked from a zygote per supervisor) and without them (`LABKUBE_WARM_WORKERS=0`: a fresh `labkube agent`
interpreter per run, as before issue #26).

Printed per mode: runs, wall seconds (the command's, start to exit: Ray's start-up included), runs per minute,
the time once started (first run's start to last result) and the per-run overhead: that time times the
concurrency over the runs, the slot-seconds each run held.

    python benchmarks/gaia_scripted.py [--questions 165] [--seeds 3] [--concurrency 4] [--write-docs]

labkube's modules are compiled first, as `pip install .` leaves them (`as_installed.py`).

`--write-docs` replaces the table in README.md (`<!-- benchmark:gaia_scripted -->`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from as_installed import compile_labkube
from docs_block import REPO, markdown_table, write_block
from rich.console import Console
from rich.table import Table


@dataclass
class Measured:
    mode: str
    runs: int
    correct: int
    wall_s: float
    started_s: float | None
    concurrency: int

    @property
    def per_run_ms(self) -> float | None:
        return None if self.started_s is None or not self.runs else 1000 * self.started_s * self.concurrency / self.runs


def make_dataset(dest: Path, questions: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(questions):
        row = {"task_id": f"synthetic-{i:03d}", "Question": f"What is {i} plus {i}?", "Level": 1 + i % 3}
        row |= {"Final answer": str(2 * i), "file_name": ""}
        if i % 5 == 0:
            row["file_name"] = f"attachment-{i:03d}.txt"
            (dest / row["file_name"]).write_text(f"{i}\n{i}\n")
        rows.append(row)
    (dest / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def measure(mode: str, dataset: Path, seeds: int, concurrency: int, out: Path, warm: bool) -> Measured:
    cmd = [sys.executable, "-P", "-m", "labkube", "run", str(dataset), "--model", "oracle", "--seeds", str(seeds)]
    cmd += ["--concurrency", str(concurrency), "--out", str(out), "--name", "gaia-scripted"]
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    env["LABKUBE_WARM_WORKERS"] = "1" if warm else "0"
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/tmp")
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"labkube run exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    runs = correct = 0
    starts, ends = [], []
    for path in out.glob("runs/*/result.json"):
        result = json.loads(path.read_text())
        runs += 1
        correct += result.get("score") == 1.0
        starts.append(datetime.fromisoformat(result["started_at"].replace("Z", "+00:00")))
        ends.append(datetime.fromisoformat(result["finished_at"].replace("Z", "+00:00")))
    started_s = (max(ends) - min(starts)).total_seconds() if starts else None
    return Measured(mode, runs, correct, wall, started_s, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=165)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--write-docs", action="store_true", help="put the table into README.md")
    parser.add_argument("--doc", type=Path, default=REPO / "README.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    compile_labkube()  # as `pip install .` leaves labkube (as_installed.py)
    rows = []
    header = ("agent start", "runs", "correct", "wall s", "runs/min", "once started s", "per-run overhead ms")
    with tempfile.TemporaryDirectory(prefix="gaia-scripted-") as tmp:
        dataset = Path(tmp) / "gaia-synthetic"
        make_dataset(dataset, args.questions)
        for mode, warm in (("fresh interpreter per run", False), ("forked from the warm zygote", True)):
            m = measure(mode, dataset, args.seeds, args.concurrency, Path(tmp) / f"campaign-{int(warm)}", warm)
            rows.append(
                (
                    mode,
                    str(m.runs),
                    str(m.correct),
                    f"{m.wall_s:.1f}",
                    f"{60 * m.runs / m.wall_s:.0f}",
                    "unknown" if m.started_s is None else f"{m.started_s:.1f}",
                    "unknown" if m.per_run_ms is None else f"{m.per_run_ms:.0f}",
                )
            )
    title = f"GAIA, {args.questions} questions x {args.seeds} seeds, scripted answers, concurrency {args.concurrency}"
    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=140).print(table)
    if args.write_docs:
        command = f"python benchmarks/gaia_scripted.py --questions {args.questions} --seeds {args.seeds}"
        command += f" --concurrency {args.concurrency}"
        write_block(args.doc, "gaia_scripted", markdown_table(header, rows, [False] + [True] * 6), command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
