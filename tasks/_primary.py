"""Primary groups: what a task description marks `[Primary sub-task]`, and the subtask each mark heads.

ResearchGym marks its primary sub-tasks in the settings (`CIFAR-100: 10 tasks. [Primary Sub-task]`), sometimes
several (cross-modal retrieval marks its person Re-ID datasets and Flickr). Each mark that names a table,
section or column heads one subtask, and a run reports a score per group; the first, in table order, is the
primary subtask (the run's score).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkube.task_card import LabkubeYaml, Subtask
from labkube.tasks._markdown import compact, plain

_PRIMARY_MARK = re.compile(r"\[\s*primary[^\]]*\]", re.IGNORECASE)
_BULLET_LEAD = re.compile(r"^[\s*\-•]*(?:\*\*)?([^:*]{2,60}?)(?:\*\*)?\s*:")


def _names_before(text: str) -> list[str]:
    """The names just before a marker: back to the last `:`, `,` or `;` outside parentheses, split into
    the text outside parentheses and the items inside (`named entity recognition (MatScholar, SOFC)`)."""
    depth, start = 0, 0
    for i in range(len(text) - 1, -1, -1):
        ch = text[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                start = i + 1
                break
            depth -= 1
        elif ch in ":,;" and depth == 0:
            start = i + 1
            break
    phrase = text[start:]
    inside = re.findall(r"\(([^)]*)\)", phrase)
    outside = re.sub(r"\([^)]*\)", " ", phrase)
    names = [*re.split(r"\s+and\s+", outside), *(p for group in inside for p in re.split(r",|\s+and\s+", group))]
    return [plain(n).strip(" .") for n in names if plain(n).strip(" .")]


@dataclass
class PrimaryTag:
    """One `[Primary sub-task]` mark of task_description.md: the names just before it and, as a fallback, those
    its bullet leads with (`**Classification**:`)."""

    line: int  # 1-based, in task_description.md
    names: list[str]
    lead: list[str]

    @property
    def all_names(self) -> list[str]:
        return [*self.names, *(n for n in self.lead if n not in self.names)]


def primary_tags(description: str) -> list[PrimaryTag]:
    """Each `[Primary sub-task]` mark in the settings, with what it names (a dataset or benchmark name)."""
    tags: list[PrimaryTag] = []
    for number, line in enumerate(description.splitlines(), start=1):
        marks = list(_PRIMARY_MARK.finditer(line))
        lead_match = _BULLET_LEAD.match(line) if marks else None
        lead = _names_before(lead_match.group(1)) if lead_match else []
        start = 0
        for mark in marks:
            before = line[start : mark.start()]
            tags.append(PrimaryTag(line=number, names=_names_before(before), lead=lead))
            start = mark.end()
    return tags


def primary_candidates(description: str) -> list[str]:
    """Every name the `[Primary sub-task]` marks give, in order."""
    return list(dict.fromkeys(n for tag in primary_tags(description) for n in tag.all_names))


_MIN_NAME = 3  # a shorter name (`CL`) would match inside unrelated words
_MIN_LABEL = 4  # a table label this long may stand for a longer name (`ReID` for `person Re-ID`)


def names_subtask(name: str, subtask: Subtask, section: str, label: str) -> bool:
    """Whether a marked name names a subtask: its column or section says it, or its table's label says it or is
    said by it (`ReID` in `person Re-ID`)."""
    wanted, own = compact(name), compact(label)
    return wanted in compact(f"{subtask.column or ''} {section}") or (
        len(own) >= _MIN_LABEL and (wanted in own or own in wanted)
    )


@dataclass
class PrimaryGroups:
    primary: str | None  # the headline subtask: the group that comes first in table order
    reason: str
    groups: dict[str, str]  # group name -> the subtask heading it
    unattached: list[PrimaryTag]


def infer_primary(subtasks: list[tuple[Subtask, str]], description: str, labels: dict[int, str]) -> PrimaryGroups:
    """Each `[Primary sub-task]` mark heads the first subtask, in table order, that one of its names names (the
    names before the mark first, then its bullet's lead); the first so headed, in table order, is the primary.
    Without a mark that names one, the first subtask is."""
    groups: dict[str, str] = {}
    order = {s.id: i for i, (s, _) in enumerate(subtasks)}
    unattached: list[PrimaryTag] = []
    for tag in primary_tags(description):
        found = None
        for names in (tag.names, tag.lead):
            names = [n for n in names if len(compact(n)) >= _MIN_NAME]
            found = next(
                (
                    (n, s.id)
                    for s, section in subtasks
                    for n in names
                    if names_subtask(n, s, section, labels.get(s.table if s.table is not None else -1, ""))
                ),
                None,
            )
            if found:
                break
        if found is None:
            unattached.append(tag)
        elif found[1] not in groups.values():
            groups[found[0]] = found[1]
    if groups:
        name, primary = min(groups.items(), key=lambda item: order[item[1]])
        return PrimaryGroups(primary, f"task_description.md marks {name!r} [Primary sub-task]", groups, unattached)
    if subtasks:
        why = "no [Primary sub-task] mark names one" if unattached else "task_description.md marks no primary sub-task"
        return PrimaryGroups(subtasks[0][0].id, f"the first column of the first table ({why})", {}, unattached)
    return PrimaryGroups(None, "", {}, unattached)


def settle_primary_groups(subtasks: list[Subtask], listed: LabkubeYaml | None) -> list[Subtask]:
    """One subtask per group name: a name labkube.yaml gives a subtask leaves the subtask the marks gave it to."""
    given = {e.id for e in listed.subtasks if "primary_group" in e.model_fields_set} if listed else set()
    chosen = {s.primary_group for s in subtasks if s.id in given and s.primary_group}
    seen: set[str] = set()
    settled = []
    for s in subtasks:
        group = s.primary_group
        if group and ((s.id not in given and group in chosen) or group in seen):
            s = s.model_copy(update={"primary_group": None})
        elif group:
            seen.add(group)
        settled.append(s)
    return settled


def unattached(tags: list[PrimaryTag], subtasks: list[Subtask]) -> list[PrimaryTag]:
    """The marks no subtask heads a group of, by any of their names (labkube.yaml may have attached them)."""
    heads = {compact(s.primary_group) for s in subtasks if s.primary_group}
    return [tag for tag in tags if not any(compact(n) in heads for n in tag.all_names)]
