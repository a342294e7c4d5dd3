"""The agent side of a run: what acts in the sandbox and how its model calls are metered.

Three parts share this folder until #27 item 3 gives each its own: rg-agent (the loop, its tools, LLM providers,
prompts, budgets, context hand-offs, transcript and checkpoint), the scaffolds that run third-party agents (Claude
Code, Codex, ARE's default agent: `cli_*`, `are_default`, `mcp_bridge`) and the metering gateway every scaffold
and the pods' sidecar send model calls through (`gateway`, `usage`, `pricing`). `entrypoint` is `labkube agent`,
what a sandbox runs.
"""
