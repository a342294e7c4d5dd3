"""Task environments (`labkube.tasks.environment`), built for real with uv from PyPI: a virtualenv from the task's
requirements.txt, then its install.sh, cached by the files' hash, shared read-only, linked into each run; a failed
step is `setup_error` with the tool's own message; a step that needed the network says how to pre-populate the
cache. End to end through the local sandbox: the agent's `python` imports the package, the grader runs in the
environment, the second run reuses it, and setup time is reported beside the budget, not charged to it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tinytask import make_tiny_task

from labkube.campaign import CampaignSpec
from labkube.operator import launch
from labkube.tasks import load_task
from labkube.tasks.environment import (
    READY,
    SetupError,
    TaskEnvRecord,
    cache_root,
    ensure_env,
    env_dir,
    env_key,
    link_setup_outputs,
)

INSTALL_SH = """#!/usr/bin/env bash
set -euo pipefail
python -c "import six" # the requirements are installed before install.sh runs, in the same venv
echo "built by install.sh with $(python -c 'import sys; print(sys.prefix)')" > setup_marker.txt
mkdir -p downloaded && echo 42 > downloaded/data.txt
"""
CHECK_SIX = {
    "tool": "python",
    "args": {
        "code": "import six, sys\nprint('six', six.__version__, 'in', sys.prefix)\n"
        "open('six.txt', 'w').write(six.__version__)"
    },
}
READ_MARKER = {"tool": "read_file", "args": {"path": "setup_marker.txt"}}
WRITE = {"tool": "bash", "args": {"command": "echo 6 > result.txt"}}


@pytest.fixture
def env_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "env-cache"
    monkeypatch.setenv("LABKUBE_ENV_CACHE", str(cache))
    return cache


def task_with_env(
    root: Path, requirements: str = "six\n", install_sh: str = INSTALL_SH, steps: list | None = None
) -> Path:
    task = make_tiny_task(root, steps or [WRITE, CHECK_SIX, READ_MARKER])
    (task / "requirements.txt").write_text(requirements)
    (task / "install.sh").write_text(install_sh)
    return task


def test_the_key_follows_the_files_and_the_python_version(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [WRITE])
    assert env_key(task) is None  # no requirements.txt, no install.sh: no environment
    (task / "requirements.txt").write_text("six\n")
    first = env_key(task)
    assert first is not None and env_key(task) == first
    (task / "requirements.txt").write_text("six==1.17.0\n")
    assert env_key(task) != first
    (task / "install.sh").write_text("true\n")
    assert env_key(task) not in (None, first)


def test_an_overlay_that_renames_a_task_keeps_its_environments_place(tmp_path: Path) -> None:
    """A pod's `task-env` init container builds from the task folder alone; the agent loads the card with the
    campaign's overlay. Both must name the same environment, whatever `name:` the overlay gives."""
    from labkube.tasks.researchgym import load_researchgym

    task = task_with_env(tmp_path)
    key = env_key(task)
    assert key is not None
    plain = load_researchgym(task, str(task))
    renamed = load_researchgym(task, str(task), overlay_content={"name": "Renamed by an overlay"})
    assert renamed.name == "Renamed by an overlay" != plain.name
    assert env_dir(renamed, key) == env_dir(plain, key) == cache_root() / f"{task.name}-{key}"


def test_build_once_then_reuse_read_only_and_link_what_install_sh_made(tmp_path: Path, env_cache: Path) -> None:
    card = load_task(str(task_with_env(tmp_path)))
    built = ensure_env(card)
    assert built is not None and not built.reused and built.path.parent == env_cache
    record = TaskEnvRecord.model_validate_json((built.path / READY).read_text())
    assert (
        record.requirements
        and record.install_sh
        and [s.name for s in record.steps]
        == [
            "uv venv",
            "requirements.txt",
            "install.sh",
        ]
    )
    marker = (built.task_copy / "setup_marker.txt").read_text()
    assert str(built.venv) in marker  # install.sh ran with the venv active
    assert (built.venv / "bin" / "python").exists()
    assert not os.access(built.venv / "bin", os.W_OK) or os.getuid() == 0  # read-only (root bypasses modes)
    assert (built.venv / "bin").stat().st_mode & 0o222 == 0
    again = ensure_env(card)
    assert again is not None and again.reused and again.path == built.path and again.seconds < built.seconds
    workspace = tmp_path / "ws"
    workspace.mkdir()
    assert link_setup_outputs(built, Path(card.path), workspace) == ["downloaded", "setup_marker.txt"]
    assert (workspace / "downloaded" / "data.txt").read_text() == "42\n"


def unwrapped(log: str) -> str:
    """A log's words with its line breaks undone: uv wraps its errors to the terminal's width, which differs between
    a test process and another (pytest-xdist's workers have none)."""
    return " ".join(log.split())


def test_a_broken_requirement_is_a_setup_error_with_the_installers_message(tmp_path: Path, env_cache: Path) -> None:
    card = load_task(str(task_with_env(tmp_path, requirements="no-such-package-labkube-xyz==1.0\n")))
    with pytest.raises(SetupError) as caught:
        ensure_env(card)
    message = str(caught.value)
    assert message.startswith("setup step requirements.txt failed") and "no-such-package-labkube-xyz" in message
    assert "not found in the package registry" in unwrapped(caught.value.log_tail)
    assert not list(env_cache.glob(f"*/{READY}"))  # nothing half-built is taken for ready


