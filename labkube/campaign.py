"""A campaign: tasks x models x seeds, with budgets and limits."""

from __future__ import annotations

import math
import os
from itertools import product
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from labkube.budgets import Budgets
from labkube.model_ref import API_PROVIDERS, absolute_replay, parse_model
from labkube.run_spec import (
    DEFAULT_AGENT,
    DEFAULT_JUDGE_TIMEOUT_S,
    INSPECTOR_BUDGET_HELP,
    INSPECTOR_MODEL_HELP,
    JUDGE_BUDGET_HELP,
    JUDGE_MODEL_HELP,
    JUDGE_TIMEOUT_HELP,
    PAUSE_EVERY_HOURS_HELP,
    PAUSE_EVERY_USD_HELP,
    WORLD_VALIDATION_LIMIT_S,
    AgentName,
    RunSpec,
    before_judge_split,
    make_run_id,
)
from labkube.sandbox import SandboxMode
from labkube.task_card import TaskCard, TaskFamily

MAX_SEEDS = 10_000


class CampaignSpec(BaseModel):
    """Same schema whether it came from the CLI, a YAML file or a Kubernetes resource."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="campaign", pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
    tasks: list[str] = Field(min_length=1)
    models: list[str] = Field(default_factory=lambda: ["oracle"], min_length=1)
    agents: list[AgentName] = Field(
        default_factory=lambda: [DEFAULT_AGENT],
        min_length=1,
        description="Scaffolds to run every task x model with: rg-agent, are-default (ARE's own agent; Gaia2).",
    )
    seeds: int | list[int] = Field(default=1, description="A count (0..N-1) or explicit seeds.")
    budgets: Budgets = Field(default_factory=Budgets)
    concurrency: int = Field(default=4, ge=1, le=10_000)
    gpu_hours_cap: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    pause_every_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=PAUSE_EVERY_USD_HELP)
    pause_every_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=PAUSE_EVERY_HOURS_HELP)
    idea_hint: bool = False
    grade_interval_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    prices: dict[str, tuple[float, ...]] = Field(default_factory=dict)
    backend: str = Field(default="local", pattern="^(local|k8s)$")
    sandbox: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description="Local backend: bwrap runs each run's agent and grader in a bubblewrap sandbox (the default); "
        "none runs them unsandboxed, marked so in every report. On a cluster the pod is the room.",
    )
    context_threshold: int | None = Field(
        default=None,
        gt=0,
        description="Hand off when the context passes this many tokens (default: 3/4 of the window).",
    )
    gaia2_noise: bool = Field(
        default=False, description="Gaia2: ARE's noise augmentation (tool failures, extra events), seeded."
    )
    gaia2_a2a: float = Field(
        default=0.0, ge=0, le=1, description="Gaia2: share of apps ARE turns into app agents (agent2agent), seeded."
    )
    gaia2_a2a_model: str | None = Field(
        default=None, description="Gaia2: model for the agent2agent app agents (default: the run's model)."
    )
    think_time_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Gaia2: simulated seconds charged per model call (default: as measured).",
    )
    model_timeout_s: float = Field(
        default=900.0, gt=0, allow_inf_nan=False, description="Per model call; a time-out is retried."
    )
    judge_model: str | None = Field(default=None, description=JUDGE_MODEL_HELP)
    gaia2_judge_budget_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=JUDGE_BUDGET_HELP)
    gaia2_judge_timeout_s: float = Field(
        default=DEFAULT_JUDGE_TIMEOUT_S, gt=0, lt=WORLD_VALIDATION_LIMIT_S, description=JUDGE_TIMEOUT_HELP
    )
    inspector_model: str | None = Field(default=None, description=INSPECTOR_MODEL_HELP)
    inspector_budget_usd: float = Field(default=1.0, gt=0, allow_inf_nan=False, description=INSPECTOR_BUDGET_HELP)
    api_key_env: dict[str, str] = Field(
        default_factory=dict, description="Model string -> environment variable holding its API key."
    )
    overlay: str | None = Field(
        default=None,
        description="Where `task_overlays` was read from (local backend; the CLI reads it): a labkube.yaml for "
        "one task, or a directory of <task-name>.yaml or <task-name>/labkube.yaml files.",
    )
    task_overlays: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Task folder name -> labkube.yaml mapping merged over that task's own (SOTA values, "
        "resources, budgets); checked when the campaign is planned.",
    )

    @field_validator("models")
    @classmethod
    def _known_models(cls, models: list[str]) -> list[str]:
        for i, m in enumerate(models):
            parse_model(m)
            if m in models[:i]:
                raise ValueError(f"model {m} is given twice; give it once")
        return models

    @field_validator("tasks")
    @classmethod
    def _each_task_once(cls, tasks: list[str]) -> list[str]:
        twice = next((task for i, task in enumerate(tasks) if task in tasks[:i]), None)
        if twice is not None:
            raise ValueError(f"task {twice} is given twice; give it once")
        return tasks

    @field_validator("prices")
    @classmethod
    def _finite_prices(cls, prices: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
        for model, price in prices.items():
            if not 2 <= len(price) <= 3 or not all(math.isfinite(x) and x >= 0 for x in price):
                raise ValueError(f"price of {model}: give 2 or 3 non-negative numbers (USD per million tokens)")
        return prices

    @model_validator(mode="before")
    @classmethod
    def _written_before_the_judge_split(cls, data: Any) -> Any:
        return before_judge_split(data)

    @field_validator("judge_model", "inspector_model")
    @classmethod
    def _known_judge(cls, model: str | None) -> str | None:
        if model is not None:
            parse_model(model)
        return model

    @field_validator("agents")
    @classmethod
    def _distinct_agents(cls, agents: list[str]) -> list[str]:
        if len(set(agents)) != len(agents):
            raise ValueError("each agent at most once")
        return agents

    @model_validator(mode="after")
    def _models_for_world_agents(self) -> CampaignSpec:
        """ARE's agent and agent2agent's app agents run on a model API: a scripted model cannot play them."""
        scripted = [m for m in self.models if parse_model(m).provider not in API_PROVIDERS]
        if "are-default" in self.agents and scripted:
            raise ValueError(
                f"agent are-default runs ARE's own agent on a model API; {scripted[0]} is scripted "
                "(run scripted models with rg-agent in another campaign)"
            )
        if self.gaia2_a2a_model is not None and parse_model(self.gaia2_a2a_model).provider not in API_PROVIDERS:
            raise ValueError(f"gaia2_a2a_model {self.gaia2_a2a_model} is scripted: app agents need a model API")
        without_oracle = [m for m in scripted if m != "oracle"]  # the oracle replays events: no app agents
        if self.gaia2_a2a > 0 and self.gaia2_a2a_model is None and without_oracle:
            raise ValueError(
                f"agent2agent's app agents need a model API and {without_oracle[0]} is scripted: "
                "pass --gaia2-a2a-model (gaia2_a2a_model)"
            )
        return self

    @model_validator(mode="after")
    def _overlay_path_on_local_backend(self) -> CampaignSpec:
        """The operator and its pods cannot read a path on the user's machine: refuse rather than ignore one."""
        if self.overlay is not None and self.backend == "k8s":
            raise ValueError(
                "overlay is a path on your machine, which the cluster cannot read: give the labkube.yaml "
                "mappings in task_overlays (task folder name -> mapping), or use "
                "`labkube run --backend k8s --overlay PATH`, which reads the files"
            )
        return self

    @model_validator(mode="after")
    def _sandbox_on_local_backend(self) -> CampaignSpec:
        if self.sandbox == "none" and self.backend == "k8s":
            raise ValueError(
                "sandbox: none is for the local backend; on a cluster each run's pod is its room (leave sandbox out)"
            )
        return self

    @field_validator("seeds")
    @classmethod
    def _valid_seeds(cls, seeds: int | list[int]) -> int | list[int]:
        if isinstance(seeds, int) and not 1 <= seeds <= MAX_SEEDS:
            raise ValueError(f"seeds must be between 1 and {MAX_SEEDS}")
        if isinstance(seeds, list) and len(seeds) > MAX_SEEDS:
            raise ValueError(f"at most {MAX_SEEDS} seeds")
        if isinstance(seeds, list) and (not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds)):
            raise ValueError("seeds must be distinct non-negative integers")
        return seeds

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


