"""Parse and apply V4A patches, the multi-file edit format of the agent's `apply_patch` tool.

    *** Begin Patch
    *** Add File: path          every following line starts with +
    *** Delete File: path
    *** Update File: path
    *** Move to: new/path       optional, right after Update File
    @@ def train(self):         optional; several in a row narrow the search down
     context / -removed / +added
    *** End of File             optional; the hunk must match at the end of the file
    *** End Patch

This is our own parser: OpenAI's `openai-agents` ships a maintained applier (`agents.apply_diff`),
but installing it pulls in mcp, starlette and websockets, which the agent process does not need.

Paths are relative to the workspace root and may not leave it nor pass through a symbolic link
(agent/rg/workspace.py walks them by file descriptor, at planning and again at writing).
A hunk is located by its context and removed lines, searched forward from the end of the
previous hunk (and from its `@@` line), matching exactly, then ignoring trailing whitespace,
then ignoring surrounding whitespace.
Every new file content is computed before anything is written, so a patch that fails changes
nothing; the `PatchError` says which file and hunk, and why, in words the agent can act on.
"""

from __future__ import annotations

import contextlib
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel

from labkube.agent.rg.tool import ToolError
from labkube.agent.rg.workspace import PathError, Workspace

__all__ = [
    "AddFile",
    "DeleteFile",
    "FileOp",
    "Hunk",
    "HunkLine",
    "Patch",
    "PatchError",
    "PatchResult",
    "UpdateFile",
    "apply_patch",
    "parse_patch",
]

_BEGIN = "*** Begin Patch"
_END = "*** End Patch"
_ADD = "*** Add File:"
_DELETE = "*** Delete File:"
_UPDATE = "*** Update File:"
_MOVE = "*** Move to:"
_EOF = "*** End of File"
_MARKER = "*** "
# Unified-diff ranges ("@@ -12,7 +12,8 @@") say nothing V4A can use; models write them out of habit.
_RANGE = re.compile(r"-\d+(,\d+)? \+\d+(,\d+)? @@.*")
_LEVELS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


class PatchError(Exception):
    """The patch is malformed or does not apply; nothing on disk was changed."""


_Kind = Literal[" ", "-", "+"]


@dataclass(frozen=True)
class HunkLine:
    kind: _Kind  # " " context, "-" removed, "+" added
    text: str


@dataclass(frozen=True)
class Hunk:
    headers: list[str]
    lines: list[HunkLine]
    end_of_file: bool = False

    @property
    def old(self) -> list[str]:
        """Context and removed lines: what must be found in the file."""
        return [line.text for line in self.lines if line.kind != "+"]


@dataclass(frozen=True)
class AddFile:
    path: str
    lines: list[str]


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    hunks: list[Hunk]
    move_to: str | None = None


FileOp = AddFile | DeleteFile | UpdateFile


@dataclass(frozen=True)
class Patch:
    ops: list[FileOp]


class PatchResult(BaseModel):
    """What a successful patch changed, paths relative to the workspace root."""

    added: list[str] = []
    updated: list[str] = []
    deleted: list[str] = []
    moved: list[tuple[str, str]] = []
    summary: str = ""


# --- parsing ---------------------------------------------------------------------------------


def parse_patch(text: str) -> Patch:
    """Parse V4A patch text into file operations; raises `PatchError` on malformed text."""
    return _Parser(text.replace("\r\n", "\n").split("\n")).parse()


