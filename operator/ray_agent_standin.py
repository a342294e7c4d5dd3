"""What the raylet of a head labkube starts runs in place of Ray's dashboard agent and runtime-env agent
(`operator/lean_head.py`). Standard library only: it runs as `python -I -S THIS_FILE ROLE --session-dir=...
--node-id=... [Ray's other agent options]`, about 20 ms, where Ray's agents import Ray, grpc and aiohttp (a second
or more of CPU each, which the raylet waits for before it registers its node).

The raylet needs each agent's ports before it registers, and fate-shares with the agents' processes. So a stand-in
publishes its ports the way Ray's agents do (a file per port in the session directory, written then renamed), then
lives exactly as long as the raylet:

- `dashboard`: -1 for the metrics agent, metrics export and HTTP ports, what Ray's own agent publishes when it runs
  without those services (its minimal mode): the raylet, the GCS and the workers then export no metrics.
- `runtime_env`: a port that listens and closes whatever connects. The raylet asks the runtime-env agent only for a
  task or actor with a runtime environment, which nothing of labkube gives; one that did would fail to start.
"""

from __future__ import annotations

import os
import select
import socket
import sys

DASHBOARD_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
RUNTIME_ENV_PORT = "runtime_env_agent_port"


def options(argv: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)


def publish(session_dir: str, node_id: str, name: str, port: int) -> None:
    path = os.path.join(session_dir, f"{name}_{node_id}")
    with open(f"{path}.standin", "w", encoding="ascii") as fh:
        fh.write(str(port))
    os.replace(f"{path}.standin", path)


def main(argv: list[str]) -> None:
    role, given = argv[0], options(argv[1:])
    session_dir, node_id = given["session-dir"], given["node-id"]
    raylet = os.pidfd_open(int(os.environ.get("RAY_RAYLET_PID") or os.getppid()))
    listener: socket.socket | None = None
    if role == "dashboard":
        for name in DASHBOARD_PORTS:
            publish(session_dir, node_id, name, -1)
    elif role == "runtime_env":
        listener = socket.create_server((given.get("node-ip-address", "127.0.0.1"), 0))
        publish(session_dir, node_id, RUNTIME_ENV_PORT, listener.getsockname()[1])
    else:
        raise SystemExit(f"unknown role {role!r}")
    watched = [raylet, *([listener] if listener is not None else [])]
    while True:
        ready, _, _ = select.select(watched, [], [])
        if raylet in ready:
            return
        if listener is not None:
            connection, _ = listener.accept()
            connection.close()


if __name__ == "__main__":
    main(sys.argv[1:])
