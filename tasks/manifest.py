"""The pristine task as its campaign found it: a manifest of its files, pinned when the campaign is planned and
checked at every grading.

A run is graded from its task's pristine folder (`RunSpec.task_path`): its grader, its description, its data.
Whatever rewrites that folder after the campaign started (an agent that found the path, a careless hand) would decide
every later run's score, and nothing else would notice. So the planner hashes the folder into a `TaskManifest`
(relative path -> mode and sha256, or a symlink's target) and pins the manifest's digest in each run's spec
(`RunSpec.task_digest`: in `run.json`, in the operator's admitted spec; never where an agent writes). The manifest
itself, which names the files, is kept beside `run.json` (`task-manifest.json`) and is content-addressed: a copy whose
digest is not the pinned one is not the campaign's and is ignored, so it may live on a volume an agent can write.

Every grading checks the files the grader is built from (the protected paths it copies and `labkube.yaml`, which says
how to grade); the final grading checks every file. A file that changed, appeared or vanished fails the grading,
naming it, and the run's outcome is an error (`setup_error`), never a score. A resumed campaign keeps the digest it
pinned first: hashing again would accept a task changed in between.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from labkube.run_spec import RunSpec
from labkube.store import read_model, write_model
from labkube.task_card import TaskCard, TaskFamily
from labkube.tasks.researchgym import TaskError

MANIFEST_FILE = "task-manifest.json"  # beside run.json
TASK_SETTINGS = "labkube.yaml"  # what the card, and so the grading command, is read from
SKIPPED_NAMES = frozenset({"__pycache__", ".git"})  # byte-code a run's imports may write; a checkout's own history
REGULAR, EXECUTABLE, SYMLINK = "100644", "100755", "120000"  # as git writes a tree's modes
MAX_NAMED = 5
# A file written this recently may be written again within the kernel's clock tick with the same size and times: its
# digest is not cached (the same rule as GAIA's dataset cache).
RECENT_NS = 2_000_000_000
HASH_CHUNK = 1 << 20
MAX_CACHED = 200_000


class TaskManifest(BaseModel):
    """Every file of a pristine task, as its campaign found it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: dict[str, str] = Field(
        description="Path relative to the task folder -> `100644 <sha256>` or `100755 <sha256>` for a file, "
        "`120000 <target>` for a symlink. __pycache__ and .git folders are left out."
    )

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.files, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class TaskFiles:
    """Where a task's files are, and which of them its grading depends on (`listed`; None: every one under `root`)."""

    root: Path
    listed: tuple[str, ...] | None = None


def task_files(card: TaskCard) -> TaskFiles | None:
    """The files a run of `card` is graded from. A paper task: its whole folder. A GAIA question: the dataset's
    metadata.jsonl (which holds the answer) and the question's attachment, not the other questions' attachments. A
    Gaia2 scenario: its JSON file; a scenario from ARE's registry lives in ARE's installed package, pinned by ARE's
    version, and is not hashed (None)."""
    if card.family is TaskFamily.gaia2:
        scenario = Path(card.path) if card.path else None
        if scenario is None or not scenario.is_file():
            return None
        return TaskFiles(scenario.parent, (scenario.name,))
    if card.gaia is not None:
        listed = ("metadata.jsonl", card.gaia.file_name) if card.gaia.file_name else ("metadata.jsonl",)
        return TaskFiles(Path(card.path), listed)
    return TaskFiles(Path(card.path))


def grader_paths(card: TaskCard) -> tuple[str, ...] | None:
    """What every grading checks: the top-level entries the grading view copies from the pristine task (the protected
    paths' first components, as `build_grading_view` copies them) and `labkube.yaml`. None: the task's listed files,
    which are few (GAIA, Gaia2)."""
    if card.gaia is not None or card.gaia2 is not None:
        return None
    return tuple(sorted({p.split("/")[0] for p in card.protected} | {TASK_SETTINGS}))


_digests: dict[tuple[str, int, int, int, int, int], str] = {}