class _Parser:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.pos = 0
        self.end = 0

    def parse(self) -> Patch:
        filled = [i for i, line in enumerate(self.lines) if line.strip()]
        if not filled or self.lines[filled[0]].strip() != _BEGIN:
            raise PatchError(f"the patch must start with a '{_BEGIN}' line")
        if len(filled) < 2 or self.lines[filled[-1]].strip() != _END:
            raise PatchError(f"the patch must end with a '{_END}' line")
        self.pos, self.end = filled[0] + 1, filled[-1]
        ops: list[FileOp] = []
        while self.pos < self.end:
            if self._line.strip():
                ops.append(self._parse_op())
            else:
                self.pos += 1
        if not ops:
            raise PatchError("the patch has no file operations (Add File, Update File or Delete File)")
        return Patch(ops=ops)

    @property
    def _line(self) -> str:
        return self.lines[self.pos]

    def _fail(self, message: str) -> PatchError:
        return PatchError(f"line {self.pos + 1} of the patch: {message}")

    def _path(self, marker: str) -> str:
        path = self._line[len(marker) :].strip()
        if not path:
            raise self._fail(f"'{marker}' needs a path")
        self.pos += 1
        return path

    def _parse_op(self) -> FileOp:
        line = self._line
        if line.startswith(_ADD):
            return self._parse_add(self._path(_ADD))
        if line.startswith(_DELETE):
            return DeleteFile(self._path(_DELETE))
        if line.startswith(_UPDATE):
            return self._parse_update(self._path(_UPDATE))
        if line.strip() == _END:
            raise self._fail(f"text follows '{_END}'")
        raise self._fail(f"expected '{_ADD} ', '{_UPDATE} ' or '{_DELETE} ', got {_clip(line)!r}")

    def _at_marker(self) -> bool:
        return self._line.startswith(_MARKER)

    def _only_blanks_left(self) -> bool:
        """True if blank lines run from here to the next marker: they separate operations."""
        i = self.pos
        while i < self.end and not self.lines[i].strip():
            i += 1
        return i == self.end or self.lines[i].startswith(_MARKER)

    def _parse_add(self, path: str) -> AddFile:
        content: list[str] = []
        while self.pos < self.end and not self._at_marker():
            if self._line.startswith("+"):
                content.append(self._line[1:])
            elif not self._line.strip() and self._only_blanks_left():
                break
            else:
                raise PatchError(
                    f"Add File {path}: line {self.pos + 1} of the patch must start with '+' "
                    f"(every line of an added file does): {_clip(self._line)!r}"
                )
            self.pos += 1
        return AddFile(path, content)

    def _parse_update(self, path: str) -> UpdateFile:
        move_to = self._path(_MOVE) if self.pos < self.end and self._line.startswith(_MOVE) else None
        hunks: list[Hunk] = []
        while self.pos < self.end and not (self._at_marker() and self._line.strip() != _EOF):
            hunk = self._parse_hunk(path, len(hunks) + 1)
            if hunk is not None:
                hunks.append(hunk)
        if not hunks and move_to is None:
            raise PatchError(f"Update File {path}: no hunks (add '@@' hunks or a '{_MOVE} ' line)")
        return UpdateFile(path, hunks, move_to)

    def _parse_hunk(self, path: str, number: int) -> Hunk | None:
        where = f"Update File {path}, hunk {number}"
        headers: list[str] = []
        while self.pos < self.end and self._line.startswith("@@"):
            header = self._line[2:].strip()
            if header and not _RANGE.fullmatch(header):
                headers.append(header)
            self.pos += 1
        lines, end_of_file = self._parse_hunk_body(where)
        if not lines and not end_of_file:
            if headers:
                raise PatchError(f"{where}: an '@@' line with no hunk lines after it")
            return None  # only blank lines between operations
        if not any(line.kind != "+" for line in lines) and not headers and not end_of_file:
            raise PatchError(f"{where}: nothing says where to insert; add a context line, an '@@' line or '{_EOF}'")
        return Hunk(headers, lines, end_of_file)

    def _parse_hunk_body(self, where: str) -> tuple[list[HunkLine], bool]:
        lines: list[HunkLine] = []
        blank_tail = 0
        while self.pos < self.end and not self._line.startswith("@@"):
            line = self._line
            if line.startswith(_MARKER):
                if line.strip() == _EOF:
                    self.pos += 1
                    return lines, True
                if line.startswith(_MOVE):
                    raise PatchError(f"{where}: '{_MOVE}' must come right after '{_UPDATE}'")
                break
            if not line:
                lines.append(HunkLine(" ", ""))
                blank_tail += 1
            elif line[0] in " -+":
                lines.append(HunkLine(cast(_Kind, line[0]), line[1:]))
                blank_tail = 0
            else:
                raise PatchError(
                    f"{where}: line {self.pos + 1} of the patch must start with ' ', '-' or '+' "
                    f"(context lines start with a space): {_clip(line)!r}"
                )
            self.pos += 1
        # Empty lines before the next operation usually separate operations rather than match the file.
        return lines[: len(lines) - blank_tail], False


# --- applying --------------------------------------------------------------------------------


def apply_patch(patch: str, root: Path) -> PatchResult:
    """Apply V4A `patch` to the files under `root`, all or nothing.

    Raises:
        PatchError: the patch is malformed, a path leaves `root`, a file is missing or already
            exists, or a hunk's context is not found. No file was changed.
    """
    parsed = parse_patch(patch)
    workspace = _Workspace(Workspace(root))
    result = PatchResult()
    try:
        for op in parsed.ops:
            if isinstance(op, AddFile):
                _apply_add(workspace, op, result)
            elif isinstance(op, DeleteFile):
                _apply_delete(workspace, op, result)
            else:
                _apply_update(workspace, op, result)
    except (OSError, ValueError, RuntimeError) as error:  # NUL in a path, a symlink loop, a name too long
        if isinstance(error, PatchError):
            raise
        raise PatchError(f"cannot use a path of this patch: {error}") from None
    workspace.commit()
    result.summary = _summarize(result)
    return result


