"""The one error a Gaia2 world raises into the agent loop (kept apart so the loop needs no world code)."""


class WorldFailure(Exception):
    """The world process died or failed; the run ends with reason `world_error`."""
