"""ConfigError: a setting a person must fix. Raised wherever it is found wrong: by the service's
settings as they are read (bot.app.settings), or by the GitHub client when GitHub refuses them
(bot.github.client). The message names each setting to fix by its environment variable and says
what to do.

PublishingStopped: a publisher gave up part way because the service is stopping (bot.github.budget's
wait for room under GitHub's write limits); nothing failed, and what it did not show is shown after
the next start."""


class ConfigError(ValueError):
    """The service's settings are missing or invalid; the message names each setting to fix, one per line."""


class PublishingStopped(Exception):
    """A publisher stopped part way because the service is stopping: not a failure."""
