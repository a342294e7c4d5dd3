"""The task card: everything labkube knows about one task.

A ResearchGym task directory is read as it ships; `labkube.yaml` beside it adds
what the markdown does not say. Both end up in one `TaskCard`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from labkube.budgets import Budgets


class Direction(StrEnum):
    higher = "higher"
    lower = "lower"


class TaskFamily(StrEnum):
    researchgym = "researchgym"
    gaia2 = "gaia2"
    gaia = "gaia"


class NetworkAccess(StrEnum):
    """What the agent's commands may reach outside their sandbox (docs/sandbox.md, "The network")."""

    none = "none"  # no network: the web only through the agent's web tools, which run in the harness
    proxy = "proxy"  # HTTP and HTTPS through the run's proxy, which applies the task's blocked URLs


class Subtask(BaseModel):
    """One scored quantity: a metric column of one baseline table."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    metric: str = Field(
        default="",
        description="Metric name as the task description writes it. In labkube.yaml only a new subtask (an id "
        "the tables do not give) needs it; an entry with a table's id takes what it leaves out from the table.",
    )
    direction: Direction = Direction.higher
    direction_inferred: str | None = Field(
        default=None,
        description="Why the direction is what it is when no ↑/↓ arrow and no labkube.yaml states it (the metric's "
        "convention, the caption's metric, the same metric's arrow in another table), or `assumed`.",
    )
    baseline: float | None = Field(default=None, description="Best listed method's value.")
    baseline_method: str | None = Field(default=None, description="The listed method whose value is the baseline.")
    sota: float | None = Field(default=None, description="Paper's value; never shown to the agent.")
    primary: bool = False
    primary_group: str | None = Field(
        default=None,
        description="The group of subtasks a `[Primary sub-task]` mark of task_description.md names (the name it "
        "matched: `Flickr`, `ReID`) when this subtask heads it; a run reports a score per group. One subtask per "
        "name; labkube.yaml may set it to attach a mark that names no table, section or column.",
    )
    json_key: str | None = Field(
        default=None,
        description="Dotted path of this subtask's value in the grader's JSON summary, e.g. `tables.0.acc`.",
    )
    table: int | None = Field(default=None, description="Index of the markdown table holding the row.")
    column: str | None = Field(default=None, description="Column header holding the value.")
    part: int = Field(default=0, ge=0, description="Which number of a cell that holds several (`Acc ↑ AAA ↑`).")
    row: int | None = Field(
        default=None,
        ge=0,
        description="Which `Your Method` row holds the value (0: the first), in a table with one per section "
        "or per metric; None: the table has one.",
    )


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(default=0, ge=0)
    cpus: float = Field(default=1.0, gt=0)
    memory_gb: float = Field(default=4.0, gt=0)
    image: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    shm_gb: float | None = Field(
        default=None, gt=0, description="Size of /dev/shm in pods (data loaders, NCCL); default: half of memory_gb."
    )
    disk_gb: float | None = Field(
        default=None,
        gt=0,
        description="Disk the run needs: on a cluster, the size of its own claim (claim-per-run mode; the pod's "
        "ephemeral storage stays the chart's), else the ephemeral storage its pod may use (requests = limits); "
        "default: the chart's.",
    )
    runtime_class: str | None = Field(
        default=None, description="RuntimeClass of the run's pod (gVisor, Kata), if the chart allows it."
    )


class Grading(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = "bash grading/grade.sh"
    summary: str | None = Field(
        default=None,
        description="JSON summary the grader writes, relative to the task root; a glob "
        "(`grading/runs/*/grading_summary.json`) reads the newest file it matches.",
    )
    timeout_s: float = Field(default=600, gt=0)
    interval_s: float | None = Field(default=None, gt=0, description="Grade periodically during the run.")

    @field_validator("summary")
    @classmethod
    def _summary_inside_task(cls, value: str | None) -> str | None:
        if value is not None and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise ValueError(f"{value!r} must be a path (or glob) inside the task folder, like grading/summary.json")
        return value


class LabkubeYaml(BaseModel):
    """The optional `labkube.yaml` beside a ResearchGym task directory, or an overlay of it kept elsewhere.

    `subtasks` entries are matched to the subtasks the baseline tables give, by `id` (or by the cell they
    read: `table` + `column` + `part` + `row`, which renames it): a match takes the fields given here, the
    rest comes from the table; an entry that matches none adds a subtask (it needs `metric`)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    subtasks: list[Subtask] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    budgets: Budgets = Field(default_factory=Budgets)
    grading: Grading = Field(default_factory=Grading)
    protected: list[str] = Field(
        default_factory=lambda: ["grading/**", "task_description.md"],
        description="Glob patterns restored from the pristine task before grading.",
    )
    hidden: list[str] = Field(default_factory=list, description="Extra paths withheld from the agent's workspace.")
    oracle: str | None = Field(default=None, description="Reference solution plan (YAML), relative path.")
    heldout: list[str] = Field(
        default_factory=list, description="Held-out labels or answers: only the task's own code may read them."
    )
    required_seeds: list[int] = Field(default_factory=list, description="Seeds the task requires results for.")
    seeds_json_key: str | None = Field(
        default=None, description="Where the grader's JSON summary lists the seeds it graded."
    )
    baseline_check: str | None = Field(
        default=None,
        description="Command that re-runs the best baseline in a scratch copy of the task and prints "
        "`{subtask_id: value}` as JSON on its last line; tests compare it with the `baseline` values.",
    )
    only_listed_subtasks: bool = Field(
        default=False,
        description="Score only the subtasks listed here; by default the ones the tables give are kept too.",
    )
    network: NetworkAccess = Field(
        default=NetworkAccess.none,
        description="The agent's commands' way out: `none` (no network; the web only through the agent's web "
        "tools) or `proxy` (HTTP and HTTPS through the run's proxy, which refuses the task's blocked URLs and "
        "every loopback, link-local and private address). Applies to sandboxed runs; --sandbox none runs keep "
        "the host's network.",
    )
    # True when no entry says `primary: true` and the first was made primary: then no entry chose it.
    _primary_defaulted: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _one_primary(self) -> LabkubeYaml:
        primaries = [s.id for s in self.subtasks if s.primary]
        if len(primaries) > 1:
            raise ValueError(f"more than one primary subtask: {', '.join(primaries)}")
        if self.subtasks and not primaries:
            self.subtasks[0].primary = True
            self._primary_defaulted = True
        ids = [s.id for s in self.subtasks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate subtask ids: {', '.join(dupes)}")
        return self


class GaiaQuestion(BaseModel):
    """One GAIA (v1) question, as a row of the dataset's `metadata.jsonl`."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    task_id: str
    question: str = Field(alias="Question")
    level: int = Field(alias="Level", ge=1, le=3)
    final_answer: str = Field(alias="Final answer", description="Ground truth; never shown to the agent.")
    file_name: str = ""


class Gaia2Card(BaseModel):
    """A Gaia2 scenario: what the world process loads, and its capability tags."""

    scenario_id: str
    source: str = Field(description="What the world loads: an ARE registry id, a JSON file path or JSON text.")
    capabilities: list[str] = Field(default_factory=list)


ALWAYS_HIDDEN = ("requirements.txt", "install.sh", "idea_hint.txt", "labkube.yaml")


class TaskCard(BaseModel):
    """A task as labkube runs it."""

    model_config = ConfigDict(extra="forbid")

    ref: str = Field(description="How the user named it: `researchgym/<name>` or a path.")
    name: str
    family: TaskFamily = TaskFamily.researchgym
    path: str = Field(description="Absolute path of the pristine task directory.")
    description: str = ""
    subtasks: list[Subtask] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    budgets: Budgets = Field(default_factory=Budgets)
    grading: Grading = Field(default_factory=Grading)
    protected: list[str] = Field(default_factory=list)
    hidden: list[str] = Field(default_factory=list)
    oracle: str | None = None
    baseline_check: str | None = None
    heldout: list[str] = Field(default_factory=list)
    required_seeds: list[int] = Field(default_factory=list)
    seeds_json_key: str | None = None
    blocked_urls: list[str] = Field(default_factory=list)
    network: NetworkAccess = Field(default=NetworkAccess.none, description="The agent's commands' way out.")
    scoring: Literal["normalized", "pass_fail"] = "normalized"
    group: str = Field(default="", description="What reports aggregate by (a task, or a GAIA level).")
    gaia: GaiaQuestion | None = None
    gaia2: Gaia2Card | None = None
    overlay: str | None = Field(
        default=None, description="The overlay merged over the task's labkube.yaml (`--overlay`), if any."
    )
    warnings: list[str] = Field(default_factory=list, description="What could not be inferred.")

    @property
    def folder(self) -> str:
        """The name of the task's folder (`path` is resolved): what keys the campaign's overlay for it and names
        its environment."""
        return Path(self.path).name

    @property
    def primary(self) -> Subtask | None:
        return next((s for s in self.subtasks if s.primary), self.subtasks[0] if self.subtasks else None)

    @property
    def primary_groups(self) -> dict[str, Subtask]:
        """Each primary group the task tags, by name, with the subtask that heads it (its score is the group's)."""
        return {s.primary_group: s for s in self.subtasks if s.primary_group}
