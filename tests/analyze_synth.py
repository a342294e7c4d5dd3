"""Synthetic campaigns with known properties, for `labkube analyze` (tests/test_analyze.py).

Written with the real models and the real store layout (campaign.json, run.json, status.json, result.json,
transcript.jsonl, integrity.json). What is planted:

- paper runs of the bundled continual-learning-lite task (its card gives the baseline, 0.221/0.842 of SOTA);
- per run: `tool_calls` steps (one model call and one tool call per step) over `wall_s` seconds, so the action
  density is exactly tool_calls / (wall_s / 3600); final scores built so that Pearson(density, score) is
  exactly `TARGET_R`;
- tools by phase: read_file in the first third of the steps, bash in the middle, apply_patch in the last;
- score curves graded every tenth of the run, rising linearly to the final score at `best_frac` of the run, flat
  after (so time to best = best_frac * wall_s);
- failure modes on named runs only: a NaN loss then a progress claim, a loss that never moves then a progress
  claim, two overlapping async jobs writing the same log, an early stop below the baseline, context pressure, a
  SUSPICIOUS integrity verdict; and near misses that must not fire (overlapping jobs on different logs, the same
  log written one job after the other, an early stop above the baseline, one hand-off, progress words alone);
- an outcomes campaign (`write_outcomes_campaign`): paper and Gaia2 runs that end scored, with no value (a
  do-nothing run), or in a grader, setup, judge or world error, and a SUSPICIOUS run, for what `analyze` leaves out
  and how it agrees with `report`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from labkube.budgets import Budgets, Spend, StopReason, Usage
from labkube.campaign import CampaignSpec
from labkube.result import Grade, Outcome, RunResult, SubtaskScore
from labkube.run_spec import RunPhase, RunSpec, RunStatus
from labkube.store import CampaignDir, write_model
from labkube.tasks import BUNDLED

TASK = "researchgym/continual-learning-lite"
TASK_PATH = str(BUNDLED / "researchgym" / "continual-learning-lite")
BASELINE = 0.2210 / 0.8420
MODELS = ["openai:gpt-5", "anthropic:claude-sonnet-4-5"]
BUDGET = Budgets(wall_hours=1.0, tokens=1_000_000, usd=10.0)
TARGET_R = -0.47
TOOL_CALLS = [20, 26, 31, 38, 44, 50, 57, 63, 70, 76, 83, 90]
REASONING_PER_CALL = 150
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Planted:
    run_id: str
    model: str
    seed: int
    tool_calls: int
    wall_s: float
    score: float = 0.0
    best_frac: float = 0.5
    stop: StopReason = StopReason.time
    special: set[str] = field(default_factory=set)
    verdict: str = "PASS"

    @property
    def density(self) -> float:
        return self.tool_calls / (self.wall_s / 3600)

    def score_at(self, t: float) -> float:
        return self.score * min(1.0, t / (self.best_frac * self.wall_s))

    def grade_times(self) -> list[float]:
        return [self.wall_s * i / 10 for i in range(1, 11)]


def plan() -> list[Planted]:
    """Twelve runs (two models, six seeds each) with the failure modes on fixed runs."""
    runs = []
    for i, k in enumerate(TOOL_CALLS):
        model = MODELS[i % 2]
        seed = i // 2
        runs.append(Planted(f"synth--{model.split(':')[0]}--s{seed}", model, seed, k, 3600.0))
    runs[0].best_frac, runs[1].best_frac, runs[2].best_frac = 0.3, 0.7, 0.9
    # The early stops: a third of the wall budget, ended by the agent.
    for r in (runs[3], runs[8]):
        r.wall_s, r.stop = 1200.0, StopReason.done
    specials = {1: "nan", 2: "flat_loss", 4: "collapse", 5: "overlap_ok", 6: "sequential_jobs", 7: "context"}
    specials |= {9: "one_handoff", 10: "suspicious"}
    for i, name in specials.items():
        runs[i].special.add(name)
    runs[10].verdict = "SUSPICIOUS"
    # Scores with Pearson(density, score) == TARGET_R exactly, then mapped affinely onto [0.05, 0.95].
    d = np.array([r.density for r in runs])
    zx = (d - d.mean()) / d.std()
    noise = np.cos(np.arange(len(runs)) * 1.7)
    noise = noise - noise.mean()
    noise -= (noise @ zx) / (zx @ zx) * zx
    noise /= noise.std()
    y = TARGET_R * zx + np.sqrt(1 - TARGET_R**2) * noise
    y = 0.05 + 0.9 * (y - y.min()) / (y.max() - y.min())
    for r, s in zip(runs, y, strict=True):
        r.score = float(s)
    # The early stop that fires is below the baseline; the near miss above it.
    low, high = sorted((runs[3], runs[8]), key=lambda r: r.score)
    low.special.add("early_stop")
    high.special.add("early_ok")
    assert low.score < BASELINE < high.score, (low.score, high.score)
    return runs


def expected_flags(runs: list[Planted]) -> set[tuple[str, str]]:
    kinds = {"nan": "silent_failure", "flat_loss": "silent_failure", "collapse": "parallel_collapse"}
    kinds |= {"early_stop": "early_stop", "context": "context_pressure", "suspicious": "integrity"}
    return {(kinds[s], r.run_id) for r in runs for s in r.special if s in kinds}


def _iso(t: float) -> str:
    return (T0 + timedelta(seconds=t)).isoformat()


def _tool_for(step: int, k: int) -> str:
    return ["read_file", "bash", "apply_patch"][(step - 1) * 3 // k]


def transcript_lines(r: Planted) -> list[dict]:
    """The events of one run, in order."""
    k, dt = r.tool_calls, r.wall_s / r.tool_calls
    ramp = [s for s in range(1, k + 1) if _tool_for(s, k) == "bash"]
    out: list[dict] = [{"type": "start", "ts": _iso(0), "run_id": r.run_id, "step": 0, "model": r.model}]
    overrides: dict[int, tuple[str, dict, str]] = {}
    a = ramp[1]
    job = "job{} ('python train.py'): exited with code 0\nok"
    if r.special & {"collapse", "overlap_ok"}:
        first, second = ("runs/log.txt", "runs/log.txt") if "collapse" in r.special else ("runs/a.log", "runs/b.log")
        overrides[a] = ("start_async", {"command": f"python train.py --lr 0.1 > {first}"}, "started job1 (pid 11) in .")
        overrides[a + 1] = (
            "start_async",
            {"command": f"python train.py --lr 0.01 > {second}"},
            "started job2 (pid 12)",
        )
        overrides[a + 3] = ("check_async", {"job_id": "job1"}, job.format(1))
        overrides[a + 4] = ("check_async", {"job_id": "job2"}, job.format(2))
    if "sequential_jobs" in r.special:
        overrides[a] = ("start_async", {"command": "python train.py --lr 0.1 > out.txt"}, "started job1 (pid 11) in .")
        overrides[a + 1] = ("check_async", {"job_id": "job1"}, job.format(1))
        overrides[a + 2] = ("start_async", {"command": "python train.py --lr 0.01 > out.txt"}, "started job2 (pid 12)")
        overrides[a + 3] = ("check_async", {"job_id": "job2"}, job.format(2))
    if r.stop is StopReason.done:  # the last step ends the task
        overrides[k] = ("end_task", {"summary": "done"}, "ended")
    for step in range(1, k + 1):
        t = step * dt
        content = "Next I will run the experiment and read what it prints."
        if step == k - 1:
            content = "The result improved over the last attempt."  # progress words alone never fire
        if r.special & {"nan", "flat_loss"} and step == ramp[-1] + 1:
            content = "Training is making good progress: the loss is decreasing nicely."
        call = {"id": f"c{step}", "name": _tool_for(step, k), "arguments": {}}
        out.append(
            {
                "type": "model_call",
                "purpose": "step",
                "step": step,
                "ts": _iso(t - dt / 2),
                "model": r.model,
                "message": {"role": "assistant", "content": content, "tool_calls": [call]},
                "usage": {"input": 1000, "output": 200, "reasoning": REASONING_PER_CALL, "cached": 0},
                "cost_usd": 0.01,
            }
        )
        tool, args, output = overrides.get(step, (_tool_for(step, k), {"path": "train.py"}, "ok"))
        if tool == "bash":
            args = {"command": "python train.py"}
            output = f"epoch {step} loss={1.5 - 0.01 * step:.4f}\nval acc 0.5"
            if "flat_loss" in r.special:
                output = "epoch {step} loss=0.6931\nval acc 0.5".replace("{step}", str(step))
            if "nan" in r.special and step == ramp[2]:
                output = f"epoch {step} loss=nan\nval acc 0.1"
        out.append(
            {
                "type": "tool_call",
                "step": step,
                "ts": _iso(t),
                "call_id": f"c{step}",
                "tool": tool,
                "access": "read",
                "args": args,
                "ok": True,
                "output": output,
                "duration_s": 0.1,
            }
        )
        if r.special & {"context", "one_handoff"} and step == ramp[0]:
            out.append({"type": "handoff", "ts": _iso(t), "n": 1, "summary": "so far: baseline reproduced"})
        if "context" in r.special and step == ramp[-1]:
            out.append({"type": "handoff", "ts": _iso(t), "n": 2, "summary": "so far: two variants tried"})
            out.append({"type": "context_drop", "ts": _iso(t), "dropped_messages": 6})
    return out


def write_run(cdir: CampaignDir, spec: RunSpec, result: RunResult, events: list[dict]) -> None:
    rd = cdir.run_dir(spec.run_id)
    write_model(rd / "run.json", spec)
    write_model(
        rd / "status.json",
        RunStatus(
            run_id=spec.run_id, phase=result.status, step=result.spend.steps, score=result.score, spend=result.spend
        ),
    )
    write_model(rd / "result.json", result)
    with (rd / "transcript.jsonl").open("w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def paper_result(r: Planted) -> RunResult:
    k = r.tool_calls
    curve = []
    for t in r.grade_times():
        frac = t / r.wall_s
        s = r.score_at(t)
        curve.append(
            Grade(
                at_seconds=t,
                step=round(frac * k),
                tokens=round(1200 * k * frac),
                usd=0.01 * k * frac,
                subtasks=[SubtaskScore(id="avg_acc", raw=s * 0.842, fraction_of_sota=s)],
                score=s,
            )
        )
    return RunResult(
        run_id=r.run_id,
        task=TASK,
        model=r.model,
        seed=r.seed,
        status=RunPhase.finished,
        stop_reason=r.stop,
        score=r.score,
        beat_baseline=r.score > BASELINE,
        completion=0.5,
        subtasks=[
            SubtaskScore(id="avg_acc", raw=r.score * 0.842, fraction_of_sota=r.score),
            SubtaskScore(id="forgetting"),
        ],
        spend=Spend(
            steps=k,
            usage=Usage(input=1000 * k, output=200 * k, reasoning=REASONING_PER_CALL * k),
            usd=0.01 * k,
            wall_seconds=r.wall_s,
        ),
        score_curve=curve,
        integrity_verdict=r.verdict,
    )


def plant_campaign(cdir: CampaignDir, name: str, runs: list[Planted], seeds: int) -> list[RunSpec]:
    """campaign.json and a run.json per planted run, as `labkube run` writes them before the runs start."""
    specs = [
        RunSpec(
            run_id=r.run_id,
            campaign=name,
            task=TASK,
            task_path=TASK_PATH,
            model=r.model,
            seed=r.seed,
            budgets=BUDGET,
        )
        for r in runs
    ]
    cdir.write_campaign(CampaignSpec(name=name, tasks=[TASK], models=MODELS, seeds=seeds, budgets=BUDGET), specs)
    return specs


def write_paper_campaign(root: Path) -> list[Planted]:
    runs = plan()
    cdir = CampaignDir(root)
    specs = plant_campaign(cdir, "synth", runs, seeds=6)
    for r, s in zip(runs, specs, strict=True):
        write_run(cdir, s, paper_result(r), transcript_lines(r))
        if r.verdict != "PASS":
            (cdir.run_dir(r.run_id) / "integrity.json").write_text(
                json.dumps(
                    {
                        "verdict": r.verdict,
                        "violations": [{"type": "heldout_read", "evidence": "cat data/heldout/y.npy"}],
                    }
                )
            )
    return runs


# -- Gaia2 ---------------------------------------------------------------------------------------------------------

GAIA2 = [  # (scenario, capabilities, scaffold, seed, passed, usd, simulated seconds)
    ("execution_budget_email", ["execution"], "rg-agent", 0, True, 0.02, 40.0),
    ("execution_budget_email", ["execution"], "rg-agent", 1, False, 0.03, 55.0),
    ("time_door_code", ["time"], "rg-agent", 0, True, 0.05, 600.0),
    ("time_door_code", ["time"], "rg-agent", 1, True, 0.04, 610.0),
    ("execution_budget_email", ["execution"], "are-default", 0, False, 0.01, 30.0),
    ("execution_budget_email", ["execution"], "are-default", 1, False, 0.01, 35.0),
    ("time_door_code", ["time"], "are-default", 0, True, 0.06, 620.0),
    ("time_door_code", ["time"], "are-default", 1, False, 0.02, 200.0),
]
GAIA2_MODEL = "openai:gpt-5"


def write_gaia2_campaign(root: Path) -> None:
    cdir = CampaignDir(root)
    tasks = sorted({f"gaia2/{s}" for s, *_ in GAIA2})
    spec = CampaignSpec(
        name="synth-gaia2", tasks=tasks, models=[GAIA2_MODEL], agents=["rg-agent", "are-default"], seeds=2
    )
    specs, results = [], []
    for scenario, caps, agent, seed, passed, usd, sim in GAIA2:
        run_id = f"{scenario}--{agent}--s{seed}"
        specs.append(
            RunSpec(
                run_id=run_id,
                campaign="synth-gaia2",
                task=f"gaia2/{scenario}",
                task_path=f"/x/{scenario}.json",
                family="gaia2",
                model=GAIA2_MODEL,
                agent=agent,
                seed=seed,
            )  # type: ignore[arg-type]
        )
        results.append(
            RunResult(
                run_id=run_id,
                task=f"gaia2/{scenario}",
                model=GAIA2_MODEL,
                agent=agent,
                seed=seed,  # type: ignore[arg-type]
                status=RunPhase.finished,
                stop_reason=StopReason.done,
                score=float(passed),
                capabilities=caps,
                details={"gaia2": {"success": passed, "simulated_seconds": sim}},
                spend=Spend(steps=3, usd=usd, wall_seconds=20.0),
                integrity_verdict="PASS",
            )
        )
    cdir.write_campaign(spec, specs)
    for s, res in zip(specs, results, strict=True):
        write_run(cdir, s, res, [])


# -- outcomes: error outcomes and runs whose grading gave no value --------------------------------------------------


@dataclass
class PlantedOutcome:
    """One run of the outcomes campaign: `score` None with `outcome` no_value is a clean grading without a value;
    an error outcome has status Failed and the failing step's last lines in `error`."""

    run_id: str
    model: str
    seed: int
    outcome: Outcome
    score: float | None = None
    stop: StopReason = StopReason.time
    wall_s: float = 3600.0
    end_summary: str | None = None
    error: str | None = None
    verdict: str = "PASS"
    curve: list[float | None] = field(default_factory=list)

    @property
    def is_error(self) -> bool:
        return self.outcome.is_error


