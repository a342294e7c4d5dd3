"""What a scripted run's agent imports: the agent zygote preloads the entrypoint for every run it forks, and a
scripted run never starts the vendor CLIs' scaffold, so neither the model gateway nor aiohttp's server is among
its imports (0.3 s of the zygote's start, at every campaign)."""

from __future__ import annotations

import subprocess
import sys


def test_the_agents_entrypoint_does_not_import_the_gateway_or_aiohttp() -> None:
    probe = (
        "import sys, labkube.agent.harness.entrypoint; "
        "print(sorted(m for m in ('aiohttp', 'labkube.agent.gateway', 'labkube.agent.scaffolds.cli_agents') "
        "if m in sys.modules))"
    )
    ran = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "[]"
