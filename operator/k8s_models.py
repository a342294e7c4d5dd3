"""The pydantic models behind labkube's Kubernetes objects.

Field naming (see docs/kubernetes.md, "Field names"):

- What a user shares with the CLI keeps the CLI's snake_case names. `Campaign.spec` *is* a
  campaign file (`CampaignSpec`), and `Run.spec` *is* a `run.json` (`RunSpec`), each plus one
  Kubernetes-only block. A campaign file pastes into `spec:` unchanged, one pydantic model
  validates both, and the CRD schema is generated from it (`labkube.operator.crds`).
- What only Kubernetes sees uses Kubernetes' camelCase: the Kubernetes-only `pod` block
  (`nodeSelector`, `tolerations`, `priorityClassName`, as in a Pod spec), `status`
  (`observedGeneration`, `conditions[].lastTransitionTime`, which kubectl and kstatus read)
  and the operator's configuration file, which the Helm chart renders from its camelCase values.

`RunStatus` here is the status of a `Run` *resource*. The agent's live `status.json` is
`labkube.run_spec.RunStatus`; the operator copies from that one into this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from labkube.budgets import Spend, StopReason, rounded_usd
from labkube.campaign import CampaignSpec
from labkube.interventions import Intervention
from labkube.operator.kube import KubeTarget
from labkube.operator.leader import LeaderElection
from labkube.result import Outcome
from labkube.run_spec import RunPhase, RunSpec
from labkube.task_card import Resources, TaskFamily

__all__ = [
    "POLICY_PLURALS",
    "ApiKeySecret",
    "CampaignPhase",
    "CampaignResourceSpec",
    "CampaignStatus",
    "Condition",
    "ConditionStatus",
    "OperatorConfig",
    "PodOptions",
    "PodSettings",
    "PodTimeStatus",
    "RunCounts",
    "RunResourceSpec",
    "RunStatus",
    "Tenancy",
    "Toleration",
    "WorkspaceOptions",
    "WorldOptions",
    "check_pod_metadata",
    "labkube_key",
    "set_condition",
    "status_patch",
    "unrecorded",
]

# camelCase on the wire, snake_case in Python; either spelling is accepted on input.
_KUBE = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
    extra="forbid",
)
# Status is read back from the API server, where other writers (kopf) may add keys.
_KUBE_STATUS = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
    extra="ignore",
)

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[mk])?$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# A label or annotation key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
_META_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def labkube_key(key: str) -> bool:
    """Whether a label or annotation key is labkube's own on a run pod (`app.kubernetes.io/*`, `labkube.*`): what
    selects, owns and describes its pods, which nobody else may set."""
    prefix = key.partition("/")[0] if "/" in key else ""
    return prefix == "app.kubernetes.io" or prefix.startswith("labkube.")


def check_pod_metadata(labels: dict[str, str], annotations: dict[str, str], where: str) -> None:
    """Raise ValueError (naming `where`) for a label or annotation Kubernetes would refuse."""
    for key, value in labels.items():
        if not _META_KEY.match(key):
            raise ValueError(f"{where} labels: {key!r} is not a valid label key ([prefix/]name, name <= 63 characters)")
        if not _LABEL_VALUE.match(value):
            raise ValueError(
                f"{where} labels: {key}={value!r} is not a valid label value (<= 63 letters, digits, '-', '_', '.')"
            )
    for key in annotations:
        if not _META_KEY.match(key):
            raise ValueError(f"{where} annotations: {key!r} is not a valid annotation key ([prefix/]name)")


# -- the Kubernetes-only block of a spec ------------------------------------------------------


class Toleration(BaseModel):
    """A Pod toleration, spelled as in a Pod spec."""

    model_config = _KUBE

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    def to_pod(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class PodSettings(BaseModel):
    """Where a campaign's run pods go on the cluster (Kubernetes field names)."""

    model_config = _KUBE

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Added to the task's node selector; these win on a shared key."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Added to the chart's default tolerations.")
    priority_class_name: str | None = Field(default=None, description="PriorityClass of the run pods.")
    queue_name: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="Kueue LocalQueue: sets the `kueue.x-k8s.io/queue-name` label on the run pods.",
    )
    runtime_class_name: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, description="RuntimeClass of the run pods (gVisor, Kata)."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Added to the run pods' labels; labkube's own (app.kubernetes.io/*, labkube.*) cannot be set.",
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to the run pods' annotations.")

    @model_validator(mode="after")
    def _valid_pod_metadata(self) -> PodSettings:
        check_pod_metadata(self.labels, self.annotations, "pod")
        return self


# -- specs -------------------------------------------------------------------------------------


class CampaignResourceSpec(CampaignSpec):
    """`Campaign.spec`: a campaign file (`CampaignSpec`) plus the Kubernetes-only `pod` block.

    The campaign's name is the resource's `metadata.name` (so `name` is not a spec field of the
    resource), and `backend` defaults to `k8s`: a Campaign resource runs its runs as pods.
    """

    pod: PodSettings = Field(default_factory=PodSettings, description="Scheduling of the run pods.")
    suspend: bool = Field(
        default=False,
        description="As a Job's: true pauses every unfinished run of the campaign (the operator appends a pause by "
        "`Campaign spec.suspend` to each Run's interventions: its pod ends, no new one starts); false again resumes "
        "the runs it paused so, not those a person paused (docs/live-control.md).",
    )

    def to_campaign_spec(self) -> CampaignSpec:
        return CampaignSpec.model_validate(self.model_dump(include=set(CampaignSpec.model_fields)))


class RunResourceSpec(RunSpec):
    """`Run.spec`: the run's `run.json` (`RunSpec`) plus what its pod needs from the task card
    (`family`, `resources`) and from the campaign (`pod`)."""

    family: TaskFamily = Field(default=TaskFamily.researchgym, description="Task family; gaia2 runs get a world.")
    resources: Resources = Field(default_factory=Resources, description="The task's resources (labkube.yaml).")
    pod: PodSettings = Field(default_factory=PodSettings, description="The campaign's scheduling settings.")
    interventions: list[Intervention] = Field(
        default_factory=list,
        description="What people did to the run while it ran (`labkube runs`, `kubectl patch --type=json` with `add "
        "/spec/interventions/-`), oldest first, appended and never edited: the run's pause, resume, cancel, extend "
        "and message record, which the operator follows (docs/live-control.md). The only field of a Run's spec the "
        "operator reads after the Run is made.",
    )

    @model_validator(mode="after")
    def _one_gpu_count(self) -> RunResourceSpec:
        if self.resources.gpus != self.gpus:
            raise ValueError(
                f"run {self.run_id}: gpus ({self.gpus}) and resources.gpus ({self.resources.gpus}) differ; "
                "set both to the task's GPU count"
            )
        return self

    def to_run_spec(self) -> RunSpec:
        """What the agent reads as `run.json`."""
        return RunSpec.model_validate(self.model_dump(include=set(RunSpec.model_fields)))


# -- status ------------------------------------------------------------------------------------


class ConditionStatus(StrEnum):
    true = "True"
    false = "False"
    unknown = "Unknown"


class Condition(BaseModel):
    """A Kubernetes-style condition (as in `metav1.Condition`)."""

    model_config = _KUBE_STATUS

    type: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=316, description="CamelCase, e.g. `Ready`.")
    status: ConditionStatus
    reason: str = Field(default="", max_length=1024, description="CamelCase machine-readable reason.")
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime | None = None
    observed_generation: int | None = Field(default=None, ge=0)


def set_condition(
    conditions: list[Condition],
    type: str,
    status: ConditionStatus | bool,
    reason: str = "",
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """A copy of `conditions` with condition `type` set; `lastTransitionTime` moves only when
    the status changes."""
    if isinstance(status, bool):
        status = ConditionStatus.true if status else ConditionStatus.false
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    old = next((c for c in conditions if c.type == type), None)
    changed = old is None or old.status != status
    new = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if changed or old is None else old.last_transition_time,
        observed_generation=observed_generation,
    )
    return [new if c.type == type else c for c in conditions] if old is not None else [*conditions, new]


class _Status(BaseModel):
    model_config = _KUBE_STATUS

    def to_status(self) -> dict[str, Any]:
        """The whole status (camelCase, JSON types); what to patch is `status_patch` of it against a base."""
        return self.model_dump(mode="json")


def status_patch(base: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) of what the writer changed: the fields of `status` that differ from `base`
    (what the writer last wrote or read), objects compared field by field. A field is sent as null only to clear a
    value `base` had; a field `status` leaves null, or that `base` lacks, is never sent as null, so a writer never
    erases what another one recorded (a stale supervisor's patch keeps the new one's `report`)."""
    patch: dict[str, Any] = {}
    for key, value in status.items():
        old = base.get(key)
        if value == old:
            continue
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            if nested := status_patch(old, value):
                patch[key] = nested
        elif value is not None or old is not None:
            patch[key] = value
    return patch


def unrecorded(status: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The fields of `status` with a value that `stored` (what the API server answered) does not hold: pruned by a
    CRD older than the writer, or changed by another writer since."""
    return [key for key, value in status.items() if value is not None and stored.get(key) != value]


class PodTimeStatus(BaseModel):
    """One pod of a run: from `status.startTime` to its last container's `finishedAt` (none while it runs)."""

    model_config = _KUBE_STATUS

    pod: str = Field(min_length=1, max_length=253)
    start: datetime
    end: datetime | None = None
    lost: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the pod was lost (its node died or went): its end is when the cluster last saw it run.",
    )


class RunStatus(_Status):
    """`Run.status`, written by the operator."""

    phase: RunPhase = RunPhase.pending
    pod_name: str | None = Field(default=None, description="The run's current (or last) pod.")
    attempts: int = Field(default=0, ge=0, description="Pods started so far.")
    crashes: int = Field(default=0, ge=0, description="Pods that failed (crashed, errored) without a result.")
    disruptions: int = Field(default=0, ge=0, description="Pods the cluster took away (evicted, preempted).")
    score: float | None = Field(default=None, description="Primary score, normalized (fraction of SOTA).")
    tokens: int = Field(default=0, ge=0, description="Input + output tokens spent.")
    cost_usd: float | None = Field(
        default=0.0, ge=0, description="Model spend in US dollars; null (unknown) when a model it called has no price."
    )
    spend_at_least: bool = Field(
        default=False,
        description="tokens and costUsd are lower bounds: a model call's answer did not say its usage.",
    )
    gpu_hours: float = Field(default=0.0, ge=0, description="GPU-hours charged to the campaign's cap.")
    stop_reason: StopReason | None = None
    outcome: Outcome | None = Field(
        default=None, description="scored, no_value, or an error outcome (grader_error, judge_error, ...)."
    )
    pod_times: list[PodTimeStatus] = Field(
        default_factory=list,
        description="When each pod of the run held its resources, as the API reported it: the GPU-hour meter's "
        "record, which a new leader rebuilds its ledger from.",
    )
    report: str | None = Field(
        default=None,
        max_length=4096,
        description="The grading pod's termination report (the run's result), once final: the record a new "
        "leader with an empty runs root reads the result from.",
    )
    world_verdict: str | None = Field(
        default=None,
        max_length=4096,
        description="A Gaia2 run's verdict as its pod's world sidecar reported it (that container's termination "
        "message): what the grading pod is given, never the copy in the agent-writable checkpoint.",
    )
    cluster_spend: Spend | None = Field(
        default=None,
        description="The run's spend as its pods' gateway sidecars reported it (each one's termination message), "
        "never lower than before: what a resumed pod's gateway counts on from and the grading pod charges the run, "
        "never the copy in the agent-writable checkpoint. Null: no gateway has reported (a scripted model).",
    )
    budget_stop: StopReason | None = Field(
        default=None, description="The budget a gateway sidecar refused model calls for, as it reported it."
    )
    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list)

    def show_spend(self, spend: Spend) -> None:
        """The run's tokens and dollars as its status shows them: null dollars where unknown, and lower bounds
        marked as such."""
        self.tokens = spend.usage.total
        self.cost_usd = rounded_usd(spend.cost_usd)
        self.spend_at_least = spend.at_least


class CampaignPhase(StrEnum):
    pending = "Pending"  # accepted, no run started yet
    running = "Running"
    finished = "Finished"  # every run reached a final state
    failed = "Failed"  # the spec cannot run (unknown task or model, ...)


class RunCounts(BaseModel):
    """Runs of a campaign by phase."""

    model_config = _KUBE_STATUS

    total: int = Field(default=0, ge=0)
    pending: int = Field(default=0, ge=0)
    starting: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)
    grading: int = Field(default=0, ge=0)
    paused: int = Field(default=0, ge=0)
    finished: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)

    @classmethod
    def of(cls, phases: list[RunPhase]) -> RunCounts:
        counts = {p.name: sum(1 for x in phases if x == p) for p in RunPhase}
        return cls(total=len(phases), **counts)

    @property
    def progress(self) -> str:
        return f"{self.finished + self.failed}/{self.total}"


class CampaignStatus(_Status):
    """`Campaign.status`, written by the operator."""

    phase: CampaignPhase = CampaignPhase.pending
    runs: RunCounts = Field(default_factory=RunCounts, description="Runs by phase.")
    progress: str = Field(default="0/0", description="Runs in a final state / all runs, e.g. `7/12`.")
    gpu_hours_used: float = Field(default=0.0, ge=0, description="GPU-hours spent by all runs so far.")
    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list)


# -- the operator's configuration (rendered by the Helm chart) ---------------------------------


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class WorkspaceOptions(BaseModel):
    """Where a run pod keeps `/runs/<run-id>`."""

    model_config = _KUBE

    mode: Literal["emptyDir", "pvc"] = Field(
        default="pvc",
        description="`pvc` (default) keeps checkpoints so a replaced pod resumes (a claim per run, or "
        "`existingClaim`); `emptyDir` is lost with the pod (a replaced pod starts over).",
    )
    size_limit: str | None = Field(default=None, pattern=_QUANTITY, description="emptyDir size limit.")
    existing_claim: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        description="pvc mode: mount this shared claim (subPath = campaign) instead of a claim per run.",
    )
    size: str = Field(default="100Gi", pattern=_QUANTITY, description="pvc mode: size of each run's claim.")
    storage_class_name: str | None = Field(default=None, description="pvc mode: storage class of each run's claim.")
    access_modes: list[AccessMode] = Field(default_factory=lambda: list[AccessMode](["ReadWriteOnce"]), min_length=1)
    keep_finished: bool = Field(
        default=True,
        description="pvc mode, claim per run: keep a finished run's claim (its workspace, transcript, checkpoints) "
        "until its Campaign is deleted; false deletes it once the run's result is in its Run status.",
    )

    @property
    def claim_per_run(self) -> bool:
        return self.mode == "pvc" and not self.existing_claim


class ApiKeySecret(BaseModel):
    """One environment variable of the run pods, read from a Secret (never a literal)."""

    model_config = _KUBE

    env: str = Field(pattern=_ENV_NAME, description="Variable name, e.g. OPENAI_API_KEY.")
    secret_name: str = Field(pattern=_DNS_SUBDOMAIN)
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", description="Key within the Secret.")
    optional: bool = Field(default=True, description="Start the pod even when the Secret or key is missing.")


class WorldOptions(BaseModel):
    """The Gaia2 world process (ARE in its own environment), a sidecar of gaia2 run pods."""

    model_config = _KUBE

    image: str = Field(min_length=1)
    port: int = Field(default=8765, ge=1, le=65535)
    command: list[str] = Field(default_factory=list, description="Entrypoint; empty uses the image's.")
    args: list[str] = Field(default_factory=list)
    resources: dict[Literal["requests", "limits"], dict[str, str]] = Field(
        default_factory=dict, description="Container resources, e.g. {requests: {cpu: 500m, memory: 1Gi}}."
    )
    startup_seconds: int = Field(default=120, ge=1, description="How long the world may take to listen.")


# Environment variables the pod builder sets itself.
RESERVED_ENV = frozenset(
    {
        "HOME",
        "LABKUBE_RUN_DIR",
        "LABKUBE_RUN_SPEC",
        "LABKUBE_METRICS_PORT",
        "LABKUBE_WORLD_URL",
        "LABKUBE_WORLD_PORT",
        "LABKUBE_STDIN_VARS",
        "LABKUBE_WORLD_CONTROL",
        "LABKUBE_WORLD_CONTROL_FILE",
        "LABKUBE_CONTROL_FILE",
    }
)
_SECRET_LOOKING = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


class PodOptions(PodSettings):
    """How the operator builds run pods: the chart's `runs:` values.

    The inherited `PodSettings` fields are the defaults for every run pod; the task's and the
    campaign's settings are added to them.
    """

    default_image: str = Field(min_length=1, description="Image of tasks that name none in resources.image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    service_account_name: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, description="Its token is never mounted."
    )
    gpu_resource_name: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")
    task_environments: bool = Field(
        default=False,
        description="Build a ResearchGym task's environment (requirements.txt, install.sh) in an init container; "
        "needs the package index through the run pods' NetworkPolicy. Off: tasks bring a prebuilt image.",
    )
    deadline_grace_seconds: int = Field(
        default=900, ge=0, description="Added to the time budget for activeDeadlineSeconds (final grading)."
    )
    image_pull_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        description="How long a run pod (agent or grading) may be stuck pulling its image (or crash-looping a "
        "sidecar) before the run fails: a 20 GB image on a slow or recovering registry takes many minutes.",
    )
    pod_lost_after_seconds: int = Field(
        default=300,
        ge=0,
        description="A run pod still Terminating this long past its grace period, or running on a node that has been "
        "NotReady this long, is lost (its node died): its GPU time ends when the cluster last saw it run, and the "
        "run resumes in a new pod as after a disruption.",
    )
    grading_deadline_seconds: int = Field(
        default=3600,
        ge=60,
        description="activeDeadlineSeconds of a grading pod: its image pull, the task environment's rebuild (its "
        "init container) and the grader.",
    )
    termination_grace_period_seconds: int = Field(default=60, ge=0, description="Time to checkpoint on SIGTERM.")
    pause_grace_seconds: int = Field(
        default=300,
        ge=0,
        description="How long a paused run's agent pod may take to reach its next step boundary, save and exit "
        "before the operator deletes it (SIGTERM: the agent keeps its last step's checkpoint); a pause with `now` "
        "deletes it at once.",
    )
    metrics_port: int = Field(default=9400, ge=1, le=65535, description="The agent's Prometheus port.")
    run_as_user: int = Field(default=1000, ge=1)
    run_as_group: int = Field(default=1000, ge=1)
    fs_group: int = Field(default=1000, ge=1)
    read_only_root_filesystem: bool = Field(
        default=False, description="For the agent container; off because agents install packages."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Plain (non-secret) variables for the agent.")
    api_keys: list[ApiKeySecret] = Field(default_factory=list)
    workspace: WorkspaceOptions = Field(default_factory=WorkspaceOptions)
    world: WorldOptions | None = None
    ephemeral_storage: str = Field(
        default="20Gi", pattern=_QUANTITY, description="Ephemeral storage of the agent (requests = limits)."
    )
    cpu_limits: bool = Field(
        default=False,
        description="Give every container of a run pod (and of its grading pod) a CPU limit: the agent's is the "
        "task's cpus, as requested; the sidecars' and init containers' small fixed ones. For namespaces whose "
        "ResourceQuota counts limits.cpu (it refuses pods without one). Off: no CPU limit, as CPU is shared.",
    )
    affinity: dict[str, Any] = Field(default_factory=dict, description="Affinity of every run pod, as in a Pod spec.")
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list, description="Topology spread of run pods, as in a Pod spec (labels of run pods apply)."
    )

    @field_validator("env")
    @classmethod
    def _no_secrets_in_env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not re.match(_ENV_NAME, name):
                raise ValueError(f"runs.env: {name!r} is not a valid environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"runs.env: {name} is set by labkube itself; remove it")
            if _SECRET_LOOKING.search(name):
                raise ValueError(
                    f"runs.env: {name} looks like a secret; put it in a Secret and list it in runs.apiKeys"
                )
        return env

    @model_validator(mode="after")
    def _no_labkube_keys(self) -> PodOptions:
        for value, keys in (("podLabels", self.labels), ("podAnnotations", self.annotations)):
            for key in keys:
                if labkube_key(key):
                    raise ValueError(
                        f"runs.{value}: {key} is labkube's own (app.kubernetes.io/*, labkube.*); remove it"
                    )
        if _QUEUE_LABEL in self.labels:
            raise ValueError(f"runs.podLabels: {_QUEUE_LABEL} is set from runs.queueName; set that instead")
        return self

    @model_validator(mode="after")
    def _distinct_env(self) -> PodOptions:
        names = [k.env for k in self.api_keys]
        dupes = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(self.env)))
        if dupes:
            raise ValueError(f"runs.apiKeys: {', '.join(dupes)} defined more than once")
        return self


# The policy kinds the operator puts into namespaces with runs: (apiVersion, kind) -> the resource's plural.
POLICY_PLURALS = {
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("cilium.io/v2", "CiliumNetworkPolicy"): "ciliumnetworkpolicies",
}


class Tenancy(BaseModel):
    """What a Campaign (and the tasks it names) may choose for its pods beyond the chart's own settings.

    Empty lists allow nothing: a Campaign asking for a priority class, node selector, toleration, image or
    runtime class that is not listed here is refused with a condition naming the field and the allowed values.
    """

    model_config = _KUBE

    priority_classes: list[str] = Field(default_factory=list, description="PriorityClasses a Campaign may set.")
    node_selectors: dict[str, list[str]] = Field(
        default_factory=dict, description="Node label key -> values a Campaign or task may select (node pools)."
    )
    toleration_keys: list[str] = Field(default_factory=list, description="Taint keys a Campaign may tolerate.")
    images: list[str] = Field(
        default_factory=list,
        description="Images a task may name: exact references, or prefixes ending in `/` or `:` (a registry, a repo).",
    )
    runtime_classes: list[str] = Field(default_factory=list, description="RuntimeClasses a Campaign or task may set.")
    queue_names: list[str] = Field(default_factory=list, description="Kueue LocalQueues a Campaign may set.")
    pod_labels: list[str] = Field(
        default_factory=list,
        description="Label keys a Campaign's pod.labels may set: exact keys, or prefixes ending in `/` or `*`.",
    )
    pod_annotations: list[str] = Field(
        default_factory=list,
        description="Annotation keys a Campaign's pod.annotations may set: exact keys, or prefixes ending in `/` "
        "or `*`.",
    )


class OperatorConfig(BaseModel):
    """`labkube operator --config FILE`: the file the chart renders into its ConfigMap."""

    model_config = _KUBE

    namespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty: all.")
    runs_root: str = Field(
        default="/runs",
        pattern=r"^/",
        description="Where the operator keeps campaign directories (`<runsRoot>/<namespace>/<campaign>/`).",
    )
    run_policies: list[dict[str, Any]] = Field(
        default_factory=list,
        description="NetworkPolicy objects (without a namespace) the operator puts in every namespace with runs.",
    )

    @field_validator("run_policies")
    @classmethod
    def _known_policy_kinds(cls, policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for policy in policies:
            key = (policy.get("apiVersion"), policy.get("kind"))
            if key not in POLICY_PLURALS:
                known = ", ".join(f"{v}/{k}" for v, k in POLICY_PLURALS)
                raise ValueError(f"runPolicies: {key[0]}/{key[1]} is not a policy kind labkube applies ({known})")
            if not (policy.get("metadata") or {}).get("name") or "spec" not in policy:
                raise ValueError(f"runPolicies: a {key[1]} needs metadata.name and spec")
        return policies

    tenancy: Tenancy = Field(default_factory=Tenancy)
    delete_finished_pods: bool = Field(
        default=True, description="Delete a run's ended pods once its result is recorded (their logs go with them)."
    )
    leader_election: LeaderElection = Field(
        default_factory=LeaderElection, description="One driver among the operator's replicas (a Lease)."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    ray_address: str | None = Field(default=None, description="Existing Ray cluster; empty: start Ray in the pod.")
    metrics_port: int = Field(default=8080, ge=1, le=65535)
    health_port: int = Field(default=8081, ge=1, le=65535, description="Serves /healthz (kopf liveness).")
    runs: PodOptions

    @model_validator(mode="after")
    def _graded_apart_from_the_agent(self) -> OperatorConfig:
        if self.runs.workspace.mode == "emptyDir":
            raise ValueError(
                "runs.workspace.mode emptyDir: a run is graded in a pod of its own after its agent's pod ends, and "
                "an emptyDir ends with that pod; set runs.workspace.mode to pvc (a claim per run, or existingClaim)"
            )
        return self


class K8sBackend(BaseModel):
    """What every run supervisor of one campaign needs to run pods (JSON: crosses into Ray actors)."""

    model_config = ConfigDict(extra="forbid")

    kube: KubeTarget
    namespace: str
    operator_namespace: str | None = Field(
        default=None, description="Where the operator runs: its runs root holds that namespace's shared claim."
    )
    runs: PodOptions
    max_attempts: int = Field(
        default=3, ge=1, description="Pods per run that may fail (crash, error) before it is finalized as killed."
    )
    max_disruptions: int = Field(
        default=20,
        ge=0,
        description="Pods per run the cluster may take away (evictions, preemptions, reclaimed nodes) on top: "
        "they resume from the checkpoint and use up no crash attempt.",
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="How often status.json is read while a pod runs.")
    delete_finished_pods: bool = Field(
        default=True, description="Delete a run's ended pods once its result is recorded (their logs go with them)."
    )
    image_pull_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="A run whose image cannot be pulled for this long fails; None: the chart's "
        "runs.imagePullTimeoutSeconds (`runs.image_pull_timeout_seconds`).",
    )

    @property
    def pull_give_up_s(self) -> float:
        """How long a pod may be stuck (`stuck_condition`) before the run fails."""
        if self.image_pull_timeout_s is not None:
            return self.image_pull_timeout_s
        return float(self.runs.image_pull_timeout_seconds)

    @property
    def shared(self) -> bool:
        """Whether the operator sees the run directories the pods write: the shared claim of its own namespace,
        which it mounts (a claim is namespaced: another namespace's claim of that name is another volume)."""
        ws = self.runs.workspace
        return ws.mode == "pvc" and ws.existing_claim is not None and self.namespace == self.operator_namespace
