"""autoresearch-bot: the research loop as pull requests (conductor, store, forge, agent, runners)."""
