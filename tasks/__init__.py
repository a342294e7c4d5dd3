"""Task families (ResearchGym paper tasks, GAIA questions, Gaia2 worlds in `gaia2/`), their graders, task
environments, and the bundled tasks: what a run is asked to do and how its work is scored."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkube.task_card import TaskCard, TaskFamily
from labkube.tasks.grading import GradeOutcome, grade_workspace
from labkube.tasks.manifest import PinnedTask
from labkube.tasks.researchgym import (
    OverlayError,
    TaskError,
    load_researchgym,
    read_task_overlays,
    task_folder_name,
)
from labkube.tasks.workspace import (
    clear_half_made,
    commit_pristine,
    make_empty_pristine,
    prepare_workspace,
    remove_empty_pristine,
    workspace_diff,
    workspace_prepared,
)

BUNDLED = Path(__file__).parent / "bundled"

__all__ = [
    "BUNDLED",
    "GradeOutcome",
    "OverlayError",
    "PinnedTask",
    "PristineTask",
    "TaskError",
    "bundled_tasks",
    "card_for_run",
    "grade_run",
    "grade_runs_in_workspace",
    "grade_workspace",
    "load_task",
    "make_empty_pristine",
    "prepare_run_workspace",
    "prepare_workspace",
    "read_task_overlays",
    "remove_empty_pristine",
    "resolve_campaign_tasks",
    "resolve_tasks",
    "task_folder_name",
    "workspace_diff",
]


def bundled_tasks() -> list[str]:
    """Names of the tasks shipped with labkube, as `family/name`."""
    from labkube.tasks.gaia2 import bundled_scenarios

    names = []
    for family in sorted(p for p in BUNDLED.iterdir() if p.is_dir() and p.name != "gaia2"):
        for task in sorted(p for p in family.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            names.append(f"{family.name}/{task.name}")
    return names + sorted(bundled_scenarios())


WHAT_A_TASK_IS = (
    "give a ResearchGym task folder, a GAIA dataset folder, a Gaia2 scenario file or folder, "
    "or a bundled task (labkube tasks list)"
)


def _unknown(ref: str) -> TaskError:
    """A reference that names nothing: the nearest bundled task or folder beside it as a suggestion, or the list."""
    bundled = bundled_tasks()
    near = difflib.get_close_matches(ref, _siblings(ref), n=1) or difflib.get_close_matches(ref, bundled, n=1)
    hint = f"did you mean {near[0]}?" if near else f"bundled: {', '.join(bundled) or 'none'}"
    return TaskError(f"unknown task {ref!r}: not a task directory and not a bundled task ({hint})")


def _siblings(ref: str) -> list[str]:
    """The folders beside the one `ref` names, spelled as `ref` is (a typo in a task folder's name)."""
    path = Path(ref.partition("#")[0].rstrip("/"))
    parent = path.expanduser().parent
    try:
        return [str(path.parent / p.name) for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _researchgym(task_dir: Path, ref: str, overlays: Mapping[str, dict[str, Any]] | None) -> TaskCard:
    overlay = (overlays or {}).get(task_dir.resolve().name)
    return load_researchgym(task_dir, ref, overlay_content=overlay)


def resolve_tasks(ref: str, overlays: Mapping[str, dict[str, Any]] | None = None) -> list[TaskCard]:
    """Every task a reference names: one paper task, or the questions of a GAIA dataset. A paper task's
    folder name keys its overlay in `overlays` (labkube.yaml mappings merged over the folder's own)."""
    from labkube.tasks.gaia import load_gaia
    from labkube.tasks.gaia2.cards import load_gaia2

    path_part, _, task_id = ref.partition("#")
    if not path_part.strip():
        raise TaskError(f"task {ref!r} is empty: {WHAT_A_TASK_IS}")
    path = Path(path_part).expanduser()
    if path.is_dir():
        if (path / "metadata.jsonl").exists():
            return load_gaia(path, ref.split("#")[0].rstrip("/"), task_id or None)
        if (path / "task_description.md").exists():
            return [_researchgym(path, ref, overlays)]
        try:
            return load_gaia2(ref)
        except TaskError as exc:
            if "not an ARE scenario" not in str(exc) and "no scenarios found" not in str(exc):
                raise  # a folder of scenarios with a broken one: that one's problem
            raise TaskError(
                f"{path_part}: not a task folder (no task_description.md, no metadata.jsonl, no Gaia2 scenario in "
                f"it): {WHAT_A_TASK_IS}"
            ) from None
    if path.is_file() and path.suffix in (".json", ".jsonl"):
        return load_gaia2(ref)
    if ref == "gaia2" or ref.startswith("gaia2/"):
        return load_gaia2(ref)
    family, _, rest = ref.partition("/")
    name, _, question = rest.partition("/")
    bundled = BUNDLED / family / name
    if not name or not bundled.is_dir():
        raise _unknown(ref)
    if family == "researchgym" and not question:
        return [_researchgym(bundled, ref, overlays)]
    if family == "gaia":
        return load_gaia(bundled, f"gaia/{name}", question or None)
    raise _unknown(ref)


def resolve_campaign_tasks(
    refs: list[str], overlays: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, list[TaskCard]]:
    """The cards of a campaign's tasks, by reference, with the campaign's overlays (`task_overlays`) applied.
    Raises `OverlayError` for an overlay that does not apply, or names a task folder the campaign does not run."""
    cards = {ref: resolve_tasks(ref, overlays) for ref in refs}
    folders = {c.folder: c for cs in cards.values() for c in cs}
    for name in overlays or {}:
        card = folders.get(name)
        if card is None:
            names = sorted(folders)
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"its task folders: {', '.join(names) or 'none'}"
            raise OverlayError(f"task_overlays: {name} is not a task folder this campaign runs ({hint})")
        if card.family is not TaskFamily.researchgym:
            raise OverlayError(
                f"task_overlays: {name} is a {card.family.value} task; overlays are for ResearchGym task folders"
            )
    return cards


def load_task(ref: str) -> TaskCard:
    """Exactly one task (a paper task or one GAIA question)."""
    cards = resolve_tasks(ref)
    if len(cards) != 1:
        raise TaskError(f"task {ref!r} names {len(cards)} tasks; name one of them, e.g. {cards[0].ref}")
    return cards[0]


def card_for_run(
    task: str,
    task_path: str,
    task_id: str | None,
    family: str = "researchgym",
    overlay: dict[str, Any] | None = None,
) -> TaskCard:
    """The card of a run, from where its spec says the task lives and with the overlay it carries
    (`RunSpec.task_overlay`): the card its campaign's planner saw, in a pod as locally."""
    if family == "gaia2":
        from labkube.tasks.gaia2.cards import load_gaia2

        (card,) = load_gaia2(task)
        return card
    if task_id is not None:
        from labkube.tasks.gaia import load_gaia

        return load_gaia(Path(task_path), task.rsplit("/", 1)[0], task_id)[0]
    return load_researchgym(Path(task_path), task, overlay_content=overlay)


def prepare_run_workspace(card: TaskCard, dest: Path, idea_hint: bool = False) -> Path:
    """The agent's working copy for any task family; an existing one is kept (resume, retry)."""
    if card.gaia2 is not None:  # the world holds the state; the workspace stays empty
        if not workspace_prepared(dest):
            clear_half_made(dest)
            dest.mkdir(parents=True)
            commit_pristine(dest)
        return dest
    if card.gaia is None:
        return prepare_workspace(card, dest, idea_hint)
    if not workspace_prepared(dest):
        from labkube.tasks.gaia import prepare_gaia_workspace

        clear_half_made(dest)
        prepare_gaia_workspace(card, dest)
        commit_pristine(dest)
    return dest


@dataclass(frozen=True)
class PristineTask:
    """A run's pristine workspace, to be made again from its task (the card's folder: the image's, or the one the
    campaign pinned), never taken from the run folder, where on a cluster the agent can rewrite labkube's record
    (`tasks.workspace.private_workspace`)."""

    card: TaskCard
    idea_hint: bool = False

    @property
    def empty(self) -> bool:
        """Known to be the empty tree without making it: a Gaia2 world's workspace."""
        return self.card.gaia2 is not None

    def make(self, dest: Path) -> None:
        prepare_run_workspace(self.card, dest, self.idea_hint)


def grade_runs_in_workspace(card: TaskCard) -> bool:
    """Whether grading runs anything over the workspace: a paper task's grader does; GAIA scores the agent's answer
    and Gaia2 takes the world's verdict, neither reading nor running anything there."""
    return card.gaia is None and card.gaia2 is None


def grade_run(
    card: TaskCard,
    workspace: Path,
    scratch: Path,
    log_file: Path,
    answer: str | None,
    pinned: PinnedTask | None = None,
    sandboxed: bool = False,
) -> GradeOutcome:
    """Grade a run by its family's rules: the pristine grader for paper tasks, the answer for GAIA. With `pinned`,
    only from the pristine task the campaign pinned: a task that changed since is not graded (`task_changed`). With
    `sandboxed`, the grader runs in a sandbox of its own (`grade_workspace`)."""
    changed = pinned.changes(card) if pinned is not None else None
    if changed is not None:
        return GradeOutcome.not_graded(card, changed, task_changed=True)
    if card.gaia is not None:
        from labkube.tasks.gaia import grade_answer

        subtasks, score = grade_answer(card, answer)
        return GradeOutcome(subtasks, score, None)
    return grade_workspace(card, workspace, scratch, log_file, sandboxed=sandboxed)
