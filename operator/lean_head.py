"""A Ray head started on this machine for labkube alone (`labkube run`, the operator's embedded Ray), without what
labkube never uses and a short campaign would wait for.

labkube uses neither Ray's dashboard, nor its state API, nor job submission, nor runtime environments, nor Ray's
metrics (docs/kubernetes.md, "Why ray[default]"). Ray 2.60's `ray.init` still starts, and waits for:

- the autoscaler monitor and the log monitor (160 MiB together): a node started here never scales, and with
  `log_to_driver=False` nothing reads what the log monitor publishes. `ray start` has flags for them
  (`--no-monitor`, `--include-log-monitor=false`); `ray.init` has none, so its node parameters get them here.
- the dashboard's API server (`include_dashboard=False` still starts it, with only its usage-stats module;
  `ray.init` waits for it to publish its address: about 1.7 s of a 4-6 s start on a 2-core machine, and 150 MiB).
- the dashboard agent and the runtime-env agent, which the raylet starts and waits for before it registers its
  node: each imports Ray, grpc and aiohttp (over a second of CPU each on a 2-core machine, while the campaign's
  worlds import ARE). The raylet runs `operator/ray_agent_standin.py` in their place, which publishes the ports the
  raylet waits for at once and lives as long as the raylet.

And `ray.init` asks the GCS for the new node once a second (a raylet that registers just after an ask costs up to a
second) and imports the dashboard's packages (about 0.2 s) to decide how to start the agent it no longer starts.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STANDIN = Path(__file__).with_name("ray_agent_standin.py")
# The Ray whose private start-up (its node parameters, its raylet's agent commands, the ports its agents publish,
# its node poll) this module changes, as tested; another Ray starts its head as it does by itself.
LEAN_RAY = "2.60."
AGENT_COMMANDS = {"--dashboard_agent_command=": "dashboard", "--runtime_env_agent_command=": "runtime_env"}
NODE_POLL_S = 0.02
NODE_WAIT_S = 30.0  # Ray's own wait for a raylet to register


def standin_agents(raylet_command: list[str]) -> list[str]:
    """The raylet's command line with the stand-in in place of each agent's command (Ray's own options kept: the
    stand-in reads the session directory, node id and address from them)."""
    command = []
    for arg in raylet_command:
        for flag, role in AGENT_COMMANDS.items():
            if arg.startswith(flag):
                options = [part for part in shlex.split(arg[len(flag) :]) if part.startswith("--")]
                standin = [sys.executable, "-I", "-S", str(STANDIN), role, *options]
                arg = flag + subprocess.list2cmdline(standin)
        command.append(arg)
    return command


def wait_for_node(gcs_address: str, node_id: str) -> None:
    """Until the GCS lists the node as alive, asked every 20 ms (Ray asks once a second); then Ray's own ask finds it
    at once. A node still missing after Ray's own wait, or a GCS that does not answer, is left to Ray's ask to
    report."""
    from ray._raylet import GcsClient, NodeID
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    from ray.core.generated.gcs_service_pb2 import GetAllNodeInfoRequest

    client = GcsClient(address=gcs_address)
    selector = [GetAllNodeInfoRequest.NodeSelector(node_id=NodeID.from_hex(node_id).binary())]
    deadline = time.monotonic() + NODE_WAIT_S
    while time.monotonic() < deadline:
        try:
            alive = client.get_all_node_info(
                timeout=NODE_WAIT_S, node_selectors=selector, state_filter=GcsNodeInfo.GcsNodeState.ALIVE
            )
        except Exception:  # whatever it is, Ray's own ask meets it and says so
            return
        if alive:
            return
        time.sleep(NODE_POLL_S)


def lean_ray(version: str) -> bool:
    """Whether `version` of Ray is the one this module was written and tested for (LEAN_RAY)."""
    return version.startswith(LEAN_RAY)


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """Inside, `ray.init` starts a head node as the module's docstring says, on the Ray it was tested for; on
    another, as Ray itself does (a slower start, but nothing assumed of Ray's private start-up that may have
    changed)."""
    import ray

    if not lean_ray(ray.__version__):
        yield
        return
    import ray._private.node as node
    import ray._private.parameter as parameter
    import ray._private.services as services
    import ray._private.utils as utils
    from ray._private import ray_constants

    base = parameter.RayParams
    start_api_server = node.Node.start_api_server
    start_ray_process = services.start_ray_process
    get_node = services.get_node
    dashboard_dependency_error = utils.get_dashboard_dependency_error

    class HeadParams(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.no_monitor = True
            self.include_log_monitor = False

    def no_api_server(self: Any, **_: Any) -> None:
        self._webui_url = None

    def start_with_standins(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = standin_agents(command)
        return start_ray_process(command, process_type, *args, **kwargs)

    def node_once_registered(gcs_address: str, node_id: str) -> Any:
        wait_for_node(gcs_address, node_id)
        return get_node(gcs_address, node_id)

    parameter.RayParams = HeadParams  # type: ignore[misc]
    node.Node.start_api_server = no_api_server  # type: ignore[method-assign]
    services.start_ray_process = start_with_standins
    services.get_node = node_once_registered
    utils.get_dashboard_dependency_error = lambda: None  # the agent it decides for is not started
    try:
        yield
    finally:
        parameter.RayParams = base  # type: ignore[misc]
        node.Node.start_api_server = start_api_server  # type: ignore[method-assign]
        services.start_ray_process = start_ray_process
        services.get_node = get_node
        utils.get_dashboard_dependency_error = dashboard_dependency_error
