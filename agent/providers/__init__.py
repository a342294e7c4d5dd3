"""The LLM providers: one `ModelClient` interface (`provider`) over OpenAI-style and Anthropic APIs and the scripted
test model, the SDK and transport errors mapped to one `ProviderError`, and `registry`, which turns a run's model
reference into a client and finds its API key. rg-agent calls models through them; the scaffolds, ARE's default
agent, the gateway's sidecar and the integrity inspector use the registry's key lookup and errors, so they stand
beside rg-agent rather than inside it.
"""
