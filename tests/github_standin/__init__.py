"""A GitHub stand-in for end-to-end tests: one repository with real git storage, the REST API the
bot uses (checked against GitHub's OpenAPI description), git smart HTTP, signed webhooks, App
authentication, rate limits and injected faults. See server.py for the public surface."""

from .server import GitHubStandIn

__all__ = ["GitHubStandIn"]
