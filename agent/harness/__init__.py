"""The run in its sandbox, start to end: `labkube agent` (`entrypoint`, called through `sandbox_process` by the
command and by the agent zygote's forked children) prepares the workspace from the task, runs rg-agent or a
scaffold, grades, and ends with the integrity audit, then writes the result; `gpu` records the GPU use. It stands
above both `labkube.agent` and `labkube.integrity` (the audit's LLM inspector is built from the agent's providers
and tools), which docs/architecture.md's rules call the `harness` room.
"""
