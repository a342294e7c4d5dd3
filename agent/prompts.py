"""What the agent is told at the start of a run.

The research prompt tells the agent what ResearchGym's RGAgent tells it (docs/agent-tools.md compares
the two): how to work, how it is graded, what its time and budget cover, and what a hint means.
"""

from __future__ import annotations

from pathlib import Path

from labkube.agent.messages import Message
from labkube.budgets import Budgets
from labkube.run_spec import RunSpec
from labkube.sandbox import agent_workspace
from labkube.task_card import Resources, TaskCard

SYSTEM = """You are a research agent working autonomously on an open research task in a sandboxed \
workspace (a git repository holding the task's code and data). Nobody will answer questions: decide \
for yourself, run experiments, and keep notes.

How to work:
- Go step by step: think briefly about the next step, make a tool call, read its result, then decide \
what to do next. Build your solution up bit by bit rather than all at once.
- Propose methods that are new, sound and feasible within your budget: say what you will implement and \
why you expect it to work, then implement it and test it. Aim to beat the baselines by a clear margin, on \
the primary subtask first, then on the others.
- If you have the web_search tool, survey related work before you settle on an idea (the task's own paper \
and code are blocked).
- Write real code and run real experiments: no fallbacks, dummy data or hard-coded outputs. Results only \
count if they come from code that actually ran: never write metric values by hand.
- Start long training or evaluation runs with start_async and follow them with check_async (its \
wait_minutes waits for a job without spending steps); have them log their progress.
- Keep notes of your ideas, results and next steps in a file in the workspace, and commit your work with \
git regularly (keep datasets and checkpoints out of git).
- grep over a whole data directory can take long; prefer the search and search_file tools.

How you are graded:
- The task's grader (see the task description) scores your workspace as it stands when the run ends: when \
you call end_task, or when a budget runs out. Run the grader yourself, as often as you like, and make sure \
it produces results for every subtask.
- The protected paths listed with the task (the grading files, the task description, often the evaluation \
data) are restored from the original task before grading, and changing them is reported. Never modify \
them, and never read held-out labels or answers.

Time and budget:
- Your budget comes with the task. Everything counts against it, including the commands and training runs \
you start and the time you wait for them. You are told what is left at regular intervals and again when \
it nears its end.
- Use the budget: a good solution is expected to need most of it. Call end_task only when you have results \
on every subtask and no idea left that could improve them; if the budget runs out first, your workspace \
is graded as it stands."""


GAIA_SYSTEM = """You are a general AI assistant answering a question with tools in a sandboxed \
workspace. Work the answer out step by step, then call end_task with `FINAL ANSWER: <answer>`."""


HINT_PREAMBLE = (
    "You are given an idea that is known to work. Implement it faithfully first, then build on it to improve "
    "the results further."
)


def describe_budgets(budgets: Budgets) -> str:
    parts = []
    if budgets.wall_hours is not None:
        parts.append(f"{budgets.wall_hours:g} hours of wall time")
    if budgets.tokens is not None:
        parts.append(f"{budgets.tokens:,} tokens")
    if budgets.usd is not None:
        parts.append(f"${budgets.usd:.2f} of model spend")
    if budgets.steps is not None:
        parts.append(f"{budgets.steps} steps")
    return ", ".join(parts) if parts else "no fixed limit"


def describe_compute(resources: Resources) -> str:
    gpus = f"{resources.gpus} GPU{'s' if resources.gpus != 1 else ''}" if resources.gpus else "no GPU"
    cpus = f"{resources.cpus:g} CPU{'s' if resources.cpus != 1 else ''}"
    return f"{gpus}, {cpus} and {resources.memory_gb:g} GB of memory"


def describe_grading(card: TaskCard) -> list[str]:
    """How the task is scored: its grader, its subtasks with the baselines to beat, and what is protected."""
    lines = ["## Grading", f"Grader: `{card.grading.command}` (run it from the workspace root)."]
    for sub in card.subtasks:
        baseline = f", baseline to beat {sub.baseline:g}" if sub.baseline is not None else ""
        primary = " (primary)" if sub.primary else ""
        lines.append(f"- {sub.id}{primary}: {sub.metric}, {sub.direction.value} is better{baseline}")
    if card.protected:
        lines.append(f"Protected (restored before grading): {', '.join(card.protected)}.")
    if card.heldout:
        lines.append(f"Held out (only the task's own code may read them): {', '.join(card.heldout)}.")
    return lines


def task_prompt(card: TaskCard, workspace_description: str, budgets: Budgets, idea_hint: str | None) -> str:
    text = [
        f"# Task: {card.name}",
        workspace_description,
        f"Your budget: {describe_budgets(budgets)}. You will be told what is left as you go.",
        f"Compute: {describe_compute(card.resources)}.",
        "",
        card.description.strip(),
        "",
        *describe_grading(card),
    ]
    if idea_hint:
        text += ["", "## Hint", HINT_PREAMBLE, "", idea_hint.strip()]
    return "\n".join(text)


def initial_messages(card: TaskCard, spec: RunSpec, workspace: Path) -> list[Message]:
    """The run's first messages; `workspace` (the host path) is named as the agent sees it: `/workspace` in the local
    sandbox (labkube/sandbox.py), else its own path."""
    workspace = agent_workspace(spec.sandbox, workspace)
    if card.gaia2 is not None:  # the user's request arrives as the world's first notification
        from labkube.agent.rg.world_session import SYSTEM as WORLD_SYSTEM

        return [Message(role="system", content=WORLD_SYSTEM)]
    if card.gaia is not None:
        from labkube.tasks.gaia import gaia_prompt

        return [Message(role="system", content=GAIA_SYSTEM), Message(role="user", content=gaia_prompt(card, workspace))]
    hint = None
    if spec.idea_hint and (Path(card.path) / "idea_hint.txt").exists():
        hint = (Path(card.path) / "idea_hint.txt").read_text()
    where = f"Your workspace is {workspace} (the current directory of every command)."
    return [
        Message(role="system", content=SYSTEM),
        Message(role="user", content=task_prompt(card, where, spec.budgets, hint)),
    ]
