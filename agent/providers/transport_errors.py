"""Network-layer failures that an SDK lets through unwrapped (a stream cut mid-way, say).

The SDKs speak through `httpx2` (current releases) or `httpx` (older ones); either
library's `TransportError` means the connection failed, which is worth a retry.
"""

from __future__ import annotations

import importlib


def _transport_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            types.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(types)


TRANSPORT_ERRORS = _transport_error_types()


def _read_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
            types += [module.ReadError, module.ReadTimeout, module.RemoteProtocolError]
        except (ImportError, AttributeError):
            continue
    return tuple(types)


# The request was sent and the answer broke off, or did not come in time: the provider may have generated it.
READ_ERRORS = _read_error_types()


def is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, TRANSPORT_ERRORS)


def answer_may_have_begun(exc: BaseException) -> bool:
    """`exc` (a transport error, or an SDK's error raised from one) broke the call after its request reached the
    provider: the answer was cut or late, and what the provider generated, and may bill, was never said. A refused
    or unsent connection (connect, write and pool errors) cost nothing."""
    return isinstance(exc, READ_ERRORS) or isinstance(exc.__cause__, READ_ERRORS)
