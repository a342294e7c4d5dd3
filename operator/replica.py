"""What every replica of `labkube operator` serves for its whole life, leading or not: `/healthz` on the health
port (the chart's startup, liveness and readiness probes) and `labkube_operator_leader` (1 while it holds the
leader lease, else 0) on `/metrics`, beside the campaign series of the campaigns it drives.

Both answer from process start: while the replica stands by for the lease, while it connects to Ray (up to
`RAY_CONNECT_PATIENCE_S`), while it leads, and while it is fenced waiting for the API to come back. A replica
that stopped answering is a replica that is stuck or gone, which is what the probes and `LabkubeOperatorDown`
are for; a replica that is merely not leading is healthy.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["ReplicaState", "leader_family", "serve_health"]


class ReplicaState:
    """What this replica is doing (the text `/healthz` answers) and whether it leads (thread-safe: the health
    server, the lease thread and kopf's loop all touch it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._doing = "starting"
        self._leader = False

    def now(self, doing: str, *, leader: bool) -> None:
        with self._lock:
            self._doing, self._leader = doing, leader

    @property
    def doing(self) -> str:
        with self._lock:
            return self._doing

    @property
    def leader(self) -> bool:
        with self._lock:
            return self._leader


def leader_family(state: ReplicaState) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    from labkube.metrics import OPERATOR_METRICS

    name = "labkube_operator_leader"
    family = GaugeMetricFamily(name, OPERATOR_METRICS[name][1])
    family.add_metric([], 1.0 if state.leader else 0.0)
    return family


@contextlib.contextmanager
def serve_health(port: int, state: ReplicaState) -> Iterator[None]:
    """`/healthz` answers 200 and what the replica is doing, until the block ends."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path.split("?", 1)[0] == "/healthz"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            self.wfile.write((state.doing if found else "not found: try /healthz").encode() + b"\n")

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Health)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="labkube-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
