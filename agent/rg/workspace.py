"""The agent's view of its workspace: every path it names must stay inside.

The file tools run in the harness, outside the agent's sandbox, while the agent's own processes may be changing
the tree under them. So a path is never checked and then used: it is worked out on its text alone (`.` and `..`,
no link looked at), then walked one name at a time from a descriptor of the root, each directory opened with
O_NOFOLLOW | O_DIRECTORY relative to the one before and the file itself with O_NOFOLLOW. A symbolic link
anywhere on the way is refused, whatever it points at, and a directory swapped for a link mid-walk makes the open
fail instead of leading out. Reads and writes go through the descriptor that was opened.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from labkube.agent.rg.tool import ToolError
from labkube.sandbox import SANDBOX_WORKSPACE

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# Directories on the way are only passed through: O_PATH (Linux) needs no read permission on them.
_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | _NOFOLLOW
_LIST = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
# O_NONBLOCK: opening a FIFO the agent made must not hang the harness (it is then refused as not a regular file).
_FILE = os.O_NONBLOCK | _NOFOLLOW
MAX_DEPTH = 100  # `files` descends no deeper (one descriptor is open per level)


class PathError(ToolError):
    """A path the file tools refuse; `reason` says why without naming the path (for callers that prefix their own)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Workspace:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self._given = Path(os.path.abspath(root))  # an absolute path may name the root as it was given
        # ...or as the agent sees it in the run's sandbox (labkube/sandbox.py): /workspace/x is the workspace's x
        self._bases = tuple(dict.fromkeys((self.root, self._given, SANDBOX_WORKSPACE)))

    def _from_alias(self, path: str) -> str:
        """`path` with a leading `/workspace` (the sandbox's name for the root) put as the root's host path."""
        if os.path.isabs(path):
            normal = Path(os.path.normpath(path))
            if normal.is_relative_to(SANDBOX_WORKSPACE) and not normal.is_relative_to(self.root):
                return str(self.root / normal.relative_to(SANDBOX_WORKSPACE))
        return path

    def resolve(self, path: str, *, must_exist: bool = False) -> Path:
        """`path` (relative to the workspace, or absolute inside it, `/workspace/...` included) as a real path inside
        the workspace.

        Check-then-use: for a process's working directory or a finished run's files. The file tools use `open`,
        `write_bytes` and the other descriptor-based helpers below."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("path is empty")
        candidate = Path(self._from_alias(path))
        if not candidate.is_absolute():
            candidate = self.root / candidate
        real = Path(os.path.realpath(candidate))
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"{path}: outside the workspace; use a path inside it (relative to the workspace)")
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

    # -- descriptor-based access: nothing below follows a symbolic link -----------------------------------------

    def parts(self, path: str) -> tuple[str, ...]:
        """The names below the root that `path` (relative, or absolute inside the root) leads to, `.` and `..`
        worked out on the text alone; `()` is the root itself."""
        if not isinstance(path, str) or not path.strip():
            raise PathError("path is empty", "the path is empty")
        if "\0" in path:
            raise PathError(f"{path!r}: a path cannot hold a NUL byte", "a path cannot hold a NUL byte")
        outside = PathError(
            f"{path}: outside the workspace; use a path inside it (relative to the workspace)",
            "the path leads outside the workspace",
        )
        if os.path.isabs(path):
            normal = Path(os.path.normpath(path))
            for base in self._bases:
                if normal == base or base in normal.parents:
                    return normal.relative_to(base).parts
            raise outside
        names: list[str] = []
        for name in path.split("/"):
            if name == "..":
                if not names:
                    raise outside
                names.pop()
            elif name not in ("", "."):
                names.append(name)
        return tuple(names)

    def rel(self, path: str) -> str:
        """`path` as the tools show it: relative to the root, normalised, `.` for the root."""
        return "/".join(self.parts(path)) or "."

    @contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self.root, _LIST)
        try:
            yield fd
        finally:
            os.close(fd)

    def _refusal(self, path: str, names: tuple[str, ...], at: int, dir_fd: int, error: OSError) -> Exception:
        """What to raise when opening `names[at]` under `dir_fd` failed with `error`."""
        shown = "/".join(names[: at + 1])
        whole = at == len(names) - 1
        if error.errno == errno.ENOENT:
            return PathError(f"{path}: no such file or directory", "no such file or directory")
        if error.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            return PathError(f"{path} is not a regular file", "not a regular file")
        if error.errno == errno.EISDIR:
            return PathError(f"{path} is a directory", "that is a directory, not a file")
        if error.errno in (errno.ENOTDIR, errno.ELOOP):
            try:
                mode = os.stat(names[at], dir_fd=dir_fd, follow_symlinks=False).st_mode
            except OSError:
                return error
            if stat.S_ISLNK(mode):
                leads = "" if self.contains(self.root.joinpath(*names[: at + 1])) else " leading outside the workspace"
                reason = (
                    f"{shown} is a symbolic link{leads}; the file tools do not follow links "
                    "(use bash inside your workspace)"
                )
                return PathError(reason if whole else f"{path}: {reason}", reason)
            if error.errno == errno.ENOTDIR and not stat.S_ISDIR(mode):
                reason = f"{shown} is not a directory"
                return PathError(f"{path}: {reason}", reason)
        return error

    def _walk(self, root_fd: int, path: str, names: tuple[str, ...], *, create: bool, created: list[str] | None) -> int:
        """A new descriptor of the directory `names` below `root_fd`, walked without following links; missing
        directories are made with `create` (their paths appended to `created`)."""
        fd = os.dup(root_fd)
        try:
            for at, name in enumerate(names):
                try:
                    child = os.open(name, _WALK, dir_fd=fd)
                except FileNotFoundError as error:
                    if not create:
                        raise self._refusal(path, names, at, fd, error) from None
                    try:
                        os.mkdir(name, dir_fd=fd)
                        if created is not None:
                            created.append("/".join(names[: at + 1]))
                    except FileExistsError:
                        pass  # made meanwhile: opened below like any other
                    try:
                        child = os.open(name, _WALK, dir_fd=fd)
                    except OSError as again:
                        raise self._refusal(path, names, at, fd, again) from None
                except OSError as error:
                    raise self._refusal(path, names, at, fd, error) from None
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextmanager
    def open(
        self,
        path: str,
        flags: int = os.O_RDONLY,
        *,
        mode: int = 0o666,
        parents: bool = False,
        created: list[str] | None = None,
    ) -> Iterator[tuple[int, os.stat_result]]:
        """`path` opened with `flags`, no link followed on the way or at the end, and its `fstat`. Yields a
        directory (the root included) as such when `flags` allow it; a FIFO, socket or device is refused.
        With `parents`, missing directories on the way are made (their paths appended to `created`)."""
        names = self.parts(path)
        with self._root_fd() as root:
            if not names:
                if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
                    raise PathError(f"{path} is a directory", "that is a directory, not a file")
                fd = os.dup(root)
            else:
                parent = self._walk(root, path, names[:-1], create=parents, created=created)
                try:
                    fd = os.open(names[-1], flags | _FILE, mode, dir_fd=parent)
                except OSError as error:
                    raise self._refusal(path, names, len(names) - 1, parent, error) from None
                finally:
                    os.close(parent)
        try:
            st = os.fstat(fd)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise PathError(f"{path} is not a regular file", "not a regular file")
            if stat.S_ISREG(st.st_mode):
                os.set_blocking(fd, True)
            yield fd, st
        finally:
            os.close(fd)

    def lstat(self, path: str) -> os.stat_result | None:
        """What `path` names, without following it (None: nothing there). A link on the way, or `path` itself
        being a link, is refused."""
        names = self.parts(path)
        with self._root_fd() as root:
            if not names:
                return os.fstat(root)
            try:
                parent = self._walk(root, path, names[:-1], create=False, created=None)
            except PathError as error:
                if error.reason == "no such file or directory":
                    return None
                raise
            try:
                st = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise self._refusal(path, names, len(names) - 1, parent, OSError(errno.ELOOP, "link"))
                return st
            except FileNotFoundError:
                return None
            finally:
                os.close(parent)

    def read_bytes(self, path: str) -> bytes:
        """The whole content of the regular file `path`."""
        with self.open(path) as (fd, st):
            if stat.S_ISDIR(st.st_mode):
                raise PathError(f"{path} is a directory", "that is a directory, not a file")
            return read_fd(fd)

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False, created: list[str] | None = None) -> bool:
        """Write `data` to the file `path`, making it and missing parent directories; True if it existed
        (with `exclusive`, an existing file raises FileExistsError instead)."""
        try:
            with self.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, parents=True, created=created) as (fd, _):
                write_fd(fd, data)
                return False
        except FileExistsError:  # a file, a directory or a link: the open below truncates only a file
            if exclusive:
                raise
        with self.open(path, os.O_WRONLY | os.O_TRUNC) as (fd, st):
            if stat.S_ISDIR(st.st_mode):
                raise PathError(f"{path} is a directory", "that is a directory, not a file")
            write_fd(fd, data)
        return True

    def unlink(self, path: str, *, missing_ok: bool = False) -> None:
        """Remove the file `path` (never a directory; a link on the way is refused)."""
        names = self.parts(path)
        if not names:
            raise PathError(f"{path} is a directory", "that is a directory, not a file")
        with self._root_fd() as root:
            try:
                parent = self._walk(root, path, names[:-1], create=False, created=None)
            except PathError as error:
                if missing_ok and error.reason == "no such file or directory":
                    return
                raise
            try:
                os.unlink(names[-1], dir_fd=parent)
            except FileNotFoundError:
                if not missing_ok:
                    raise
            finally:
                os.close(parent)

    def rmdir(self, path: str) -> None:
        """Remove the empty directory `path`."""
        names = self.parts(path)
        if not names:
            raise PathError(f"{path}: the workspace itself cannot be removed", "the workspace itself")
        with self._root_fd() as root:
            parent = self._walk(root, path, names[:-1], create=False, created=None)
            try:
                os.rmdir(names[-1], dir_fd=parent)
            finally:
                os.close(parent)

    def files(self, path: str, *, skip_dir: Callable[[str], bool] = lambda rel: False) -> Iterator[tuple[str, int]]:
        """Each regular file at or below `path`, in path order, as (relative path, descriptor open for reading;
        valid until the next one). Links and special files below `path` are passed over, never followed;
        directories whose relative path `skip_dir` accepts are not entered."""
        with self.open(path) as (fd, st):
            rel = self.rel(path)
            if stat.S_ISREG(st.st_mode):
                yield rel, fd
            else:
                yield from self._files_in(fd, "" if rel == "." else rel + "/", skip_dir, 0)

    def _files_in(
        self, dir_fd: int, prefix: str, skip_dir: Callable[[str], bool], depth: int
    ) -> Iterator[tuple[str, int]]:
        with os.scandir(dir_fd) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it)
        for name, is_dir, is_file in entries:
            rel = prefix + name
            if not (is_file or (is_dir and depth < MAX_DEPTH and not skip_dir(rel))):
                continue  # a link, a special file, or too deep
            try:
                fd = os.open(name, (_LIST if is_dir else os.O_RDONLY | _FILE), dir_fd=dir_fd)
            except OSError:
                continue  # gone, or swapped for a link since it was listed
            try:
                mode = os.fstat(fd).st_mode
                if is_dir and stat.S_ISDIR(mode):
                    yield from self._files_in(fd, rel + "/", skip_dir, depth + 1)
                elif is_file and stat.S_ISREG(mode):
                    os.set_blocking(fd, True)
                    yield rel, fd
            finally:
                os.close(fd)


def read_fd(fd: int) -> bytes:
    """Everything from the current offset of `fd` to its end."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def rewrite_fd(fd: int, data: bytes) -> None:
    """Replace the whole content of the file open (read-write) as `fd` with `data`."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    write_fd(fd, data)
