"""Benchmark figures in the docs are written by the benchmarks, never typed: a doc marks a table with
`<!-- benchmark:NAME -->` ... `<!-- /benchmark -->`, and the script's `--write-docs` replaces what is between the
markers with its table and a line naming the command, the machine and the commit the figures came from, and the
1-minute load average at the benchmark's start and end (the machines these run on are shared: a figure measured
beside a test suite says so)."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class DocsBlockError(Exception):
    pass


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# A benchmark imports this module as it starts, so this is the load it started under.
LOAD_AT_START = load_average()


def block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- benchmark:{re.escape(name)} -->\n)(.*?)(<!-- /benchmark -->)", re.S)


def machine() -> str:
    """The CPU model, its count and the memory, as /proc says (the platform's name elsewhere)."""
    model = platform.processor() or platform.machine()
    memory = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line), model)
        total_kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
        memory = f", {total_kib / 2**20:.0f} GiB memory"
    except (OSError, AttributeError, ValueError):
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cpus} CPUs{memory}"


def commit() -> str:
    """The checkout's commit, with "+ uncommitted changes" when the tree differs from it."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{sha} + uncommitted changes" if dirty else sha


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    align = ["---:" if r else "---" for r in right]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def load_line(at_start: float | None, at_end: float | None) -> str:
    def shown(load: float | None) -> str:
        return "unknown" if load is None else f"{load:.2f}"

    return f"1-minute load average {shown(at_start)} at start, {shown(at_end)} at end"


def provenance(command: str) -> str:
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    load = load_line(LOAD_AT_START, load_average())
    return f"Written by `{command}` on {machine()}, at commit {commit()}, {today}; {load}."


def write_block(doc: Path, name: str, body: str, command: str) -> None:
    """Replace the block NAME in `doc` with `body` and its provenance line."""
    text = doc.read_text()
    pattern = block_pattern(name)
    if len(pattern.findall(text)) != 1:
        raise DocsBlockError(
            f"{doc}: no single `<!-- benchmark:{name} -->` ... `<!-- /benchmark -->` block; add one for the table"
        )
    content = f"{body.rstrip()}\n\n{provenance(command)}\n"
    doc.write_text(pattern.sub(lambda m: m.group(1) + content + m.group(3), text))
