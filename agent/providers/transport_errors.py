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


def is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, TRANSPORT_ERRORS)
