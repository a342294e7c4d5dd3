"""The scaffolds that run third-party agents in a run's sandbox: Claude Code and Codex (`cli_agents`, their install
in `cli_install`, their event streams read into labkube's transcript in `cli_events`, the Claude Code hook that
blocks the task's forbidden URLs in `cli_hook`), Meta ARE's default agent for Gaia2 (`are_default`), and the MCP
bridge that lends a CLI agent rg-agent's Gaia2 world tools (`mcp_bridge`). Their model calls go through the
metering gateway (`labkube.agent.gateway`).
"""
