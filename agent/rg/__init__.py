"""rg-agent, labkube's own agent: the loop that asks a model for the next step and runs the tool calls it makes
(`loop`), the tools themselves (shell, files, `apply_patch`, background jobs, web search and fetch, `tool`/`tools`),
the workspace they act in, and its Gaia2 world session (`world_session`: the world's apps as tools and its
notifications as turns). The providers it calls are in `labkube.agent.providers`; the prompts, budgets, transcript
and checkpoint it shares with the scaffolds are in `labkube.agent` itself.
"""
