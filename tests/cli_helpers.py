"""Helpers shared by tests: the CLI as a subprocess, a digest of a directory tree."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

BUNDLED_TASK = "researchgym/continual-learning-lite"


def labkube(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run the installed `labkube` command (the same entry point users run)."""
    full_env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-P", "-m", "labkube", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tree_digest(root: Path) -> str:
    """A digest of every file's path and content under `root` (to prove nothing was written)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one `error:` line a failed command printed, checked: its exit code, no traceback, nothing else on stderr."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]