def _apply_add(ws: _Workspace, op: AddFile, result: PatchResult) -> None:
    where = f"Add File {op.path}"
    target = ws.resolve(op.path, where)
    if ws.exists(target):
        raise PatchError(f"{where}: the file already exists (use Update File to change it)")
    ws.write(target, "".join(line + "\n" for line in op.lines))
    result.added.append(ws.relative(target))


def _apply_delete(ws: _Workspace, op: DeleteFile, result: PatchResult) -> None:
    where = f"Delete File {op.path}"
    target = ws.resolve(op.path, where)
    ws.read(target, where)  # raises if there is no such file
    ws.delete(target)
    result.deleted.append(ws.relative(target))


def _apply_update(ws: _Workspace, op: UpdateFile, result: PatchResult) -> None:
    where = f"Update File {op.path}"
    source = ws.resolve(op.path, where)
    text = ws.read(source, where)
    if op.hunks:
        text = _patch_text(text, op.hunks, where)
    destination = ws.resolve(op.move_to, where) if op.move_to else source
    if destination == source:
        ws.write(source, text)
        result.updated.append(ws.relative(source))
        return
    if ws.exists(destination):
        raise PatchError(f"{where}: cannot move to {op.move_to}: that file already exists")
    ws.write(destination, text)
    ws.delete(source)
    result.moved.append((ws.relative(source), ws.relative(destination)))


def _summarize(result: PatchResult) -> str:
    parts = [
        f"{verb} {', '.join(paths)}"
        for verb, paths in (
            ("added", result.added),
            ("updated", result.updated),
            ("deleted", result.deleted),
            ("moved", [f"{old} -> {new}" for old, new in result.moved]),
        )
        if paths
    ]
    return "Patch applied: " + "; ".join(parts)


@dataclass
class _Workspace:
    """The files under `root` plus the changes the patch has made so far, not yet written.

    Files are named by their normalised path below the root ("" never: "." is the root itself); every read and
    write goes through `Workspace`'s descriptor walk, so no symbolic link is followed, at planning or at commit."""

    files: Workspace
    pending: dict[str, str | None] = field(default_factory=dict)  # None: deleted

    def resolve(self, path: str, where: str) -> str:
        if Path(path).is_absolute():
            raise PatchError(f"{where}: absolute paths are not allowed; use a path relative to the workspace")
        with _refused(where):
            target = self.files.rel(path)
            self.files.lstat(target)  # a symbolic link on the way, or at the end, is refused now
        return target

    def relative(self, target: str) -> str:
        return target

    def exists(self, target: str) -> bool:
        if target in self.pending:
            return self.pending[target] is not None
        with _refused(target):
            return self.files.lstat(target) is not None

    def read(self, target: str, where: str) -> str:
        if target in self.pending:
            text = self.pending[target]
            if text is None:
                raise PatchError(f"{where}: no such file (deleted or moved earlier in this patch)")
            return text
        with _refused(where):
            st = self.files.lstat(target)
            if st is None:
                raise PatchError(f"{where}: no such file (use Add File to create it)")
            if stat.S_ISDIR(st.st_mode):
                raise PatchError(f"{where}: that is a directory, not a file")
            if not stat.S_ISREG(st.st_mode):
                raise PatchError(f"{where}: not a regular file")
            data = self.files.read_bytes(target)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PatchError(f"{where}: not a UTF-8 text file") from None

    def write(self, target: str, text: str) -> None:
        self.pending[target] = text

    def delete(self, target: str) -> None:
        self.pending[target] = None

    def _before(self, target: str) -> bytes | None:
        st = self.files.lstat(target)
        return self.files.read_bytes(target) if st is not None and stat.S_ISREG(st.st_mode) else None

    def commit(self) -> None:
        """Write every change; if one write fails, put back what was written before it (all or nothing)."""
        encoded: dict[str, bytes | None] = {}
        for target, text in self.pending.items():
            try:
                encoded[target] = None if text is None else text.encode("utf-8")
            except UnicodeEncodeError:
                raise PatchError(f"{self.relative(target)}: the new text is not valid UTF-8") from None
        done: list[tuple[str, bytes | None]] = []
        created_dirs: list[str] = []
        try:
            for target, data in encoded.items():
                before = self._before(target)
                if data is None:
                    self.files.unlink(target, missing_ok=True)
                else:
                    self.files.write_bytes(target, data, created=created_dirs)
                done.append((target, before))
        except (OSError, ToolError) as error:
            for path, before in reversed(done):
                with contextlib.suppress(OSError, ToolError):
                    if before is None:
                        self.files.unlink(path, missing_ok=True)
                    else:
                        self.files.write_bytes(path, before)
            for d in reversed(created_dirs):
                with contextlib.suppress(OSError, ToolError):
                    self.files.rmdir(d)
            why = error.reason if isinstance(error, PathError) else error.strerror or str(error)
            raise PatchError(f"could not write {self.relative(target)}: {why}; nothing was changed") from None


