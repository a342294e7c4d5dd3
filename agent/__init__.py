"""The agent side of a run: what acts in the sandbox and how its model calls are metered.

Its parts are sub-packages: `rg` (rg-agent, labkube's own agent: its loop, tools and Gaia2 world session),
`providers` (the LLM clients and the registry that picks one and its key), `scaffolds` (Claude Code, Codex and ARE's
default agent, run as they are), `gateway` (the metering proxy every scaffold and the pods' sidecar send model calls
through) and `harness` (`labkube agent`: a whole run in its sandbox, the audit included, a room above this one).
What several parts share stays here: the messages, the prompts, usage reading and pricing (`usage`, `pricing`,
`prices.yaml`), budgets, transcript, checkpoint, background jobs, telemetry, process containment and the blocked
URLs.
"""
