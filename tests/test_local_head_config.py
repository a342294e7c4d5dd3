"""The Ray head `labkube run` starts on this machine asks for its node's sockets every 20 ms, not every second
(operator/driver.py, HEAD_SYSTEM_CONFIG): with Ray's default, the raylet's object manager that connected to its
object store before the store listened waited a whole second, in about a third of the starts on a busy 2-core
machine. The config reaches every process of the node through the GCS, which serves it to the raylet, the workers
and the driver: checked on the GCS's own command line (what Ray passes it), in a process of its own (its own Ray)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

from labkube.operator.driver import HEAD_SYSTEM_CONFIG

PROBE = textwrap.dedent(
    """
    import json, ray
    from labkube.operator.driver import connect, shutdown
    ctx = connect(None, 1)
    try:
        gcs = ray._private.worker._global_node.all_processes["gcs_server"][0].process.pid
        with open(f"/proc/{gcs}/cmdline", "rb") as fh:
            print(json.dumps([arg.decode() for arg in fh.read().split(b"\\0") if arg]))
        print(ray.get(ray.remote(lambda: "the node runs tasks").remote()))
    finally:
        shutdown(ctx)
    """
)


def test_the_local_head_asks_for_its_sockets_every_20_ms_for_as_long_as_before() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_AUTH_MODE": "disabled"}
    probe = subprocess.run([sys.executable, "-P", "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    command_line, answer = probe.stdout.strip().splitlines()[-2:]
    (config_arg,) = [a for a in json.loads(command_line) if a.startswith("--config_list=")]
    config = json.loads(base64.b64decode(config_arg.removeprefix("--config_list=")))
    assert config["raylet_client_connect_timeout_milliseconds"] == 20
    # the patience in all stays Ray's default (10 attempts 1 s apart)
    assert config["raylet_client_num_connect_attempts"] * 20 >= 10 * 1000
    assert {k: config[k] for k in HEAD_SYSTEM_CONFIG} == HEAD_SYSTEM_CONFIG
    assert answer == "the node runs tasks"