NO_VALUE_NOTE = "subtask avg_acc: the grader wrote no value (grade.sh printed: results/acc.json not found)"
GRADER_TRACE = "grade.sh exited 1:\nTraceback (most recent call last):\nModuleNotFoundError: No module named 'sklearn'"
OUTCOME_PAPER = [
    PlantedOutcome("oc--gpt5--s0", MODELS[0], 0, Outcome.scored, 0.6, curve=[None, 0.3, 0.6]),
    PlantedOutcome("oc--gpt5--s1", MODELS[0], 1, Outcome.scored, 0.2, curve=[0.1, 0.2]),
    # a do-nothing run that ends itself early claiming success: no value (fires silent_failure and early_stop)
    PlantedOutcome(
        "oc--gpt5--s2",
        MODELS[0],
        2,
        Outcome.no_value,
        stop=StopReason.done,
        wall_s=600.0,
        end_summary="Done: training works and accuracy improved.",
        curve=[None, None],
    ),
    PlantedOutcome("oc--gpt5--s3", MODELS[0], 3, Outcome.no_value, curve=[None, None, None]),  # no flag
    PlantedOutcome(
        "oc--gpt5--s4", MODELS[0], 4, Outcome.grader_error, stop=StopReason.done, error=GRADER_TRACE, curve=[0.5, None]
    ),
    PlantedOutcome(
        "oc--gpt5--s5",
        MODELS[0],
        5,
        Outcome.setup_error,
        stop=StopReason.setup_error,
        wall_s=0.0,
        error="install.sh exited 1:\nERROR: No matching distribution found for torch==9.9",
    ),
    PlantedOutcome("oc--gpt5--s6", MODELS[0], 6, Outcome.scored, 0.9, verdict="SUSPICIOUS", curve=[0.9]),
    # a model whose only run did nothing: no mean, no interval (never 0.000 [0.00, 0.00])
    PlantedOutcome("oc--claude--s0", MODELS[1], 0, Outcome.no_value, curve=[None]),
]
OUTCOME_GAIA2 = [  # (seed, outcome, passed) on gaia2/time_door_code, capability time
    (0, Outcome.scored, True),
    (1, Outcome.scored, False),
    (2, Outcome.judge_error, None),
    (3, Outcome.world_error, None),
]


