"""The operator reaches a RayCluster it did not start (`rayAddress`) with patience: a head that is still starting
(installed with the chart in the same release) is waited for (`connect(..., patience_s)`, the operator's
RAY_CONNECT_PATIENCE_S), and a head that never answers is a one-line error once the patience is spent, not a hang
and not a traceback. Both address forms: `IP:port` (the GCS, what a user passes to --ray-address) and `ray://IP:port`
(Ray Client, the operator's rayAddress), with Ray's own client timeouts. The driver runs in a process of its own,
as the operator's does; the cluster is a real `ray start --head` (`raynodes.LocalRayCluster`) with token
authentication."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from raynodes import LocalRayCluster, free_port

from labkube.cli_checks import check_ray_address

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
    """Ray's own client settings, as a user or the operator has them: no shortened Ray Client timeouts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
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


def wait_for_failed_attempt(proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> None:
    """Until the driver logs that an attempt failed (nothing listens yet), or the deadline."""
    deadline = time.monotonic() + timeout
    while "attempt 1 failed" not in log.read_text():
        assert proc.poll() is None, finish(proc, 5)
        assert time.monotonic() < deadline, f"no failed attempt logged in {timeout:g}s: {log.read_text()}"
        time.sleep(0.1)


# What a user passes to --ray-address (the GCS, `IP:port`) and what the operator's rayAddress is (Ray Client).
FORMS = {"gcs": "{port}", "client": "ray://{port}"}


@pytest.mark.parametrize("form", FORMS)
def test_a_head_that_starts_after_the_driver_is_waited_for(tmp_path: Path, form: str) -> None:
    port, token, log = free_port(), os.urandom(32).hex(), tmp_path / "driver.log"
    address = FORMS[form].format(port=f"127.0.0.1:{port}")
    proc = driver(address, 120, token, log)
    cluster = None
    try:
        wait_for_failed_attempt(proc, log)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        ports = {"gcs_port": port} if form == "gcs" else {"client_port": port}
        cluster = LocalRayCluster(tmp_path / "ray", 0, env, {"probe": 1}, token=token, **ports)  # type: ignore[arg-type]
        # From when the head says it runs, not from `ray start`: the head's own start on a loaded machine is not the
        # driver's patience under test. The driver tries again at most 10 s apart, and an attempt may wait on Ray
        # Client's own handshake.
        head_up = time.monotonic()
        out = finish(proc, 120)
        connected_after = time.monotonic() - head_up
        check_ray_address(address)  # the CLI's pre-flight handshake passes on the real GCS and Ray Client ports
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if cluster is not None:
            cluster.stop()
            assert not cluster.leftovers()
    assert out.startswith("CONNECTED") and out.endswith("probe=1"), f"{out}\n{log.read_text()}"
    assert connected_after < 60, f"connected {connected_after:.1f}s after the head started: {out}"


@pytest.mark.parametrize("form", FORMS)
def test_a_head_that_never_answers_is_a_one_line_error_once_the_patience_is_spent(tmp_path: Path, form: str) -> None:
    address = FORMS[form].format(port=f"127.0.0.1:{free_port()}")
    started = time.monotonic()
    out = finish(driver(address, 3, os.urandom(32).hex(), tmp_path / "driver.log"), 60)
    took = time.monotonic() - started
    assert out.startswith("ERROR") and "\n" not in out, out
    assert f"cannot start or reach Ray at {address}: nothing answers at 127.0.0.1:" in out
    assert took >= 3, f"gave up after {took:.1f}s, before its patience of 3s was spent"
    # bounded by the patience, not by Ray's own retries (minutes for a GCS address, about 35 s for Ray Client)
    assert took < 20, f"gave up after {took:.1f}s with a patience of 3s"
