"""A write that failed because its filesystem is full, over quota or read-only: found wherever it surfaces (an
`OSError` in this process, one a Ray actor raised and Ray wrapped, `shutil.copytree`'s collected errors, a `git`
that said so) and said as one line naming the folder and what filled. Such a failure is the machine's, not the
run's: the campaign stops there and resumes, unchanged, once there is space again. Importable without Ray."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

__all__ = [
    "STORAGE_ERRNOS",
    "StorageFull",
    "line_for",
    "mount_point",
    "storage_errno_in",
    "storage_error",
    "storage_full_line",
]

# What each errno means for the user, and what to do about it.
STORAGE_ERRNOS = {
    errno.ENOSPC: ("disk full", "free space there"),
    errno.EDQUOT: ("disk quota used up", "free space there or raise the quota"),
    errno.EROFS: ("read-only filesystem", "make it writable"),
}
_NAMED = {os.strerror(number): number for number in STORAGE_ERRNOS}  # as git and shutil.Error write them
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")


class StorageFull(RuntimeError):
    """A storage failure already said as its one line (`storage_full_line`): raised by a supervisor whose run's agent
    stopped on one, carried through Ray, shown by the command line as it is (exit 1)."""


def storage_error(exc: BaseException | None, where: str | Path | None = None) -> OSError | None:
    """The `OSError` of a full, over-quota or read-only filesystem in `exc` or what it wraps (`__cause__`,
    `__context__`, a Ray task error's `cause`), with a file name where one is known (else `where`); None when
    `exc` is some other failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _one_storage_error(exc)
        if found is not None:
            if found.filename is None and where is not None:
                return OSError(found.errno, found.strerror, str(where))
            return found
        exc = _wrapped(exc)
    return None


def _wrapped(exc: BaseException) -> BaseException | None:
    """What `exc` wraps: a Ray task error's `cause`, else its `__cause__`, else the context it did not suppress (an
    error raised `from None` was said in its own words already)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return cause
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def _one_storage_error(exc: BaseException) -> OSError | None:
    if isinstance(getattr(exc, "cause", None), BaseException):  # Ray's wrapper, an OSError too: its cause says where
        return None
    if isinstance(exc, shutil.Error):  # copytree's collected (src, dst, "why") errors: the errno is only in the text
        for entry in exc.args[0] if exc.args and isinstance(exc.args[0], list) else []:
            number = storage_errno_in(str(entry[-1]))
            if number is not None and len(entry) == 3:
                return OSError(number, os.strerror(number), str(entry[1]))
        return None
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return exc
    return None


def storage_errno_in(text: str) -> int | None:
    """The storage errno a message names (`[Errno 28]`, or `No space left on device` as git writes it), or None."""
    match = _ERRNO_TEXT.search(text)
    if match is not None and int(match.group(1)) in STORAGE_ERRNOS:
        return int(match.group(1))
    return next((number for name, number in _NAMED.items() if name in text), None)


def mount_point(path: str | Path) -> Path:
    """The mount point of the filesystem that holds `path` (or would hold it: the nearest folder that exists)."""
    here = Path(os.path.abspath(path))
    while not here.exists() and here != here.parent:
        here = here.parent
    while not os.path.ismount(here) and here != here.parent:
        here = here.parent
    return here


def storage_full_line(exc: BaseException, where: str | Path | None = None) -> str | None:
    """The one line for a storage failure in `exc` (`storage_error`; a `StorageFull` is its own line), naming the
    folder written and the filesystem that filled; None when `exc` is some other failure."""
    seen: set[int] = set()
    walk: BaseException | None = exc
    while walk is not None and id(walk) not in seen:
        seen.add(id(walk))
        wraps = isinstance(getattr(walk, "cause", None), BaseException)  # Ray's copy of the class says its traceback
        if isinstance(walk, StorageFull) and not wraps:
            return str(walk)
        walk = _wrapped(walk)
    found = storage_error(exc, where)
    if found is None:
        return None
    return line_for(found)


def line_for(found: OSError) -> str:
    """`disk full: no space left on the filesystem at MOUNT (writing PATH); free space there, then run the same
    command again to resume`, and its like for a quota or a read-only filesystem."""
    what, remedy = STORAGE_ERRNOS.get(found.errno or errno.ENOSPC, STORAGE_ERRNOS[errno.ENOSPC])
    strerror = (found.strerror or os.strerror(found.errno or errno.ENOSPC)).lower()
    if found.filename is None:
        return f"{what}: {strerror}; {remedy}, then run the same command again to resume"
    written = os.path.abspath(found.filename)
    return (
        f"{what}: {strerror} on the filesystem at {mount_point(written)} (writing {written}); {remedy}, then run "
        "the same command again to resume"
    )
