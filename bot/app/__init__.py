"""Entry points and wiring: the CLI (`cli`), the local demo (`demo`), the service (`serve`: the one
place where routers, runners, agents and the GitHub parts are joined), the webhook server (`web`)
and the service's settings from the environment (`settings`)."""
