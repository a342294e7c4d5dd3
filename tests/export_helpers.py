"""Campaigns for the export tests, run with the real CLI, and readers for what `labkube export` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_helpers import BUNDLED_TASK, labkube

CHEAT = "cheat:hardcode"


def paper_campaign(work: Path) -> Path:
    """The bundled paper task with the oracle and a scripted cheat, graded after every step."""
    out = work / "paper"
    args = ("run", BUNDLED_TASK, "--model", "oracle", "--model", CHEAT, "--grade-interval", "0.01", "--out", str(out))
    proc = labkube(*args, cwd=work, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out


def gaia2_campaign(work: Path, scenario: str = "gaia2/execution_budget_email") -> Path:
    out = work / "gaia2"
    proc = labkube("run", scenario, "--model", "oracle", "--out", str(out), cwd=work, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return out


def export(*args: str, cwd: Path) -> Any:
    proc = labkube("export", *args, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def trajectories(out: Path) -> dict[str, dict[str, Any]]:
    """The exported ATIF files by run id."""
    return {p.name.split("--", 1)[1].removesuffix(".atif.json"): json.loads(p.read_text()) for p in out.glob("*.json")}


def rewards(step: dict[str, Any], kind: str) -> list[Any]:
    return [r["value"] for r in (step.get("extra") or {}).get("rewards", []) if r["kind"] == kind]


WHITFIELD, WELLS, MARCO = (
    "dana.whitfield@northwind.example",
    "dana.wells@mailbox.example",
    "marco.bianchi@northwind.example",
)


def replay_model(path: Path, recipient: str) -> str:
    """A replayed agent for gaia2/execution_budget_email that emails `recipient` and tells the user."""
    send = {
        "recipients": [recipient],
        "cc": [MARCO],
        "subject": "Q3 budget final",
        "content": "The Q3 budget is final.",
    }
    calls = [
        ("EmailClientV2__send_email", send),
        ("AgentUserInterface__send_message_to_user", {"content": "Sent."}),
    ]
    lines = [
        json.dumps({"type": "model_call", "message": {"tool_calls": [{"name": n, "arguments": a}]}}) for n, a in calls
    ]
    path.write_text("\n".join(lines) + "\n")
    return f"replay:{path}"
