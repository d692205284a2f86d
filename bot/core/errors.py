"""ConfigError: a setting a person must fix. Raised wherever it is found wrong: by the service's
settings as they are read (bot.app.settings), or by the GitHub client when GitHub refuses them
(bot.github.client). The message names each setting to fix by its environment variable and says
what to do."""


class ConfigError(ValueError):
    """The service's settings are missing or invalid; the message names each setting to fix, one per line."""
