"""Forges over a git repository on disk: `local.LocalForge` (the local loop's) and the three-way
merge of one file that every forge uses (`merge`). The interface they implement, and its errors,
are bot.core.protocols.Forge; the GitHub forge is bot.github.forge."""
