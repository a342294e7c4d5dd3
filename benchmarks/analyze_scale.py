"""`labkube analyze` at scale: time and peak memory for many runs with long transcripts.

Synthetic runs (tests/analyze_synth.py: the real store layout and models) with N steps each, every tool output
padded to about 2 kB, are analysed with `analyze_campaigns`; peak memory is Python's (tracemalloc) over the
analysis. Target: peak memory flat in transcript length (transcripts are read one line at a time), time linear
in the total transcript size.

    python benchmarks/analyze_scale.py [--runs 50] [--steps 500,2000,8000] [--many 400] [--write-docs]

`--write-docs` replaces the table in docs/analyze.md (`<!-- benchmark:analyze_scale -->`) with this run's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analyze_synth import (
    MODELS,
    Planted,
    paper_result,
    plant_campaign,
    transcript_lines,
    write_run,
)
from docs_block import REPO, markdown_table, write_block

from labkube.results.analysis import analyze_campaigns
from labkube.store import CampaignDir

PAD = "x" * 2000


def write_campaign(root: Path, runs: int, steps: int) -> int:
    """`runs` runs of `steps` steps each; returns the bytes of transcript written."""
    cdir = CampaignDir(root)
    planted = [
        Planted(f"bench--s{i}", MODELS[i % 2], i, steps, 3600.0, score=0.1 + 0.8 * (i % 7) / 7) for i in range(runs)
    ]
    specs = plant_campaign(cdir, "bench", planted, seeds=runs)
    total = 0
    for p, s in zip(planted, specs, strict=True):
        events = transcript_lines(p)
        for e in events:
            if e["type"] == "tool_call":
                e["output"] += "\n" + PAD
        write_run(cdir, s, paper_result(p), events)
        total += (cdir.run_dir(p.run_id) / "transcript.jsonl").stat().st_size
    return total


def measure(runs: int, steps: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        size = write_campaign(Path(tmp) / "c", runs, steps)
        tracemalloc.start()
        started = time.perf_counter()
        analysis = analyze_campaigns([Path(tmp) / "c"])
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert analysis.runs == runs
        json.dumps(analysis.model_dump(mode="json"))
    return size / 1e6, seconds, peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", default="500,2000,8000")
    parser.add_argument("--many", type=int, default=400, help="a second sweep: this many runs of the shortest length")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/analyze.md")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "analyze.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(s) for s in args.steps.split(",")]
    header = ("runs", "steps per run", "transcripts (MB)", "seconds", "MB/s", "peak memory (MB)")
    table = Table(title="labkube analyze: time and peak memory", title_justify="left")
    for col in header:
        table.add_column(col, justify="right")
    configs = [(args.runs, n) for n in lengths] + ([(args.many, lengths[0])] if args.many else [])
    rows = []
    for runs, steps in configs:
        mb, seconds, peak = measure(runs, steps)
        rows.append((str(runs), f"{steps:,}", f"{mb:,.0f}", f"{seconds:.2f}", f"{mb / seconds:,.0f}", f"{peak:.1f}"))
        table.add_row(*rows[-1])
    Console().print(table)
    if args.write_docs:
        command = f"python benchmarks/analyze_scale.py --runs {args.runs} --steps {args.steps} --many {args.many}"
        write_block(args.doc, "analyze_scale", markdown_table(header, rows, [True] * len(header)), command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
