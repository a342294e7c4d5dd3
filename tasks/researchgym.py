"""Read a ResearchGym task directory as it ships, plus an optional `labkube.yaml` and an overlay of it.

Subtasks come from the baseline tables of `task_description.md`: one per table, section, metric row and
metric column that a `Your Method` row leaves to fill. Their ids carry the table's own label (`state_aup`),
the best listed method is the baseline, and the direction comes from an arrow or, failing that, is
inferred and says so. `labkube.yaml` (in the folder) and an overlay (a file, or a directory of them by task
name, for a task folder one does not own) add what the markdown does not say; see docs/tasks.md.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from labkube.budgets import Budgets
from labkube.settings import TASK_OVERLAY
from labkube.task_card import (
    ALWAYS_HIDDEN,
    Direction,
    Grading,
    LabkubeYaml,
    Resources,
    Subtask,
    TaskCard,
    TaskFamily,
)
from labkube.tasks._markdown import (
    YOUR_METHOD,
    Table,
    caption_words,
    cell_numbers,
    compact,
    conventional_direction,
    header_metrics,
    named_metric,
    normalize_header,
    parse_tables,
    plain,
)
from labkube.tasks._primary import PrimaryTag, infer_primary, settle_primary_groups, unattached
from labkube.tasks.workspace import links_outside

OVERLAY_ENV = TASK_OVERLAY.name  # the CLI's default `--overlay`: a labkube.yaml, or a directory of them
ASSUMED = "assumed"  # `direction_inferred` when nothing in the task says which way is better


class TaskError(ValueError):
    """A task that cannot be loaded; the message names the task, the problem and the fix."""


class OverlayError(TaskError):
    """A task that cannot be loaded with its overlay (or an overlay for no task of the campaign)."""


# -- files -----------------------------------------------------------------------------------------------------


def read_text(path: Path, task: str) -> str:
    """A task file's text, or a TaskError that says what is wrong with it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"task {task}: {path.name} is not a text (UTF-8) file") from None
    except OSError as exc:
        raise TaskError(f"task {task}: cannot read {path.name} ({exc.strerror or exc})") from None


def read_yaml_mapping(path: Path, task: str, what: str) -> dict[str, Any]:
    """The mapping a labkube.yaml (or overlay) holds; `what` names the file in errors."""
    try:
        data = yaml.safe_load(read_text(path, task)) or {}
    except RecursionError:
        raise TaskError(f"task {task}: {what} is nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise TaskError(
            f"task {task}: {what} is not valid YAML{where} ({exc.__class__.__name__}): fix that line"
        ) from None
    if not isinstance(data, dict):
        raise TaskError(f"task {task}: {what} must be a mapping of keys to values (name:, subtasks:, ...)")
    return data


# Which model a validation error's location points into, to suggest the key that was meant.
_MODELS_AT: dict[tuple[str, ...], type[BaseModel]] = {
    (): LabkubeYaml,
    ("subtasks",): Subtask,
    ("resources",): Resources,
    ("budgets",): Budgets,
    ("grading",): Grading,
}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        model = _MODELS_AT.get(tuple(str(p) for p in err["loc"][:-1] if not isinstance(p, int)))
        close = difflib.get_close_matches(key, list(model.model_fields), n=1) if model else []
        hint = f" (did you mean `{close[0]}`?)" if close else " (`labkube schema labkube-yaml` lists the keys)"
        return f"{where}: unknown key{hint}"
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"


def validate_labkube_yaml(data: dict[str, Any], task: str, what: str) -> LabkubeYaml:
    try:
        return LabkubeYaml.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"task {task}: {what}: {_first_error(exc)}") from None