def _file_digest(path: Path, st: os.stat_result) -> str:
    """A file's sha256, cached within this process by its identity, size and times (ctime moves on every write and
    cannot be set back), so a campaign's planner hashes a task's data once however many runs it has."""
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _digests.get(key)
    if known is not None:
        return known
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RECENT_NS:
        if len(_digests) >= MAX_CACHED:  # a long-lived operator: forget rather than grow
            _digests.clear()
        _digests[key] = digest
    return digest


def _collect(root: Path, rel: str, into: dict[str, str]) -> None:
    path = root / rel if rel else root
    try:
        st = path.lstat() if rel else path.stat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in sorted(os.listdir(path)):
            if name not in SKIPPED_NAMES:
                _collect(root, f"{rel}/{name}" if rel else name, into)
    elif stat.S_ISLNK(st.st_mode):
        into[rel] = f"{SYMLINK} {os.readlink(path)}"
    elif stat.S_ISREG(st.st_mode):
        into[rel] = f"{EXECUTABLE if st.st_mode & 0o111 else REGULAR} {_file_digest(path, st)}"


def manifest_of(files: TaskFiles, only: Iterable[str] | None = None) -> TaskManifest:
    """The manifest of the task's files now: all of them, or only those at or under the paths in `only`."""
    found: dict[str, str] = {}
    paths = tuple(only) if only is not None else files.listed
    if paths is None:
        _collect(files.root, "", found)
    else:
        for rel in paths:
            _collect(files.root, rel, found)
    return TaskManifest(files=found)


def _under(path: str, tops: Iterable[str]) -> bool:
    return any(path == top or path.startswith(f"{top}/") for top in tops)


def _what_changed(was: str | None, now: str | None) -> str:
    if was is None:
        return "appeared"
    if now is None:
        return "vanished"
    was_mode, _, was_what = was.partition(" ")
    now_mode, _, now_what = now.partition(" ")
    if was_mode == now_mode:
        return "symlink target differs" if was_mode == SYMLINK else "sha256 differs"
    if SYMLINK in (was_mode, now_mode):
        return "now a symlink" if now_mode == SYMLINK else "no longer a symlink"
    return f"mode {was_mode} -> {now_mode}" + ("" if was_what == now_what else ", sha256 differs")


