"""The operator reaches a RayCluster it did not start (`rayAddress`) with patience: a head that is still starting
(installed with the chart in the same release) is waited for (`connect(..., patience_s)`, the operator's
RAY_CONNECT_PATIENCE_S), and a head that never answers is a one-line error once the patience is spent, not a hang
and not a traceback. The driver runs in a process of its own, as the operator's does; the cluster is a real
`ray start --head` (`raynodes.LocalRayCluster`) with token authentication, reached through Ray Client."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from raynodes import LocalRayCluster, free_port

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent(
    """
    import sys, time
    from labkube.operator.driver import DriverError, connect
    started = time.monotonic()
    try:
        connect(sys.argv[1], 1, patience_s=float(sys.argv[2]))
    except DriverError as exc:
        print(f"ERROR after {time.monotonic() - started:.1f}s: {exc}", flush=True)
        sys.exit(1)
    import ray
    print(f"CONNECTED after {time.monotonic() - started:.1f}s; probe={ray.cluster_resources().get('probe', 0):g}")
    ray.shutdown()
    """
)


def driver(address: str, patience_s: float, token: str, log: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    # Ray Client's own connection attempt gives up in about 3 s instead of 30 (three tries of 1 s), so the head
    # comes up after several of them and it is labkube's patience, not Ray Client's, that waits for it
    env |= {"RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}
    return subprocess.Popen(
        [sys.executable, "-P", "-c", DRIVER, address, str(patience_s)],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the driver did not finish in {timeout:g}s: {out}")
    return out.strip()


def test_a_head_that_starts_after_the_driver_is_waited_for(tmp_path: Path) -> None:
    port, token = free_port(), os.urandom(32).hex()
    proc = driver(f"ray://127.0.0.1:{port}", 120, token, tmp_path / "driver.log")
    cluster = None
    try:
        time.sleep(5)  # the driver has tried and failed at least once: nothing listens yet
        assert proc.poll() is None, finish(proc, 5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        cluster = LocalRayCluster(tmp_path / "ray", 0, env, {"probe": 1}, client_port=port, token=token)
        out = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if cluster is not None:
            cluster.stop()
            assert not cluster.leftovers()
    assert out.startswith("CONNECTED") and out.endswith("probe=1"), f"{out}\n{(tmp_path / 'driver.log').read_text()}"
    waited = float(out.split()[2].rstrip("s;"))
    assert waited > 5, f"connected after {waited}s, before the head was started: {out}"


def test_a_head_that_never_answers_is_a_one_line_error_once_the_patience_is_spent(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    out = finish(driver(f"ray://127.0.0.1:{port}", 3, os.urandom(32).hex(), tmp_path / "driver.log"), 60)
    took = time.monotonic() - started
    assert out.startswith("ERROR") and "\n" not in out, out
    assert f"cannot start or reach Ray at ray://127.0.0.1:{port}: " in out
    assert took >= 3, f"gave up after {took:.1f}s, before its patience of 3s was spent"
