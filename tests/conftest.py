"""Shared fixtures: the CLI as a subprocess, a real local Ray for in-process drivers."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser, find_chromium
from proc_owner import mark_this_process

pytest_plugins = ["fault_record"]  # the `fault` fixture and docs/reliability.md, for every directory
mark_this_process()  # what this test process starts is told from what the suite's other processes start

# The fake API servers' access log is a line per request (the lease alone is two a second); a failing test's
# captured output would be nothing else, and CI shows only its tail, so the traceback would be lost.
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def ray_local():
    """One real Ray instance on this machine for the in-process driver tests (2 GPUs for local runs, 2 of the fake
    cluster for run pods); stopped at the end."""
    import ray

    from labkube.operator.driver import connect, shutdown

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ctx = connect(None, concurrency=64, num_gpus=2, pod_gpus=2)
    ctx.started_here = True
    yield ctx
    shutdown(ctx)
    assert not ray.is_initialized()


@pytest.fixture(scope="session")
def are_python() -> Path:
    """The python of ARE's virtualenv, which the world processes run with (installed on first use)."""
    from labkube.tasks.gaia2 import setup_world_env, world_python

    setup_world_env()
    return world_python()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium for the pages' tests (tests/browser.py); on CI its absence is a failure, not a skip."""
    found = find_chromium()
    if found is None:
        message = "headless Chromium not found: apt-get install chromium chromium-driver (scripts/test.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    b = Browser(*found)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(autouse=True)
def no_task_environment_from_an_earlier_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent run in this process names its task's environment in os.environ (LABKUBE_TASK_ENV, as `labkube agent`
    does for its own tools); a later test's subprocesses would inherit it and run in that task's environment."""
    monkeypatch.delenv("LABKUBE_TASK_ENV", raising=False)
