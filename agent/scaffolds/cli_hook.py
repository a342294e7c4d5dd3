"""Claude Code's PreToolUse hook for a labkube run: the task's blocked URLs, checked with rg-agent's own rules.

Claude Code runs `python -m labkube.agent.scaffolds.cli_hook BLOCKED_FILE` before each Bash, WebFetch and WebSearch
call, with the call as JSON on stdin (`tool_name`, `tool_input`). Exit 2 refuses the call and Claude Code shows the
model what this prints on stderr; exit 0 lets it through. BLOCKED_FILE holds the patterns, one per line.

Inside the run's sandbox labkube's package is hidden, so there this file runs by path (`python -s -E cli_hook.py`),
a copy beside a copy of `blocked_urls.py` (standard library only), which it then imports from its own folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

try:
    from labkube.agent.blocked_urls import blocked_in_command, is_blocked
except ModuleNotFoundError:  # run by path in the sandbox: blocked_urls.py lies beside it, on sys.path[0]
    from blocked_urls import blocked_in_command, is_blocked  # type: ignore[import-not-found,no-redef]


def verdict(call: dict, blocked: list[str]) -> str | None:
    """Why the call must not run, or None."""
    tool, args = call.get("tool_name"), call.get("tool_input") or {}
    if tool == "Bash":
        hit = blocked_in_command(str(args.get("command", "")), blocked)
        if hit:
            return f"{hit[0]} is blocked for this task (matches {hit[1]})"
    elif tool == "WebFetch":
        pattern = is_blocked(str(args.get("url", "")), blocked)
        if pattern:
            return f"{args.get('url')} is blocked for this task (matches {pattern})"
    elif tool == "WebSearch":
        for domain in args.get("allowed_domains") or []:
            if is_blocked(str(domain), blocked):
                return f"searching {domain} is blocked for this task"
    return None


def main(argv: list[str]) -> int:
    blocked = [line.strip() for line in Path(argv[1]).read_text().splitlines() if line.strip()]
    try:
        call = json.loads(sys.stdin.read() or "{}")
    except ValueError:
        return 0
    why = verdict(call, blocked)
    if why is None:
        return 0
    print(f"labkube: {why}; the task's blocked URLs (its paper, code and authors) are off limits.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
