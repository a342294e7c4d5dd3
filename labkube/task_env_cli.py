"""`labkube tasks prepare` and `labkube tasks dockerfile`: a task's environment ahead of a campaign, on this machine or
baked into an image (`labkube.tasks.environment`)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

IMAGE = "ghcr.io/labkube/labkube"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("labkube")
    except PackageNotFoundError:
        return "latest"


ENV_CACHE_IN_IMAGE = "/opt/labkube/task-envs"
TASK_IN_IMAGE = "/opt/labkube/tasks"


def _card(task: str):
    from labkube.cli_checks import UsageFailure
    from labkube.tasks import TaskError, load_task

    try:
        return load_task(task)
    except TaskError as exc:  # bad input, exit 2 as every other refusal (an environment that fails to build is 1)
        raise UsageFailure(str(exc)) from None


@click.command("prepare")
@click.argument("task")
@click.option(
    "--record",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write what was built and how long it took here (a pod's task-env init container: the run's "
    "setup.json, reported as the result's setup_seconds).",
)
def tasks_prepare(task: str, record: Path | None) -> None:
    """Build TASK's environment (requirements.txt with uv, then install.sh) into the cache, as a run would.

    The cache is $LABKUBE_ENV_CACHE, else ~/.cache/labkube/task-envs; runs of the task reuse it."""
    from labkube.tasks.environment import SetupError, cache_root, ensure_env, env_key

    card = _card(task)
    console = Console(stderr=True)
    if env_key(Path(card.path)) is None:
        console.print(f"{card.name}: no requirements.txt or install.sh; nothing to build")
        return
    started = time.monotonic()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as bar:
        step = bar.add_task(f"{card.name}: starting", total=None)
        try:
            env = ensure_env(card, progress=lambda line: bar.update(step, description=line))
        except SetupError as exc:
            bar.stop()
            if exc.log_tail:
                console.print(exc.log_tail, style="dim", highlight=False)
            raise click.ClickException(str(exc)) from None
    assert env is not None
    if record is not None:
        from labkube.store import write_model

        write_model(record, env)
    how = "reused" if env.reused else "built"
    console.print(
        f"{card.name}: environment {how} in {time.monotonic() - started:.1f} s at {env.path} (cache {cache_root()})",
        highlight=False,
    )


def dockerfile_text(name: str, base: str) -> str:
    """A Dockerfile that bakes a task's environment into an image: the task at /opt/labkube/tasks/<name>, its
    environment built by `labkube tasks prepare` into the image's cache, which runs then reuse (no setup in the pod).
    Name the image in the task's `labkube.yaml` as `resources.image`."""
    task = f"{TASK_IN_IMAGE}/{name}"
    return f"""# syntax=docker/dockerfile:1
# The environment of task {name}, baked in: runs of the task in this image skip setup.
# Build: docker build -t <registry>/labkube-task-{name}:<tag> .
# Then in the task's labkube.yaml: resources: {{image: <registry>/labkube-task-{name}:<tag>}}
FROM {base}
ENV LABKUBE_ENV_CACHE={ENV_CACHE_IN_IMAGE}
COPY --chown=1000:1000 task/ {task}/
USER 1000
WORKDIR {task}
RUN ["labkube", "tasks", "prepare", "{task}"]
WORKDIR /
"""


@click.command("dockerfile")
@click.argument("task")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Build context to write (default ./labkube-image-<task>).",
)
@click.option("--base", default=None, help=f"Base image with labkube in it (default {IMAGE}:<this labkube's version>).")
def tasks_dockerfile(task: str, out_dir: Path | None, base: str | None) -> None:
    """Write a Dockerfile and build context that bake TASK's environment into an image (for pods: no setup)."""
    card = _card(task)
    out = out_dir or Path(f"labkube-image-{card.name}")
    if out.exists() and any(out.iterdir()):
        from labkube.cli_checks import UsageFailure

        raise UsageFailure(f"{out} exists and is not empty; pass --out to a new directory")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(card.path, out / "task", symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (out / "Dockerfile").write_text(dockerfile_text(card.name, base or f"{IMAGE}:{_version()}"))
    (out / ".dockerignore").write_text("**/__pycache__\n**/.git\n")
    Console(stderr=True).print(f"wrote {out / 'Dockerfile'} and the build context {out}", highlight=False)