def read_blocked_urls(task_dir: Path) -> tuple[list[str], list[str]]:
    path = task_dir / "blocked_urls.yaml"
    if not path.exists():
        return [], []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError, RecursionError):
        return [], ["blocked_urls.yaml is not readable YAML: no URL is blocked"]
    if isinstance(data, dict):  # ResearchGym: `urls:` and `patterns:` (globs) lists
        data = [u for v in data.values() if isinstance(v, list) for u in v]
    if not isinstance(data, list):
        return [], ["blocked_urls.yaml holds no list of URLs: no URL is blocked"]
    return [str(u) for u in data if isinstance(u, str | int)], []


# -- overlays --------------------------------------------------------------------------------------------------


def find_overlay(overlay: Path, task: str) -> tuple[Path | None, list[str]]:
    """The overlay file for `task`: `overlay` itself when it is a file, else `overlay/<task>.yaml` or
    `overlay/<task>/labkube.yaml`; a directory without either has none for it (and says so)."""
    if overlay.is_file():
        return overlay, []
    if not overlay.is_dir():
        raise TaskError(
            f"task {task}: overlay {overlay} does not exist: pass a labkube.yaml file, "
            "or a directory holding <task-name>.yaml or <task-name>/labkube.yaml"
        )
    found = [p for p in (overlay / f"{task}.yaml", overlay / task / "labkube.yaml") if p.is_file()]
    if len(found) == 2:
        raise TaskError(
            f"task {task}: overlay directory {overlay} has both {task}.yaml and {task}/labkube.yaml: keep one"
        )
    if not found:
        return None, [f"overlay directory {overlay} has no {task}.yaml or {task}/labkube.yaml: no overlay applied"]
    return found[0], []


