"""The agent's view of its workspace: every path it names must stay inside."""

from __future__ import annotations

import os
from pathlib import Path

from labkube.agent.rg.tool import ToolError


class Workspace:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()

    def resolve(self, path: str, *, must_exist: bool = False) -> Path:
        """`path` (relative to the workspace, or absolute inside it) as a real path inside the workspace."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("path is empty")
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        real = Path(os.path.realpath(candidate))
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"{path}: outside the workspace ({self.root}); use a path inside it")
        if must_exist and not real.exists():
            raise ToolError(f"{path}: no such file or directory")
        return real

    def contains(self, path: Path) -> bool:
        real = Path(os.path.realpath(path))
        return real == self.root or self.root in real.parents

    def relative(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return str(path)
