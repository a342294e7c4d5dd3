"""Task environments that download from the Hugging Face Hub, with the real `huggingface_hub` client (installed into
the task's environment by uv from PyPI) talking to a fake Hub (tests/fakehub.py) through `HF_ENDPOINT`.

A ResearchGym-style task: requirements.txt names huggingface_hub, install.sh downloads a dataset file and snapshots
a small model into the environment's Hugging Face cache. Setup downloads once; the agent's `python` and the grader
read the files offline (`HF_HUB_OFFLINE=1`); later runs and `labkube tasks prepare` reuse the environment without
a request; without the Hub a first build is `setup_error` naming install.sh and the path to pre-populate, and an
earlier version's environment is untouched."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_task_environment
from cli_helpers import labkube
from fakehub import FakeHub
from test_task_environment import task_with_env
from tinytask import make_run_dir

from labkube.result import RunResult
from labkube.tasks import load_task
from labkube.tasks.environment import READY, TaskEnv, activate, ensure_env, env_dir, env_key, ready_env

REQUIREMENTS = "huggingface_hub>=0.30,<3\n"
INSTALL_SH = """#!/usr/bin/env bash
set -euo pipefail
python - <<'PY'
from huggingface_hub import hf_hub_download, snapshot_download
print("dataset at", hf_hub_download("org/data", "train.csv", repo_type="dataset"))
print("model at", snapshot_download("org/tiny-model"))
PY
"""
TRAIN_CSV = "x,y\n1,2\n3,4\n5,6\n"
WEIGHTS = bytes(range(256)) * 8  # an LFS file: the Hub redirects to its CDN
env_cache = test_task_environment.env_cache  # the fixture: LABKUBE_ENV_CACHE in tmp_path

SETUP_DOWNLOADS = ["dataset:org/data/train.csv", "model:org/tiny-model/config.json", "model:org/tiny-model/w.bin"]

# The agent's python reads the dataset as the task's code would: through the client, which must not go online.
READ_DATASET = {
    "tool": "python",
    "args": {
        "code": "import os\nfrom huggingface_hub import hf_hub_download, snapshot_download\n"
        "p = hf_hub_download('org/data', 'train.csv', repo_type='dataset')\n"
        "m = snapshot_download('org/tiny-model')\n"
        "print('HF_HUB_OFFLINE', os.environ.get('HF_HUB_OFFLINE'), 'dataset', p, 'model', m)\n"
        "open('result.txt', 'w').write(str(len(open(p).read().splitlines()) - 1))"
    },
}
# The grader too: it counts the rows itself and scores the agent's count only when it agrees.
GRADE_SH = """#!/usr/bin/env bash
set -euo pipefail
TASK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 - "$TASK_DIR" <<'PY'
import json, os, pathlib, sys
from huggingface_hub import hf_hub_download
root = pathlib.Path(sys.argv[1])
rows = len(open(hf_hub_download("org/data", "train.csv", repo_type="dataset")).read().splitlines()) - 1
claimed = float((root / "result.txt").read_text().strip())
(root / "grading" / "results.json").write_text(json.dumps({"score": claimed if claimed == rows else 0.0}))
print("grader HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE"), "rows", rows)
PY
"""


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The fake Hub with the task's dataset and model, named by HF_ENDPOINT for this process and its children
    (setup, `labkube` subprocesses, the agent's tools); stopped at teardown."""
    server = FakeHub().start()
    try:
        server.add_file("org/data", "train.csv", TRAIN_CSV, repo_type="dataset")
        server.add_file("org/tiny-model", "config.json", '{"hidden_size": 8}')
        server.add_file("org/tiny-model", "w.bin", WEIGHTS, lfs=True)
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        yield server
    finally:
        server.stop()


def hf_task(root: Path) -> Path:
    task = task_with_env(root, requirements=REQUIREMENTS, install_sh=INSTALL_SH, steps=[READ_DATASET])
    (task / "grading" / "grade.sh").write_text(GRADE_SH)
    return task


def cached_dataset(env: Path, hub: FakeHub) -> Path:
    """Where the client keeps the dataset file in the environment's cache (HF_HOME/hub/<repo>/snapshots/<commit>)."""
    snapshot = env / "cache" / "huggingface" / "hub" / "datasets--org--data" / "snapshots"
    return snapshot / hub.commit("org/data", repo_type="dataset") / "train.csv"


