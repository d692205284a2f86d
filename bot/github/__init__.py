"""The GitHub side of the bot: the connection (auth, retries, pacing), the forge over the Git Data
and Pulls APIs, check runs, the webhook payloads and the inbox handlers that act on them."""
