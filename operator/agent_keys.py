"""How a run's agent gets its API keys (and its world's control token): on stdin, never in its environment, where
its commands could read them.

The local sandbox splits the keys out of the environment it gives a `labkube agent` process, and the warm agent
zygote out of its own (it holds no key; each forked child gets its run's keys on stdin).
"""

from __future__ import annotations

import json
from pathlib import Path

from labkube.tasks.gaia2.world_client import CONTROL_TOKEN_VARIABLE

__all__ = ["secret_names", "split_secrets"]


def secret_names(run_dir: Path) -> set[str]:
    """The environment variables holding API keys: `*_API_KEY` and the run's own `api_key_env` names."""
    try:
        custom = json.loads((run_dir / "run.json").read_text()).get("api_key_env", {})
    except (OSError, ValueError):
        custom = {}
    return {name for name in custom.values() if isinstance(name, str)}


def split_secrets(env: dict[str, str], extra: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The agent gets its keys on stdin, not in its environment, where its commands could read them: the API keys,
    the run's own `extra` names, and the control token of the world lent to the run."""
    secret = {k: v for k, v in env.items() if k.endswith("_API_KEY") or k in extra or k == CONTROL_TOKEN_VARIABLE}
    return {k: v for k, v in env.items() if k not in secret}, secret