def test_setup_downloads_once_into_the_environments_cache_and_prepare_reuses_it(
    tmp_path: Path, env_cache: Path, hub: FakeHub
) -> None:
    task = hf_task(tmp_path)
    built = labkube("tasks", "prepare", str(task), cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    assert sorted(hub.downloads) == SETUP_DOWNLOADS  # each file once, with the real client
    (env,) = [p.parent for p in env_cache.glob(f"*/{READY}")]
    assert cached_dataset(env, hub).read_text() == TRAIN_CSV
    model = env / "cache" / "huggingface" / "hub" / "models--org--tiny-model" / "snapshots"
    assert (model / hub.commit("org/tiny-model") / "w.bin").read_bytes() == WEIGHTS
    assert "dataset at " + str(cached_dataset(env, hub)) in (env / "setup.log").read_text()

    seen = len(hub.requests)
    again = labkube("tasks", "prepare", str(task), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "environment reused" in again.stderr and str(env) in again.stderr.replace("\n", "")
    assert hub.requests[seen:] == []  # reused: install.sh did not run again, nothing asked the Hub


def test_runs_read_the_downloads_offline_and_the_second_run_asks_nothing(
    tmp_path: Path, env_cache: Path, hub: FakeHub
) -> None:
    """Two `labkube agent` processes on one task (as the local sandbox runs them): the first builds the environment,
    downloading once; in both the agent's python and the grader get the files from the cache with HF_HUB_OFFLINE=1
    (the client would otherwise ask HF_ENDPOINT, here the fake Hub, which sees nothing after setup)."""
    task = hf_task(tmp_path)
    setups = []
    for seed in (0, 1):
        rd = make_run_dir(tmp_path, task, seed=seed)
        seen = len(hub.requests)
        ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        setup = TaskEnv.model_validate_json((rd / "setup.json").read_text())
        setups.append(setup)
        asked = hub.requests[seen:]
        if setup.reused:
            assert asked == []  # neither setup nor the agent's python nor the grader asked the Hub
        else:  # install.sh's requests only: one HEAD per file, each file fetched once
            assert sorted(hub.downloads) == SETUP_DOWNLOADS
            assert len([r for r in asked if r.method == "HEAD"]) == len(SETUP_DOWNLOADS)

        events = [json.loads(x) for x in (rd / "transcript.jsonl").read_text().splitlines()]
        output = next(e for e in events if e.get("type") == "tool_call" and e.get("tool") == "python")["output"]
        assert f"HF_HUB_OFFLINE 1 dataset {cached_dataset(setup.path, hub)}" in output, output
        result = RunResult.model_validate_json((rd / "result.json").read_text())
        assert [s.raw for s in result.subtasks] == [3.0], result.model_dump_json(indent=1)[-2000:]  # grader agreed
    assert [s.reused for s in setups] == [False, True] and setups[0].path == setups[1].path
    assert sorted(hub.downloads) == SETUP_DOWNLOADS  # once, by the first run's setup


def test_without_the_hub_a_first_build_is_setup_error_and_an_earlier_environment_survives(
    tmp_path: Path, env_cache: Path, hub: FakeHub
) -> None:
    task = hf_task(tmp_path)
    earlier = ensure_env(load_task(str(task)))
    assert earlier is not None and cached_dataset(earlier.path, hub).is_file()
    before = sorted(str(p.relative_to(earlier.path)) for p in earlier.path.rglob("*"))

    (task / "install.sh").write_text(INSTALL_SH.replace('"train.csv"', '"train.csv", revision="main"'))  # a new key
    card = load_task(str(task))
    new_env = env_dir(card, env_key(task) or "")
    hub.stop()  # the Hub's port is closed: connection refused, as without network
    rd = make_run_dir(tmp_path, task)
    ran = labkube("agent", "--run-dir", str(rd), cwd=tmp_path)
    assert ran.returncode != 0 and not (rd / "transcript.jsonl").exists()  # the agent never started

    result = RunResult.model_validate_json((rd / "result.json").read_text())
    assert result.status.value == "Failed" and result.stop_reason.value == "setup_error"
    message = result.error or ""
    assert "\n" not in message and message.startswith("setup step install.sh needed the network"), message
    assert "LocalEntryNotFoundError" in message  # the client's own last line
    assert "labkube tasks prepare TASK" in message and "LABKUBE_ENV_CACHE" in message
    assert f"copy or mount it at {new_env}" in message  # the directory to pre-populate
    assert "LocalEntryNotFoundError" in result.details["setup_log_tail"]
    assert not ready_env(card)

    assert sorted(str(p.relative_to(earlier.path)) for p in earlier.path.rglob("*")) == before
    assert cached_dataset(earlier.path, hub).read_text() == TRAIN_CSV and (earlier.path / READY).is_file()


def test_the_users_own_hugging_face_cache_settings_do_not_move_the_tasks_cache(
    tmp_path: Path, env_cache: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HOME and HF_HUB_CACHE of the shell labkube runs in point elsewhere (a user's cache, a cluster's shared one):
    setup still downloads into the environment, and the task's code still reads from there, offline."""
    user_cache = tmp_path / "users-hf"
    monkeypatch.setenv("HF_HOME", str(user_cache / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(user_cache / "hub"))
    env = ensure_env(load_task(str(hf_task(tmp_path))))
    assert env is not None and cached_dataset(env.path, hub).is_file()
    seen = len(hub.requests)
    code = "from huggingface_hub import hf_hub_download as d; print(d('org/data', 'train.csv', repo_type='dataset'))"
    read = subprocess.run(
        ["python", "-c", code], env=activate(env.venv, dict(os.environ)), capture_output=True, text=True, check=False
    )
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.strip() == str(cached_dataset(env.path, hub)) and hub.requests[seen:] == []
    assert not list(user_cache.rglob("*.csv"))