def merge_labkube_yaml(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`: mappings merge key by key, `subtasks` merge by `id`, anything else is replaced."""
    merged = dict(base)
    for key, value in overlay.items():
        old = base.get(key)
        if key == "subtasks" and isinstance(value, list) and isinstance(old, list):
            merged[key] = _merge_subtask_entries(old, value)
        elif isinstance(value, dict) and isinstance(old, dict):
            merged[key] = merge_labkube_yaml(old, value)
        else:
            merged[key] = value
    return merged


def _merge_subtask_entries(base: list[Any], overlay: list[Any]) -> list[Any]:
    entries = [dict(e) if isinstance(e, dict) else e for e in base]
    if any(isinstance(e, dict) and e.get("primary") for e in overlay):  # the overlay moves the primary
        for e in entries:
            if isinstance(e, dict):
                e.pop("primary", None)
    for entry in overlay:
        same = next(
            (e for e in entries if isinstance(e, dict) and isinstance(entry, dict) and e.get("id") == entry.get("id")),
            None,
        )
        if same is None:
            entries.append(entry)
        else:
            same.update(entry)
    return entries


def task_folder_name(ref: str) -> str:
    """The folder name a task reference ends in (`researchgym/nanogpt`, `~/tasks/nanogpt/`: `nanogpt`), which
    keys overlays; a reference to a folder on another machine (a cluster's tasks volume) works the same."""
    path = Path(ref.partition("#")[0].rstrip("/")).expanduser()
    return path.resolve().name if path.is_dir() else path.name


def read_task_overlays(overlay: Path, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """The overlay of each task folder named in `tasks` that `overlay` (a file or a directory) has, by folder
    name, each checked on its own: what a campaign carries to its planner and runs (`task_overlays`)."""
    found: dict[str, dict[str, Any]] = {}
    for task in dict.fromkeys(task_folder_name(t) for t in tasks):
        path, _ = find_overlay(overlay.expanduser(), task)
        if path is not None:
            what = f"overlay {path}"
            found[task] = read_yaml_mapping(path, task, what)
            validate_labkube_yaml(found[task], task, what)
    return found


# -- subtasks from the tables ---------------------------------------------------------------------------------


@dataclass
class Inference:
    """What the tables of a task description give."""

    subtasks: list[Subtask]
    problems: list[str]  # tables that give nothing to score
    primary_reason: str  # why the primary subtask is the one it is
    unattached: list[PrimaryTag] = field(default_factory=list)  # primary marks that name no subtask


def id_part(text: str) -> str:
    """`ImageNet-R (N = 5)` -> `imagenet_r_n5`, `Recall@1` -> `recall_at_1`."""
    text = re.sub(r"\b([a-z])\s*=\s*(\d+)", r"\1\2", text.lower())
    return re.sub(r"[^a-z0-9]+", "_", text.replace("@", "_at_")).strip("_")


def subtask_id(parts: list[str], taken: set[str], fallback: str) -> str:
    """The id of label, section, column and row metric, leaving out a part the later ones already say
    (`ImageNet-R` before `ImageNet-R (N = 5) Acc`)."""
    slugs = [s for s in (id_part(p) for p in parts) if s]
    kept = [s for i, s in enumerate(slugs) if compact(s) not in compact("".join(slugs[i + 1 :]))]
    sid = "_".join(kept) or fallback
    if sid in taken:
        sid = next(f"{sid}_{n}" for n in range(2, 10_000) if f"{sid}_{n}" not in taken)
    taken.add(sid)
    return sid


def arrow_metrics(tables: list[Table]) -> dict[str, str]:
    """Metric name -> direction, from every header with an arrow (`CPD ↑` says CPD is higher-is-better
    wherever it appears); a name seen with both arrows is left out."""
    seen: dict[str, set[str]] = defaultdict(set)
    for table in tables:
        for header in table.header[1:]:
            for name, direction in header_metrics(header):
                if direction and name:
                    seen[name].add(direction)
                    last = name.split()[-1]
                    if re.fullmatch(r"[A-Za-z][\w@-]*", last):  # `Acc` of `ImageNet-R (N = 5) Acc`
                        seen[last].add(direction)
    return {name: next(iter(ds)) for name, ds in seen.items() if len(ds) == 1}


def table_labels(tables: list[Table]) -> dict[int, str]:
    """Each table's label; two tables with the same label and a column in common get a word of their
    caption that tells them apart (`COCO-C image`, `COCO-C text`), else their number."""
    labels = {t.index: t.label for t in tables}
    by_label: dict[str, list[Table]] = defaultdict(list)
    for t in tables:
        if t.label:
            by_label[id_part(t.label)].append(t)
    for same in by_label.values():
        shared = set.intersection(*({normalize_header(h) for h in t.header[1:]} for t in same))
        if len(same) < 2 or not shared:
            continue
        for t in same:
            others = set().union(*(caption_words(o.caption) for o in same if o is not t))
            own = [w for w in caption_words(t.caption) if w not in others and w not in id_part(t.label).split("_")]
            labels[t.index] = f"{t.label} {own[0] if own else 'table ' + (t.number or str(t.index))}"
    return labels


def _direction(
    name: str, arrow: str | None, row_metric: str, caption_metric: tuple[str, str, str] | None, known: dict[str, str]
) -> tuple[str, str | None, str]:
    """(direction, why it was inferred or None when an arrow states it, the metric's display name) of a column:
    its arrow, else the arrow its metric has elsewhere, else the metric's convention, else the caption's metric."""
    display = f"{name} {row_metric}".strip()
    if arrow:
        return arrow, None, display
    for metric in (m for m in (row_metric, name) if m):
        inferred = _metric_direction(metric, known)
        if inferred:
            return inferred[0], inferred[1], display
    if caption_metric:
        direction, why, metric = caption_metric
        return direction, f"caption: {why}", f"{name} {metric}"
    return "higher", ASSUMED, display


_ARROW = {"higher": "↑", "lower": "↓"}


def _metric_direction(text: str, known: dict[str, str], prose: bool = False) -> tuple[str, str, str] | None:
    """(direction, why, the metric) for a metric name, or the one metric a caption names (`prose`): the arrow
    it has in another table, else its field's convention."""
    if prose:
        named = named_metric(text, known)
        if named:
            return named[0], f"{named[1]} {_ARROW[named[0]]} in another table", named[1]
    else:
        for candidate in (text, text.split()[-1]):
            if candidate in known:
                return known[candidate], f"{candidate} {_ARROW[known[candidate]]} in another table", candidate
    convention = conventional_direction(text, prose=prose)
    return (convention[0], f"{convention[1]} by convention", convention[1]) if convention else None


def _blocks(rows: list[int]) -> list[list[int]]:
    """Runs of consecutive `Your Method` rows: one run per section of the table."""
    blocks: list[list[int]] = []
    for i in rows:
        if blocks and blocks[-1][-1] == i - 1:
            blocks[-1].append(i)
        else:
            blocks.append([i])
    return blocks


def table_subtasks(table: Table, known: dict[str, str], taken: set[str]) -> list[tuple[Subtask, str]]:
    """The table's subtasks, each with the name of its section ("" when the table has one)."""
    your_rows = table.method_rows(YOUR_METHOD)
    blocks = _blocks(your_rows)
    metric_col = table.metric_column()
    caption_metric = _metric_direction(table.caption, known, prose=True) if table.caption else None
    subtasks: list[tuple[Subtask, str]] = []
    for n, block in enumerate(blocks):
        start = blocks[n - 1][-1] + 1 if n else 0
        listed = range(start, block[0]) if len(blocks) > 1 else range(len(table.rows))
        section = plain(table.rows[start][0]) if len(blocks) > 1 else ""
        for row_index in block:
            row_metric = plain(table.rows[row_index][metric_col]) if metric_col is not None else ""
            methods = [
                table.rows[r]
                for r in listed
                if r not in your_rows
                and (metric_col is None or normalize_header(table.rows[r][metric_col]) == normalize_header(row_metric))
            ]
            for col, header in enumerate(table.header):
                if col in (0, metric_col):
                    continue
                for part, (name, arrow) in enumerate(header_metrics(header)):
                    direction, why, metric = _direction(name, arrow, row_metric, caption_metric, known)
                    values = [(nums[part], plain(r[0])) for r in methods if len(nums := cell_numbers(r[col])) > part]
                    best = (min if direction == "lower" else max)(values, key=lambda v: v[0]) if values else None
                    subtask = Subtask(
                        id=subtask_id([table.label, section, name, row_metric], taken, f"t{table.index}_col{col}"),
                        metric=metric or header,
                        direction=Direction(direction),
                        direction_inferred=why,
                        baseline=best[0] if best else None,
                        baseline_method=best[1] if best else None,
                        table=table.index,
                        column=header,
                        part=part,
                        row=your_rows.index(row_index) if len(your_rows) > 1 else None,
                    )
                    subtasks.append((subtask, section))
    return subtasks


def infer_tables(tables: list[Table], description: str = "") -> Inference:
    known = arrow_metrics(tables)
    results = [t for t in tables if t.method_rows(YOUR_METHOD)]
    labels = table_labels(results)
    for table in results:
        table.label = labels[table.index]
    taken: set[str] = set()
    with_sections = [pair for t in results for pair in table_subtasks(t, known, taken)]
    problems = []
    if not tables:
        problems.append("task_description.md has no markdown table: no baselines to beat")
    elif not with_sections:
        problems.append("no baseline table has a `Your Method` row: nothing to score")
    inferred = infer_primary(with_sections, description, {t.index: t.label for t in tables})
    heads = {sid: name for name, sid in inferred.groups.items()}
    subtasks = [
        s.model_copy(update={"primary": s.id == inferred.primary, "primary_group": heads.get(s.id)})
        for s, _ in with_sections
    ]
    return Inference(subtasks, problems, inferred.reason, inferred.unattached)


def infer_subtasks(tables: list[Table], description: str = "") -> tuple[list[Subtask], list[str]]:
    """One subtask per table, section, metric row and metric column; the best listed method is the baseline."""
    inference = infer_tables(tables, description)
    return inference.subtasks, inference.problems + gap_warnings(inference.subtasks, tables, inference.primary_reason)


# -- subtasks listed in labkube.yaml ---------------------------------------------------------------------------


def _given(entry: Subtask, listed: LabkubeYaml) -> set[str]:
    given = set(entry.model_fields_set) - {"id"}
    if listed._primary_defaulted and entry is listed.subtasks[0]:
        given.discard("primary")
    return given


def _same_cell(inferred: Subtask, entry: Subtask) -> bool:
    return (
        entry.table == inferred.table
        and normalize_header(entry.column or "") == normalize_header(inferred.column or "")
        and entry.part == inferred.part
        and entry.row == inferred.row
    )


def apply_listed_subtasks(
    inferred: list[Subtask], listed: LabkubeYaml | None, task: str, source: dict[str, str]
) -> tuple[list[Subtask], bool]:
    """The subtasks after labkube.yaml (and its overlay): an entry updates the inferred subtask of its id (or
    of the cell it reads, renaming it), or adds a subtask. Returns them and whether labkube.yaml chose the
    primary. `source` names the file that listed an id, for errors."""
    if listed is None or not listed.subtasks:
        return inferred, False
    unclaimed = {s.id: s for s in inferred}
    target: dict[str, str] = {}  # entry id -> id of the inferred subtask it updates
    for entry in listed.subtasks:
        if entry.id in unclaimed:
            target[entry.id] = unclaimed.pop(entry.id).id
    for entry in listed.subtasks:
        if entry.id not in target and {"table", "column"} <= entry.model_fields_set:
            cell = next((s for s in unclaimed.values() if _same_cell(s, entry)), None)
            if cell is not None:
                target[entry.id] = unclaimed.pop(cell.id).id
    by_id = {s.id: s for s in inferred}
    updated: dict[str, Subtask] = {}  # inferred id -> its updated subtask
    listed_order: list[Subtask] = []
    added: list[Subtask] = []
    for entry in listed.subtasks:
        given = _given(entry, listed)
        update: dict[str, Any] = {f: getattr(entry, f) for f in given} | {"id": entry.id}
        if "direction" in given:
            update["direction_inferred"] = None
        if entry.id in target:
            subtask = by_id[target[entry.id]].model_copy(update=update)
            updated[target[entry.id]] = subtask
        elif entry.metric:
            update.setdefault("direction_inferred", ASSUMED)
            subtask = entry.model_copy(update=update | {"primary": "primary" in given and entry.primary})
            added.append(subtask)
        else:
            close = difflib.get_close_matches(entry.id, list(by_id), n=3, cutoff=0.5)
            ids = ", ".join(close or list(by_id)[:3]) or "none: the tables give no subtask"
            raise TaskError(
                f"task {task}: {source.get(entry.id, 'labkube.yaml')}: subtask `{entry.id}` is not one the tables "
                f"give (nearest: {ids}); use one of their ids, or give `metric` to add a subtask"
            )
        listed_order.append(subtask)
    subtasks = listed_order if listed.only_listed_subtasks else [updated.get(s.id, s) for s in inferred] + added
    chosen = next((e.id for e in listed.subtasks if e.primary and "primary" in _given(e, listed)), None)
    primary = chosen or next((s.id for s in subtasks if s.primary), subtasks[0].id if subtasks else None)
    return [s.model_copy(update={"primary": s.id == primary}) for s in subtasks], chosen is not None


# -- what could not be inferred ---------------------------------------------------------------------------------


def _names(items: list[str], most: int = 4) -> str:
    unique = list(dict.fromkeys(items))
    shown = ", ".join(repr(x) for x in unique[:most])
    return shown + (f" and {len(unique) - most} more" if len(unique) > most else "")


def _fix(subtask_id: str, **fields: object) -> str:
    """The labkube.yaml line that sets `fields` of one subtask."""
    body = ", ".join(f"{k}: {v}" for k, v in fields.items())
    return f"`subtasks: [{{id: {subtask_id}, {body}}}]`"


def missing_cell_warnings(subtasks: list[Subtask], tables: list[Table]) -> list[str]:
    """Subtasks that read a table or column task_description.md lacks (labkube.yaml names it): never a value."""
    warnings = []
    for s in subtasks:
        if s.table is None:
            continue
        if s.table >= len(tables):
            warnings.append(
                f"subtask {s.id} reads table {s.table}, but task_description.md has {len(tables)} table(s): it can "
                "only get a value from the JSON summary (labkube.yaml: fix its `table`)"
            )
        elif s.column and tables[s.table].column(s.column) is None:
            warnings.append(
                f"subtask {s.id} reads column {s.column!r} of table {s.table} (line {tables[s.table].line}), which "
                f"has no such column (it has {_names(tables[s.table].header[1:])}; labkube.yaml: fix its `column`)"
            )
    return warnings


def gap_warnings(
    subtasks: list[Subtask], tables: list[Table], primary_reason: str | None, primary_given: bool = False
) -> list[str]:
    """What the card could not take from the task as stated, each with the labkube.yaml line that fixes it."""
    where_of = {t.index: f"table {t.index} (line {t.line}{', ' + repr(t.label) if t.label else ''})" for t in tables}
    warnings: list[str] = []
    groups: dict[tuple[str, str, bool], list[Subtask]] = defaultdict(list)
    for s in subtasks:
        if s.direction_inferred:
            where = where_of.get(s.table, "labkube.yaml") if s.table is not None else "labkube.yaml"
            groups[(where, s.direction.value, s.direction_inferred == ASSUMED)].append(s)
    for (where, direction, assumed), group in groups.items():
        other = "lower" if direction == "higher" else "higher"
        fix = _fix(group[0].id, direction=other) + (
            f" ({len(group)} subtasks: one entry each)" if len(group) > 1 else ""
        )
        names = _names([s.metric for s in group])
        if assumed:
            warnings.append(
                f"{where}: no ↑/↓ arrow and no known metric for {names}: assumed {direction} is better; "
                f"if {other} is, add to labkube.yaml {fix}"
            )
        else:
            why = "; ".join(dict.fromkeys(s.direction_inferred or "" for s in group))
            warnings.append(
                f"{where}: no ↑/↓ arrow for {names}: inferred {direction} is better ({why}); "
                f"if not, add to labkube.yaml {fix}"
            )
    missing = [s for s in subtasks if s.baseline is None]
    if missing:
        warnings.append(
            f"no baseline value for {_names([s.id for s in missing])} (no listed method has a number there): "
            f"add to labkube.yaml {_fix(missing[0].id, baseline='<value>')}"
        )
    primary = next((s for s in subtasks if s.primary), None)
    if primary is not None and not primary_given and len(subtasks) > 1:
        warnings.append(
            f"primary subtask {primary.id}: {primary_reason or 'the first one'}; "
            f"to score another, add to labkube.yaml {_fix('<id>', primary='true')}"
        )
    no_sota = [s for s in subtasks if s.sota is None]
    if no_sota:
        which = "any subtask" if len(no_sota) == len(subtasks) else _names([s.id for s in no_sota])
        example = primary if primary is not None and primary.sota is None else no_sota[0]
        warnings.append(
            f"no SOTA values for {which} (task_description.md does not give the paper's numbers): fraction of "
            f"SOTA is not computed; add them in labkube.yaml or an overlay, e.g. {_fix(example.id, sota='<value>')}"
        )
    return warnings


def primary_tag_warnings(tags: list[PrimaryTag]) -> list[str]:
    """A `[Primary sub-task]` mark that names no table, section or column: its group has no score."""
    warnings = []
    for tag in tags:
        names = tag.names or tag.lead
        what = _names(names) if names else "nothing before it"
        fix = _fix("<id>", primary_group=json.dumps(names[0] if names else "<name>"))
        warnings.append(
            f"task_description.md line {tag.line} marks {what} [Primary sub-task], but no table, section or column "
            f"names it: no score is reported for it; to report one, add to labkube.yaml {fix}"
        )
    return warnings


# What says a task trains on a GPU: words of the description or install.sh, and CUDA builds in requirements.txt.
_GPU_WORDS = re.compile(r"\b(?:CUDA|cuDNN|GPUs?|NCCL)\b|\.cuda\(|device\s*=\s*['\"]cuda", re.IGNORECASE)
_GPU_REQUIREMENT = re.compile(r"\+cu\d{2,3}\b|/whl/cu\d{2,3}\b|cuda|^nvidia-|-gpu\b|\[gpu\]", re.IGNORECASE)
_NO_GPU = re.compile(r"\b(?:no|without|not need\w*|not require\w*)\s+(?:a\s+)?GPU|\bCPU[- ]only\b", re.IGNORECASE)


def gpu_mentions(task_dir: Path, description: str) -> list[tuple[str, int, str]]:
    """(file, line, text) of each line that says the task trains on a GPU."""
    found = []
    sources = [("task_description.md", description, _GPU_WORDS), ("install.sh", None, _GPU_WORDS)]
    sources.append(("requirements.txt", None, _GPU_REQUIREMENT))
    for name, text, pattern in sources:
        if text is None:
            try:
                text = (task_dir / name).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
        for number, line in enumerate(text.splitlines(), start=1):
            code = line.split("#", 1)[0] if name != "task_description.md" else line
            if pattern.search(code) and not _NO_GPU.search(line):
                found.append((name, number, line.strip()))
    return found


def gpu_warnings(task_dir: Path, description: str, resources: Resources) -> list[str]:
    """A task that trains on a GPU by its own files, but whose card gives its runs none."""
    if resources.gpus:
        return []
    mentions = gpu_mentions(task_dir, description)
    if not mentions:
        return []
    name, line, text = mentions[0]
    shown = text if len(text) <= 80 else text[:77] + "..."
    more = f" (and {len(mentions) - 1} more lines)" if len(mentions) > 1 else ""
    return [
        f"{name} line {line} says the task uses a GPU (`{shown}`){more}, but the card gives its runs none "
        "(resources.gpus: 0): add to labkube.yaml `resources: {gpus: 1}`"
    ]


# -- the task card ---------------------------------------------------------------------------------------------


def load_researchgym(
    task_dir: Path,
    ref: str,
    overlay: Path | None = None,
    *,
    overlay_content: dict[str, Any] | None = None,
) -> TaskCard:
    """The card of a ResearchGym task folder, with its labkube.yaml and an overlay merged over it: the file
    `overlay` finds for the folder, or `overlay_content` (a labkube.yaml mapping a campaign carries, named
    "campaign overlay for <task>" in errors and in `card.overlay`). An error the overlay causes is an
    `OverlayError`."""
    if overlay is not None and overlay_content is not None:
        raise ValueError("pass an overlay path or overlay content, not both")
    task_dir = task_dir.resolve()
    if not task_dir.is_dir():
        raise TaskError(f"task {ref}: {task_dir} is not a directory")
    md_path = task_dir / "task_description.md"
    if not md_path.exists():
        raise TaskError(f"task {ref}: no task_description.md in {task_dir} (is this a ResearchGym task?)")
    if not md_path.is_file():
        raise TaskError(f"task {ref}: task_description.md is not a file")
    try:
        description = md_path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        description = "\0"  # refused below, with a binary file's message
    except OSError as exc:
        raise TaskError(f"task {ref}: cannot read task_description.md ({exc.strerror or exc})") from None
    # What the agent is given to read and the baselines are parsed from: a run on nothing or on bytes is no run.
    if "\0" in description:
        raise TaskError(
            f"task {ref}: task_description.md is not text (binary, or not UTF-8); write the task's description "
            "as UTF-8 markdown"
        )
    if not description.strip():
        raise TaskError(
            f"task {ref}: task_description.md is empty; describe the task there, with a baseline table whose "
            "`Your Method` row the grader fills"
        )
    task = task_dir.name
    warnings: list[str] = []
    data: dict[str, Any] = {}
    source: dict[str, str] = {}
    if (task_dir / "labkube.yaml").exists():
        data = read_yaml_mapping(task_dir / "labkube.yaml", task, "labkube.yaml")
        validate_labkube_yaml(data, task, "labkube.yaml")
    over: dict[str, Any] | None = None
    what = shown = ""  # the overlay as errors name it, and as the card records it
    if overlay is not None:
        overlay_file, overlay_warnings = find_overlay(overlay.expanduser(), task)
        warnings.extend(overlay_warnings)
        if overlay_file is not None:
            what, shown = f"overlay {overlay_file}", str(overlay_file)
            over = read_yaml_mapping(overlay_file, task, what)
    elif overlay_content is not None:
        what = shown = f"campaign overlay for {task}"
        if not isinstance(overlay_content, dict):
            raise OverlayError(f"task {task}: {what} must be a mapping of keys to values (name:, subtasks:, ...)")
        over = copy.deepcopy(overlay_content)  # the campaign's copy stays as it was
    tables, problems = parse_tables(description)
    warnings.extend(problems)
    inference = infer_tables(tables, description)
    warnings.extend(inference.problems)
    try:  # an error here, with an overlay, is reported as the overlay's (the folder's labkube.yaml alone was checked)
        if over is not None:
            validate_labkube_yaml(over, task, what)
            source = {e["id"]: what for e in over.get("subtasks") or [] if isinstance(e, dict) and "id" in e}
            data = merge_labkube_yaml(data, over)
        merged = "labkube.yaml" if over is None else f"labkube.yaml with {what}"
        extra = validate_labkube_yaml(data, task, merged) if data else None
        subtasks, primary_given = apply_listed_subtasks(inference.subtasks, extra, task, source)
    except TaskError as exc:
        if over is None or isinstance(exc, OverlayError):
            raise
        raise OverlayError(str(exc)) from None
    subtasks = settle_primary_groups(subtasks, extra)
    warnings.extend(gap_warnings(subtasks, tables, inference.primary_reason, primary_given))
    warnings.extend(missing_cell_warnings(subtasks, tables))
    warnings.extend(primary_tag_warnings(unattached(inference.unattached, subtasks)))
    warnings.extend(gpu_warnings(task_dir, description, extra.resources if extra else Resources()))
    if not (task_dir / "grading" / "grade.sh").exists():
        warnings.append("no grading/grade.sh: runs cannot be graded")
    blocked, blocked_warnings = read_blocked_urls(task_dir)
    warnings.extend(blocked_warnings)
    extra = extra or LabkubeYaml()
    hidden = list(ALWAYS_HIDDEN) + list(extra.hidden)
    if extra.oracle:
        hidden.append(extra.oracle)
    escaping = links_outside(task_dir, hidden)
    if escaping:
        link, target = escaping[0]
        raise TaskError(
            f"task {ref}: {link} is a symbolic link to {target}, outside the task folder, which would reach the "
            "agent's workspace: put the file itself in the folder, remove the link, or hide it (labkube.yaml hidden:)"
        )
    return TaskCard(
        ref=ref,
        name=extra.name or task,
        family=TaskFamily.researchgym,
        path=str(task_dir),
        description=description,
        subtasks=subtasks,
        resources=extra.resources,
        budgets=extra.budgets,
        grading=extra.grading,
        protected=list(extra.protected),
        hidden=hidden,
        oracle=extra.oracle,
        baseline_check=extra.baseline_check,
        heldout=list(extra.heldout),
        required_seeds=list(extra.required_seeds),
        seeds_json_key=extra.seeds_json_key,
        blocked_urls=blocked,
        network=extra.network,
        overlay=shown or None,
        warnings=warnings,
    )