@contextlib.contextmanager
def _refused(where: str) -> Iterator[None]:
    """A path the workspace refuses (a symbolic link, outside, not a directory) as a PatchError about `where`."""
    try:
        yield
    except PathError as error:
        raise PatchError(f"{where}: {error.reason}") from None


# --- hunks -----------------------------------------------------------------------------------


@dataclass
class _Text:
    lines: list[str]
    eol: str
    final_newline: bool

    @classmethod
    def split(cls, text: str) -> _Text:
        # CRLF only when every line ends so; in a mixed file a stray "\r" stays part of its line.
        eol = "\r\n" if "\n" in text and text.count("\r\n") == text.count("\n") else "\n"
        final_newline = text.endswith(eol) or not text
        body = text[: -len(eol)] if text.endswith(eol) else text
        return cls(body.split(eol) if text else [], eol, final_newline)

    def join(self, lines: list[str]) -> str:
        if not lines:
            return ""
        return self.eol.join(lines) + (self.eol if self.final_newline else "")


def _patch_text(text: str, hunks: list[Hunk], where: str) -> str:
    doc = _Text.split(text)
    out: list[str] = []
    cursor = 0
    for number, hunk in enumerate(hunks, start=1):
        start = _locate(doc.lines, hunk, cursor, f"{where}, hunk {number}")
        out.extend(doc.lines[cursor:start])
        out.extend(_replacement(doc.lines, start, hunk))
        cursor = start + len(hunk.old)
    out.extend(doc.lines[cursor:])
    return doc.join(out)


def _locate(lines: list[str], hunk: Hunk, cursor: int, where: str) -> int:
    """Index in `lines` where the hunk's old lines start (or where a pure insertion goes)."""
    search_from = cursor
    for header in hunk.headers:
        found = _find(lines, [header], cursor, levels=(str.strip,))
        if found is None:
            raise PatchError(f"{where}: '@@' line not found:\n    {_clip(header)}")
        # The header line itself may be the hunk's first context line, so search from it, not after it.
        search_from, cursor = found, found + 1
    old = hunk.old
    if hunk.end_of_file:
        start = len(lines) - len(old)
        if start < search_from or _find(lines[start:], old, 0) is None:
            raise PatchError(f"{where}: context not found at the end of the file:\n    {_clip(_first(old))}")
        return start
    if not old:
        return cursor  # insert right after the last @@ line
    start = _find(lines, old, search_from)
    if start is None:
        raise _not_found(lines, old, search_from, where)
    return start


def _find(
    lines: list[str], needle: list[str], start: int, levels: tuple[Callable[[str], str], ...] = _LEVELS
) -> int | None:
    """First index >= start where `needle` matches, trying the strictest level first."""
    for norm in levels:
        haystack = [norm(line) for line in lines]
        wanted = [norm(line) for line in needle]
        for i in range(start, len(lines) - len(needle) + 1):
            if haystack[i : i + len(wanted)] == wanted:
                return i
    return None


def _not_found(lines: list[str], old: list[str], start: int, where: str) -> PatchError:
    if _find(lines, old, 0) is not None:
        return PatchError(
            f"{where}: context found only above the previous hunk or '@@' line "
            f"(hunks must be in file order):\n    {_clip(old[0])}"
        )
    # Point at the first line that fails, after the longest run of lines that do match.
    best = 0
    for i in range(start, len(lines)):
        run = 0
        while run < len(old) and i + run < len(lines) and lines[i + run].strip() == old[run].strip():
            run += 1
        best = max(best, run)
    return PatchError(f"{where}: context not found:\n    {_clip(old[min(best, len(old) - 1)])}")


def _replacement(lines: list[str], start: int, hunk: Hunk) -> list[str]:
    """The hunk's new lines; context lines keep the file's own text, whitespace included."""
    out: list[str] = []
    offset = 0
    for line in hunk.lines:
        if line.kind == "+":
            out.append(line.text)
            continue
        if line.kind == " ":
            out.append(lines[start + offset])
        offset += 1
    return out


def _first(lines: list[str]) -> str:
    return lines[0] if lines else "(empty)"


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