def _outcome_events(p: PlantedOutcome) -> list[dict]:
    out: list[dict] = [{"type": "start", "ts": _iso(0), "run_id": p.run_id, "step": 0, "model": p.model}]
    if p.outcome is Outcome.setup_error:
        return out
    steps = 6
    for step in range(1, steps + 1):
        t = p.wall_s * step / steps
        tool, args = ("bash", {"command": "python train.py"})
        if step == steps and p.end_summary:
            tool, args = "end_task", {"summary": p.end_summary}
        call = {"id": f"c{step}", "name": tool, "arguments": args}
        message = {"role": "assistant", "content": "Next I run the script.", "tool_calls": [call]}
        usage = {"input": 1000, "output": 200, "reasoning": 0, "cached": 0}
        out.append({"type": "model_call", "purpose": "step", "step": step, "ts": _iso(t - 1), "message": message})
        out[-1] |= {"model": p.model, "usage": usage, "cost_usd": 0.01}
        output = "ended" if tool == "end_task" else "Error: results/ is empty"
        out.append(
            {"type": "tool_call", "step": step, "ts": _iso(t), "call_id": f"c{step}", "tool": tool, "args": args}
            | {"access": "read", "ok": True, "output": output, "duration_s": 0.1}
        )
    return out


def _outcome_result(p: PlantedOutcome) -> RunResult:
    n = max(1, len(p.curve))
    curve = [
        Grade(
            at_seconds=p.wall_s * (i + 1) / n,
            step=i + 1,
            subtasks=[SubtaskScore(id="avg_acc", raw=None if s is None else s * 0.842, fraction_of_sota=s)],
            score=s,
            error=p.error if p.is_error and i == len(p.curve) - 1 else None,
            note=NO_VALUE_NOTE if s is None and not p.is_error else None,
        )
        for i, s in enumerate(p.curve)
    ]
    subtasks = [SubtaskScore(id="avg_acc", raw=None if p.score is None else p.score * 0.842, fraction_of_sota=p.score)]
    return RunResult(
        run_id=p.run_id,
        task=TASK,
        model=p.model,
        seed=p.seed,
        status=RunPhase.failed if p.is_error else RunPhase.finished,
        stop_reason=p.stop,
        outcome=p.outcome,
        error=p.error,
        message=NO_VALUE_NOTE if p.outcome is Outcome.no_value else None,
        score=p.score,
        beat_baseline=None if p.score is None else p.score > BASELINE,
        completion=None if p.is_error else float(p.score is not None),
        subtasks=[*subtasks, SubtaskScore(id="forgetting")][: 1 if p.is_error else 2],
        spend=Spend(steps=0 if p.outcome is Outcome.setup_error else 6, usd=0.06, wall_seconds=p.wall_s),
        score_curve=curve,
        integrity_verdict=p.verdict,
    )


