"""A threaded HTTP server on the loopback for the tests' fake services (`fakellm`, `fakehub`): it knows its open
connections, so stopping it does not wait on a client's idle keep-alive connection, and a client that hung up is
not logged as an error."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LocalHTTPServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads
    block_on_close = True

    def __init__(self, owner: Any, handler: type[BaseHTTPRequestHandler]) -> None:
        self.owner = owner  # what the handler serves (`self.server.owner`)
        self.open_sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up is not an error
            super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        """Unblock handler threads waiting on idle keep-alive connections."""
        with self.lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
