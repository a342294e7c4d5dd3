"""What the campaign driver (`driver`) reports, importable without Ray: `labkube run` starts a campaign's worlds
and agent zygote before it imports Ray (about half a second of CPU), so what it names before then must not."""

from __future__ import annotations

__all__ = ["HELD", "DriverError"]

HELD = "not started: "  # the start of the error of a run held back by the GPU-hour cap


class DriverError(RuntimeError):
    pass
