"""The Ray head `labkube run` starts on this machine (operator/driver.py, HEAD_SYSTEM_CONFIG) asks for its node's
sockets every 20 ms, not every second (with Ray's default, the raylet's object manager that connected to its object
store before the store listened waited a whole second, in about a third of the starts on a busy 2-core machine), and
answers its driver without waiting for the worker it prestarts to boot. The config reaches every process of the
node through the GCS, which serves it to the raylet, the workers and the driver: checked on the GCS's own command
line (what Ray passes it), in a process of its own (its own Ray); the prestarted worker still hosts the first
actor (no second worker is started for it). And no process of the node records Ray's task events (what Ray's
dashboard and state API read, and labkube does not): with them, the driver's `ray.shutdown` waited 0.25 s for its
last flush of them, 8% of a 20-run Gaia2 oracle campaign on this machine; each process's core worker says in its log
that it keeps none. The worker that hosts the supervisors is not reniced to 15 (Ray's default for its workers): a
run's supervisor is the campaign's control plane (deadlines, checkpoints, the next run's start), which agents and
their commands at the usual priority would otherwise starve on a busy machine."""

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
    import json, os, ray
    from labkube.operator.driver import connect, shutdown

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self):
            return os.getpid()

    ctx = connect(None, 1)
    shutdown(ctx)
    ctx = connect(None, 1)  # a second head in the same process: Ray adds to the config it is given
    try:
        node = ray._private.worker._global_node
        gcs, raylet = (node.all_processes[kind][0].process.pid for kind in ("gcs_server", "raylet"))
        with open(f"/proc/{gcs}/cmdline", "rb") as fh:
            print(json.dumps([arg.decode() for arg in fh.read().split(b"\\0") if arg]))
        actor = ray.get(Probe.remote().pid.remote())
        with open(f"/proc/{raylet}/task/{raylet}/children") as fh:
            children = [int(pid) for pid in fh.read().split()]
        workers = []
        for pid in children:  # the raylet's children: its workers, and the stand-ins for its agents
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"ray_agent_standin" not in fh.read():
                    workers.append(pid)
        logs = node.get_logs_dir_path()
        with open(os.path.join(logs, "raylet.out")) as fh:
            started = fh.read().count("Started worker process")
        no_task_events = []  # the core workers (driver and actor) that say they keep no task events
        for name in sorted(os.listdir(logs)):
            if name.startswith(("python-core-driver-", "python-core-worker-")):
                with open(os.path.join(logs, name)) as fh:
                    if "Task Event Buffer is disabled" in fh.read():
                        no_task_events.append(name.split("-")[2])
        with open(f"/proc/{actor}/stat") as fh:
            nice = int(fh.read().rsplit(")", 1)[1].split()[16])
        print(json.dumps({"actor": actor, "workers": workers, "started": started, "no_task_events": no_task_events,
                          "nice": nice, "own_nice": os.nice(0)}))
    finally:
        shutdown(ctx)
    """
)


def test_the_local_head_asks_for_its_sockets_every_20_ms_answers_its_driver_at_once_and_keeps_no_task_events() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_AUTH_MODE": "disabled"}
    probe = subprocess.run([sys.executable, "-P", "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    command_line, placed = probe.stdout.strip().splitlines()[-2:]
    arguments = json.loads(command_line)
    (config_arg,) = [a for a in arguments if a.startswith("--config_list=")]
    config = json.loads(base64.b64decode(config_arg.removeprefix("--config_list=")))
    (session,) = [a.removeprefix("--session-dir=") for a in arguments if a.startswith("--session-dir=")]
    # the second head's own spilling directory, not the first's (each head gets a fresh copy of the config)
    assert json.loads(config["object_spilling_config"])["params"]["directory_path"] == session
    assert config["raylet_client_connect_timeout_milliseconds"] == 20
    # the patience in all stays Ray's default (10 attempts 1 s apart)
    assert config["raylet_client_num_connect_attempts"] * 20 >= 10 * 1000
    assert config["prestart_worker_first_driver"] is False
    assert {k: config[k] for k in HEAD_SYSTEM_CONFIG} == dict(HEAD_SYSTEM_CONFIG)
    assert config["task_events_report_interval_ms"] == 0
    where = json.loads(placed)
    assert where["workers"] == [where["actor"]] and where["started"] == 1, where  # the prestarted one hosts it
    # Ray's own reading of the config: neither the driver's core worker nor the actor's records task events
    assert where["no_task_events"] == ["driver", "worker"], where
    # the supervisors' worker runs at the driver's priority, not Ray's nice 15 for workers (under the agents)
    assert config["worker_niceness"] == 0 and where["nice"] == where["own_nice"], where
