"""What every replica of `labkube operator` serves for its whole life, leading or not: `/healthz` on the health
port (the chart's startup, liveness and readiness probes) and `labkube_operator_leader` (1 while it holds the
leader lease, else 0) on `/metrics`, beside the campaign series of the campaigns it drives.

Both answer from process start: while the replica stands by for the lease, while it connects to Ray (up to
`RAY_CONNECT_PATIENCE_S`), while it leads, and while it is fenced waiting for the API to come back. A replica
that stopped answering is a replica that is stuck or gone, which is what the probes and `LabkubeOperatorDown`
are for; a replica that is merely not leading is healthy. One that refuses to lead (`ReplicaState.refuse`: the
installed CRDs are older than the operator) answers 503 with the reason, so it is not Ready; so does one that waits
at start for the API, Ray or the node list (it says which), and one that has had no answer from the API server for
`api_window_s` (two lease durations in `labkube operator`): a replica whose API calls hang is not healthy, though it
stays up and fenced (see `k8s_operator`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LEADING", "ReplicaState", "heartbeat", "leader_family", "serve_health"]


LEADING = "leading"
STALL_S = 60.0


class ReplicaState:
    """What this replica is doing (the text `/healthz` answers) and whether it leads (thread-safe: the health
    server, the lease thread and kopf's loop all touch it). While it leads, kopf's event loop `beat`s; a loop that
    has not beaten for `stall_s` makes `/healthz` answer 503, so the liveness probe restarts a hung leader (what
    kopf's own liveness endpoint did)."""

    def __init__(
        self,
        stall_s: float = STALL_S,
        api_window_s: float | None = None,
        answered_at: Callable[[], float] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._doing = "starting"
        self._leader = False
        self._beat = time.monotonic()
        self._refusing = False
        self.stall_s = stall_s
        self.api_window_s = api_window_s  # None: /healthz does not watch the API round trips
        self._answered_at = answered_at or (lambda: -float("inf"))
        self._born = time.monotonic()

    def now(self, doing: str, *, leader: bool) -> None:
        with self._lock:
            self._doing, self._leader, self._beat = doing, leader, time.monotonic()
            self._refusing = False

    def refuse(self, why: str) -> None:
        """This replica will not lead (`why`: one line naming the fix, e.g. CRDs older than the operator): `/healthz`
        answers 503 with it, so the replica is not Ready and a rolling upgrade stops at it, the old replicas
        leading on, until `now` says otherwise."""
        with self._lock:
            self._doing, self._leader, self._refusing = why, False, True

    @property
    def refusing(self) -> bool:
        with self._lock:
            return self._refusing

    def beat(self) -> None:
        with self._lock:
            self._beat = time.monotonic()

    def stalled(self) -> float | None:
        """Seconds since kopf's loop last beat, when it leads and that is more than `stall_s`; else None."""
        with self._lock:
            quiet = time.monotonic() - self._beat
            return quiet if self._doing == LEADING and quiet > self.stall_s else None

    def api_silent(self) -> float | None:
        """Seconds since this process last had an answer from the API server (`kube.last_answer`; from its start
        when none came yet), when that is more than `api_window_s`; else None. A call the server never answers is
        silence too (every call is bounded), so a replica whose API hangs fails `/healthz`."""
        if self.api_window_s is None:
            return None
        quiet = time.monotonic() - max(self._answered_at(), self._born)
        return quiet if quiet > self.api_window_s else None

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
            stalled = state.stalled() if found else None
            silent = state.api_silent() if found else None
            code = 404 if not found else 503 if stalled is not None or silent is not None or state.refusing else 200
            text = (
                "not found: try /healthz"
                if not found
                else f"leading, but kopf's event loop has not answered for {stalled:.0f}s"
                if stalled is not None
                else f"no answer from the Kubernetes API for {silent:.0f}s ({state.doing})"
                if silent is not None
                else state.doing
            )
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            self.wfile.write(text.encode() + b"\n")

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


def heartbeat(state: ReplicaState, every_s: float = 5.0) -> None:
    """Beat from the running event loop (kopf's) every `every_s` for as long as it runs. A chain of timer callbacks,
    not a task: kopf waits for its loop's tasks when it stops, and a task that never ends would delay every stop
    (and so the lease hand-over on SIGTERM) by its 5 s grace."""
    import asyncio

    loop = asyncio.get_running_loop()

    def beat() -> None:
        state.beat()
        if not loop.is_closed():
            loop.call_later(every_s, beat)

    beat()