def differences(recorded: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """Each file that changed, appeared or vanished, as `path (what)`, in path order."""
    return [
        f"{path} ({_what_changed(recorded.get(path), now.get(path))})"
        for path in sorted(recorded.keys() | now.keys())
        if recorded.get(path) != now.get(path)
    ]


def changed_message(what: str) -> str:
    return (
        f"the pristine task changed since the campaign started: {what}; re-run the campaign from an intact copy of "
        "the task"
    )


def recorded_manifest(run_dir: Path, digest: str) -> TaskManifest | None:
    """The campaign's manifest kept beside `run.json`, if it is the one whose digest the run's spec pins."""
    manifest = read_model(run_dir / MANIFEST_FILE, TaskManifest)
    return manifest if manifest is not None and manifest.digest == digest else None


def keep_manifest(run_dir: Path, manifest: TaskManifest) -> None:
    """Keep the manifest beside `run.json`, unless a good copy is there already; a copy that cannot be written only
    means a later change cannot be named (the digest still catches it)."""
    if recorded_manifest(run_dir, manifest.digest) is not None:
        return
    with contextlib.suppress(OSError):
        write_model(run_dir / MANIFEST_FILE, manifest)


def record_if_intact(card: TaskCard, digest: str | None, run_dir: Path) -> None:
    """Where the planner could not keep the manifest beside `run.json` (a pod's own volume): hash the task now and
    keep the manifest if the task is still the one the campaign pinned, so a later change can be named."""
    files = task_files(card)
    if digest is None or files is None or recorded_manifest(run_dir, digest) is not None:
        return
    try:
        now = manifest_of(files)
    except OSError:  # unreadable: the grading says so
        return
    if now.digest == digest:
        keep_manifest(run_dir, now)


def pristine_changes(card: TaskCard, digest: str | None, run_dir: Path, *, whole: bool) -> str | None:
    """Why the run must not be graded from its pristine task (the files that changed since the campaign pinned
    `digest`), or None when it is intact or was never pinned. `whole`: every file (the final grading); otherwise the
    files the grader is built from (`grader_paths`)."""
    files = task_files(card)
    if digest is None or files is None:
        return None
    try:
        return _changes(card, files, digest, run_dir, whole)
    except OSError as exc:
        return changed_message(f"{exc.filename or card.path} cannot be read ({exc.strerror or exc}) to check it")


def _changes(card: TaskCard, files: TaskFiles, digest: str, run_dir: Path, whole: bool) -> str | None:
    recorded = recorded_manifest(run_dir, digest)
    if recorded is None:  # nothing names the files: the whole task against the digest
        now = manifest_of(files)
        if now.digest == digest:
            keep_manifest(run_dir, now)
            return None
        return changed_message(
            f"its files hash to {now.digest}, the campaign pinned {digest} (the campaign's list of the task's files, "
            f"{MANIFEST_FILE}, is not beside run.json to name which)"
        )
    tops = None if whole else grader_paths(card)
    now = manifest_of(files, tops)
    pinned = recorded.files if tops is None else {k: v for k, v in recorded.files.items() if _under(k, tops)}
    changed = differences(pinned, now.files)
    if not changed:
        return None
    more = f" and {len(changed) - MAX_NAMED} more" if len(changed) > MAX_NAMED else ""
    return changed_message(", ".join(changed[:MAX_NAMED]) + more)


@dataclass(frozen=True)
class PinnedTask:
    """What a grading checks the pristine task against: the digest the run's spec pins (None: not pinned), the run
    folder its manifest is kept in, and whether every file is checked (`whole`: the final grading) or the grader's."""

    digest: str | None
    run_dir: Path
    whole: bool = False

    def changes(self, card: TaskCard) -> str | None:
        return pristine_changes(card, self.digest, self.run_dir, whole=self.whole)


# -- the planner's side ------------------------------------------------------------------------------------------


def _card_of_run(cards: Iterable[TaskCard]) -> Callable[[RunSpec], TaskCard | None]:
    by_key = {(c.ref, c.gaia.task_id if c.gaia else None): c for c in cards}
    return lambda run: by_key.get((run.task, run.task_id))


def pin_task_digests(
    runs: list[RunSpec], cards: Iterable[TaskCard], pinned_before: Callable[[str], str | None]
) -> list[RunSpec]:
    """The runs with the digest of their pristine task pinned (`task_digest`): the one pinned when the campaign first
    started (`pinned_before(run_id)`, from where no agent writes), else the task's files hashed now (each task once)."""
    card_of = _card_of_run(cards)
    hashed: dict[TaskFiles, str] = {}
    pinned = []
    for run in runs:
        digest = pinned_before(run.run_id)
        card = card_of(run)
        files = task_files(card) if digest is None and card is not None else None
        if files is not None and card is not None:
            if files not in hashed:
                try:
                    hashed[files] = manifest_of(files).digest
                except OSError as exc:
                    where = exc.filename or files.root
                    raise TaskError(
                        f"task {card.ref}: cannot read {where} to pin its content ({exc.strerror})"
                    ) from None
            digest = hashed[files]
        pinned.append(run if digest is None else run.model_copy(update={"task_digest": digest}))
    return pinned


def keep_task_manifests(campaign_root: Path, runs: list[RunSpec], cards: Iterable[TaskCard]) -> None:
    """Keep each run's task manifest beside its `run.json` (`campaign_root/runs/<id>/`), where it names what changed
    if the task does; only a manifest that is still the pinned one (the file digests are cached: hashed once)."""
    card_of = _card_of_run(cards)
    for run in runs:
        card = card_of(run)
        files = task_files(card) if card is not None else None
        run_dir = campaign_root / "runs" / run.run_id
        if run.task_digest is None or files is None or recorded_manifest(run_dir, run.task_digest) is not None:
            continue
        now = manifest_of(files)
        if now.digest == run.task_digest and run_dir.is_dir():
            keep_manifest(run_dir, now)