def absolute_task_ref(ref: str, cwd: Path) -> str:
    """A task reference naming a file or folder relative to `cwd` (a task directory, a scenario JSON, a dataset),
    made absolute, its `#id` kept; a bundled name, an absolute path or a path that is not there as it is."""
    target, sep, wanted = ref.partition("#")
    path = Path(target)
    if not target or target.rstrip("/") == "gaia2" or path.expanduser().is_absolute() or not (cwd / path).exists():
        return ref  # bare `gaia2` is every bundled scenario, even beside a folder of that name
    return os.path.abspath(cwd / path) + sep + wanted


def resolve_local_paths(spec: CampaignSpec, cwd: Path) -> CampaignSpec:
    """The campaign with its task references and `replay:` models resolved against `cwd`, the user's working
    directory, and stored absolute: each run's processes work in their own directories, and a campaign may be
    resumed from anywhere."""
    tasks = [absolute_task_ref(t, cwd) for t in spec.tasks]
    models = [absolute_replay(m, cwd) for m in spec.models]
    if tasks == spec.tasks and models == spec.models:
        return spec
    return spec.model_copy(update={"tasks": tasks, "models": models})


def agent_mismatch(agent: str, family: TaskFamily, model: str) -> str | None:
    """Why `agent` cannot run a `family` task on `model`, or None. A campaign runs each scaffold where it applies
    (ARE's agent on Gaia2 scenarios, the vendors' CLIs on the API they speak) and skips the rest."""
    provider = parse_model(model).provider
    if agent == "are-default" and family is not TaskFamily.gaia2:
        return f"are-default runs Gaia2 scenarios only, and this campaign's tasks include a {family.value} task"
    if agent == "claude-code" and provider != "anthropic":
        return f"claude-code speaks Anthropic Messages, and {model} is not an anthropic: model"
    if agent == "codex" and provider not in ("openai", "openai-chat", "openai-compatible"):
        return f"codex speaks the OpenAI API, and {model} is not an openai: or openai-compatible: model"
    return None


