"""Agents: whatever turns a `ProposalContext` into the next experiment's `Proposal`
(the interface is bot.core.protocols.Agent; every failure an agent raises is an `AgentError`,
`AgentStopped` when it can propose nothing more).

Three kinds: `claude.ClaudeAgent` (an LLM with editor tools, when an API key is configured),
`explorer.OfflineExplorer` (a deterministic bandit search over the tunable constants of the task's
asset, or query.sql's indexes, that needs no network) and `scripted.ScriptedAgent` (a fixed list,
for demos and tests). `choice.make_agent` picks one from the settings.
"""