def test_a_step_that_needed_the_network_says_how_to_prepopulate_the_cache(tmp_path: Path, env_cache: Path) -> None:
    offline = (
        "#!/usr/bin/env bash\nset -e\npython -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:9/data')\"\n"
    )
    card = load_task(str(task_with_env(tmp_path, install_sh=offline)))
    with pytest.raises(SetupError, match=r"setup step install.sh needed the network") as caught:
        ensure_env(card)
    assert "labkube tasks prepare" in str(caught.value) and str(env_cache) in str(caught.value)


@pytest.mark.slow
def test_runs_get_the_environment_before_step_one_and_setup_is_not_charged(
    ray_local, tmp_path: Path, env_cache: Path
) -> None:
    task = task_with_env(tmp_path, steps=[WRITE, CHECK_SIX, READ_MARKER])
    spec = CampaignSpec(name="envs", tasks=[str(task)], models=["oracle"], seeds=2, concurrency=1)
    results = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    setups = []
    for result in sorted(results, key=lambda r: r.seed):
        assert result.status.value == "Finished" and result.stop_reason.value == "done", result.error
        run_dir = tmp_path / "out" / "runs" / result.run_id
        assert (run_dir / "workspace" / "six.txt").read_text() == "1.17.0"
        events = [json.loads(x) for x in (run_dir / "transcript.jsonl").read_text().splitlines()]
        python_call = next(e for e in events if e.get("type") == "tool_call" and e.get("tool") == "python")
        assert f"six 1.17.0 in {env_cache}" in python_call["output"]  # the agent's python is the environment's
        setup = json.loads((run_dir / "setup.json").read_text())
        setups.append(setup)
        assert result.setup_seconds == pytest.approx(setup["seconds"], abs=1e-3)
        assert result.spend.wall_seconds < 60  # the agent's clock: setup is not in it
    # One run built the environment and the other reused it. Which of the two started first is not promised: the
    # supervisor admits the runs queued on it as its event loop takes their calls (operator/driver.py).
    assert sorted(s["reused"] for s in setups) == [False, True]
    assert setups[0]["path"] == setups[1]["path"]


@pytest.mark.slow
def test_a_run_whose_setup_fails_ends_setup_error_and_the_agent_never_starts(
    ray_local, tmp_path: Path, env_cache: Path
) -> None:
    task = task_with_env(tmp_path, requirements="no-such-package-labkube-xyz==1.0\n")
    spec = CampaignSpec(name="broken", tasks=[str(task)], models=["oracle"], seeds=1)
    (result,) = launch(spec, tmp_path / "out", ray_ctx=ray_local)
    assert result.status.value == "Failed" and result.stop_reason.value == "setup_error"
    assert "no-such-package-labkube-xyz" in (result.error or "")
    assert "not found in the package registry" in unwrapped(result.details["setup_log_tail"])
    run_dir = tmp_path / "out" / "runs" / result.run_id
    assert not (run_dir / "transcript.jsonl").exists() and result.spend.steps == 0


def test_in_a_pod_the_init_containers_build_time_is_the_results_setup_seconds(tmp_path: Path, env_cache: Path) -> None:
    """The pod's layout as processes, with the commands the manifest gives them (tests/test_pod_manifest.py): the
    `task-env` init container runs `labkube tasks prepare TASK --record <run>/setup.json` into the pod's cache; the
    agent container (LABKUBE_RUN_DIR set, the cache mounted) finds the environment ready and reports the init
    container's build time as setup_seconds, apart from its own clock."""
    from cli_helpers import labkube
    from tinytask import make_run_dir

    from labkube.result import RunResult
    from labkube.tasks.environment import TaskEnv

    task = task_with_env(tmp_path, steps=[WRITE, CHECK_SIX])
    rd = make_run_dir(tmp_path, task)
    prepared = labkube("tasks", "prepare", str(task), "--record", str(rd / "setup.json"), cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    record = TaskEnv.model_validate_json((rd / "setup.json").read_text())
    assert not record.reused and record.seconds > 0 and str(record.path).startswith(str(env_cache))
    ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path, env={"LABKUBE_RUN_DIR": str(rd)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.setup_seconds == pytest.approx(record.seconds, abs=1e-3)
    assert (rd / "workspace" / "six.txt").read_text() == "1.17.0"  # the agent's python was the environment's
    assert TaskEnv.model_validate_json((rd / "setup.json").read_text()) == record  # the agent kept the record


def test_the_installers_last_statement_is_whole_however_narrow_its_terminal_was() -> None:
    from labkube.tasks.environment import last_statement

    wrapped = (
        "  \u00d7 No solution found when resolving dependencies:\n"
        "  ╰─▶ Because no-such-package-labkube-xyz was not found in the package registry and you require\n"
        "      no-such-package-labkube-xyz==1.0, we can conclude that your requirements are\n"
        "      unsatisfiable.\n"
    )
    assert last_statement(wrapped) == (
        "Because no-such-package-labkube-xyz was not found in the package registry and you require "
        "no-such-package-labkube-xyz==1.0, we can conclude that your requirements are unsatisfiable."
    )
    assert last_statement("Collecting x\nERROR: No matching distribution found for x\n") == (
        "ERROR: No matching distribution found for x"
    )
    assert last_statement("") == ""
