"""Forges: `local.LocalForge` over a git repository on disk (the local loop's), `memory.MemoryForge`
in memory (for what drives the conductor thousands of times: bench/schedule_sim.py), and the
three-way merge of one file that every forge uses (`merge`). The interface they implement, and its
errors, are bot.core.protocols.Forge; the GitHub forge is bot.github.forge."""
