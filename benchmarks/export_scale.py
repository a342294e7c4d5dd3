"""`labkube export` at scale: time and peak memory for runs with long transcripts.

Synthetic paper-task runs (tests/analyze_synth.py: the real store layout and models) with N steps each, every
tool output padded to about 2 kB, plus the conversation.jsonl the agent would have written, are exported with
`export_campaigns`; peak memory is Python's (tracemalloc). An ATIF file is written a step at a time, so memory
does not grow with a run's length or the campaign's; an SFT line is one context epoch, held while written.

    python benchmarks/export_scale.py [--runs 20] [--steps 500,2000,8000] [--format atif,sft-jsonl]
    python benchmarks/export_scale.py --cases atif:2:500,atif:100:2000,sft-jsonl:100:2000 [--write-docs]

`--write-docs` replaces the table in docs/export.md (`<!-- benchmark:export_scale -->`) with this run's.
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

from analyze_synth import MODELS, Planted, paper_result, plant_campaign, transcript_lines, write_run
from docs_block import REPO, markdown_table, write_block

from labkube.results.export import ExportFilter, export_campaigns
from labkube.store import CampaignDir

PAD = "x" * 2000


def conversation_of(events: list[dict]) -> list[dict]:
    """The conversation the agent saw for a synthetic transcript: its assistant messages and tool results."""
    out = [{"epoch": 0, "role": "system", "content": "You are a research agent."}]
    out.append({"epoch": 0, "role": "user", "content": "# Task: bench"})
    for e in events:
        if e["type"] == "model_call":
            message = {"role": "assistant", "content": "", **(e.get("message") or {})}
            calls = [
                {
                    "id": c.get("id") or f"call_{e.get('step')}_{i}",
                    "name": c["name"],
                    "arguments": c.get("arguments", {}),
                }
                for i, c in enumerate(message.get("tool_calls") or [])
            ]
            message["tool_calls"] = calls
            e["message"] = message
            out.append({"epoch": 0, **message})
        elif e["type"] == "tool_call":
            out.append(
                {"epoch": 0, "role": "tool", "content": e["output"], "tool_call_id": e["call_id"], "name": e["tool"]}
            )
    return out


def write_campaign(root: Path, runs: int, steps: int) -> int:
    cdir = CampaignDir(root)
    planted = [Planted(f"bench--s{i}", MODELS[i % 2], i, steps, 3600.0, score=0.5) for i in range(runs)]
    specs = plant_campaign(cdir, "bench", planted, seeds=runs)
    total = 0
    for p, s in zip(planted, specs, strict=True):
        events = transcript_lines(p)
        pending: list[str] = []
        for e in events:
            if e["type"] == "model_call":
                calls = (e.get("message") or {}).get("tool_calls") or []
                for i, c in enumerate(calls):
                    c.setdefault("id", f"call_{e.get('step')}_{i}")
                pending = [c["id"] for c in calls]
            elif e["type"] == "tool_call":
                e["output"] = str(e.get("output", "")) + "\n" + PAD
                e.setdefault("call_id", pending.pop(0) if pending else f"orphan_{e.get('step')}")
        conversation = conversation_of(events)
        write_run(cdir, s, paper_result(p), events)
        run_dir = cdir.run_dir(p.run_id)
        (run_dir / "conversation.jsonl").write_text("".join(json.dumps(m) + "\n" for m in conversation))
        total += (run_dir / "transcript.jsonl").stat().st_size + (run_dir / "conversation.jsonl").stat().st_size
    return total


def measure(runs: int, steps: int, fmt: str) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        size = write_campaign(Path(tmp) / "c", runs, steps)
        tracemalloc.start()
        started = time.perf_counter()
        done = export_campaigns([Path(tmp) / "c"], fmt, Path(tmp) / "out", ExportFilter())
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert all(r.path is not None for r in done), [r.skipped for r in done]
    return size / 1e6, seconds, peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", default="500,2000,8000")
    parser.add_argument("--format", default="atif,sft-jsonl")
    parser.add_argument("--cases", help="FORMAT:RUNS:STEPS,... instead of --runs x --steps x --format")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/export.md")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "export.md", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cases:
        cases = [(f, int(r), int(n)) for f, r, n in (c.split(":") for c in args.cases.split(","))]
        command = f"python benchmarks/export_scale.py --cases {args.cases}"
    else:
        steps = [int(s) for s in args.steps.split(",")]
        cases = [(fmt, args.runs, n) for fmt in args.format.split(",") for n in steps]
        command = f"python benchmarks/export_scale.py --runs {args.runs} --steps {args.steps} --format {args.format}"
    header = ("format", "runs", "steps per run", "input (MB)", "seconds", "MB/s", "peak memory (MB)")
    table = Table(title="labkube export: time and peak memory", title_justify="left")
    for col in header:
        table.add_column(col, justify="right")
    rows = []
    for fmt, runs, n in cases:
        mb, seconds, peak = measure(runs, n, fmt)
        rows.append((fmt, f"{runs:,}", f"{n:,}", f"{mb:,.1f}", f"{seconds:.2f}", f"{mb / seconds:.1f}", f"{peak:.1f}"))
        table.add_row(*rows[-1])
    Console().print(table)
    if args.write_docs:
        write_block(args.doc, "export_scale", markdown_table(header, rows, [False] + [True] * 6), command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