class RunOrigin(NamedTuple):
    """What made a run: the campaign's task reference, its model, and the task it named (its card's reference and
    where the task lives: a folder, or a dataset's question)."""

    ref: str
    model: str
    task: str
    task_at: tuple[str, str | None]


def same_run_twice(run_id: str, first: RunOrigin, second: RunOrigin) -> str:
    """Why two of a campaign's runs are one: a task given twice under two spellings, or two task or model names
    that differ only in what a run id cannot hold."""
    if first.model != second.model:
        return f"models {first.model} and {second.model} map to the same run id {run_id}; give one of them"
    if first.task_at == second.task_at:
        return f"tasks {first.ref} and {second.ref} both name {second.task}; give it once"
    return f"tasks {first.task} and {second.task} map to the same run id {run_id}; rename one"


def expand_runs(spec: CampaignSpec, cards: dict[str, list[TaskCard]]) -> list[RunSpec]:
    """One RunSpec per task x model x seed (a dataset reference brings one task per question);
    the campaign's budgets override the task's defaults."""
    runs = []
    made_by: dict[str, RunOrigin] = {}
    skipped: dict[str, str] = {}
    for ref, model, agent, seed in product(spec.tasks, spec.models, spec.agents, spec.seed_list):
        for card in cards[ref]:
            why_not = agent_mismatch(agent, card.family, model)
            if why_not is not None:
                skipped.setdefault(agent, why_not)
                continue
            runs.append(
                RunSpec(
                    run_id=make_run_id(card.ref, model, seed, agent),
                    agent=agent,
                    campaign=spec.name,
                    task=card.ref,
                    task_path=card.path,
                    task_id=card.gaia.task_id if card.gaia else None,
                    family=card.family,
                    gaia2_noise=spec.gaia2_noise,
                    gaia2_a2a=spec.gaia2_a2a,
                    gaia2_a2a_model=spec.gaia2_a2a_model,
                    think_time_s=spec.think_time_s,
                    group=card.group or card.ref,
                    model=model,
                    seed=seed,
                    budgets=card.budgets.merged(spec.budgets),
                    idea_hint=spec.idea_hint,
                    grade_interval_s=spec.grade_interval_s,
                    pause_every_usd=spec.pause_every_usd,
                    pause_every_hours=spec.pause_every_hours,
                    prices=spec.prices,
                    api_key_env=spec.api_key_env,
                    context_threshold=spec.context_threshold,
                    judge_model=spec.judge_model,
                    gaia2_judge_budget_usd=spec.gaia2_judge_budget_usd,
                    gaia2_judge_timeout_s=spec.gaia2_judge_timeout_s,
                    inspector_model=spec.inspector_model,
                    inspector_budget_usd=spec.inspector_budget_usd,
                    model_timeout_s=spec.model_timeout_s,
                    gpus=card.resources.gpus,
                    task_overlay=spec.task_overlays.get(card.folder) if card.family is TaskFamily.researchgym else None,
                    sandbox=SandboxMode.pod if spec.backend == "k8s" else SandboxMode(spec.sandbox),
                )
            )
            origin = RunOrigin(ref, model, card.ref, (str(Path(card.path).resolve()), runs[-1].task_id))
            if runs[-1].run_id in made_by:
                raise ValueError(same_run_twice(runs[-1].run_id, made_by[runs[-1].run_id], origin))
            made_by[runs[-1].run_id] = origin
    for agent in spec.agents:  # a scaffold that applies nowhere is a mistake; somewhere, a comparison
        if agent in skipped and not any(r.agent == agent for r in runs):
            raise ValueError(f"agent {agent} has nothing to run: {skipped[agent]}")
    return runs