def write_outcomes_campaign(root: Path) -> None:
    """A campaign of the paper task and a Gaia2 scenario whose runs end in every kind of outcome (OUTCOME_PAPER,
    OUTCOME_GAIA2): scored, no value, and grader, setup, judge and world errors."""
    cdir = CampaignDir(root)
    scenario = "time_door_code"
    specs = [
        RunSpec(
            run_id=p.run_id,
            campaign="outcomes",
            task=TASK,
            task_path=TASK_PATH,
            model=p.model,
            seed=p.seed,
            budgets=BUDGET,
        )
        for p in OUTCOME_PAPER
    ]
    gaia2 = []
    for seed, outcome, passed in OUTCOME_GAIA2:
        run_id = f"oc-{scenario}--s{seed}"
        spec = RunSpec(
            run_id=run_id,
            campaign="outcomes",
            task=f"gaia2/{scenario}",
            task_path=f"/x/{scenario}.json",
            family="gaia2",  # type: ignore[arg-type]
            model=GAIA2_MODEL,
            seed=seed,
        )
        verdict: dict = {"success": bool(passed), "simulated_seconds": 600.0}
        if outcome is Outcome.judge_error:
            verdict |= {"exception": "LLMEngineException: Connection error.", "rationale": "Exception"}
        error = {
            Outcome.judge_error: "ARE's judge failed: LLMEngineException: Connection error.",
            Outcome.world_error: "world process died:\nKeyError: 'Messages'",
        }.get(outcome)
        result = RunResult(
            run_id=run_id,
            task=spec.task,
            model=GAIA2_MODEL,
            seed=seed,
            status=RunPhase.failed if outcome.is_error else RunPhase.finished,
            stop_reason=StopReason.world_error if outcome is Outcome.world_error else StopReason.done,
            outcome=outcome,
            error=error,
            score=None if passed is None else float(passed),
            capabilities=["time"],
            details={} if outcome is Outcome.world_error else {"gaia2": verdict},
            spend=Spend(steps=3, usd=0.02, wall_seconds=20.0),
            integrity_verdict="PASS",
        )
        gaia2.append((spec, result))
    spec = CampaignSpec(name="outcomes", tasks=[TASK, f"gaia2/{scenario}"], models=MODELS, seeds=7, budgets=BUDGET)
    cdir.write_campaign(spec, specs + [s for s, _ in gaia2])
    for p, s in zip(OUTCOME_PAPER, specs, strict=True):
        write_run(cdir, s, _outcome_result(p), _outcome_events(p))
    for s, res in gaia2:
        write_run(cdir, s, res, [])
