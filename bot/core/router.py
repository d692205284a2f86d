"""Routers: which handler applies each kind of input, and the two errors a handler raises when it
cannot apply one now (Deferred) or ever (RejectedInput).

As in bedevere and probot, each concern registers its handlers on its own router
(`@router.on(kind)`), and the app joins them in one visible place (`Router(first, second)`):
bot.loop.inbox has the loop's own inputs (steer, pause, resume), bot.github.handlers the GitHub
events, and bot.app.serve joins the two for the service. bot.loop.inbox applies each inbox entry
through the router it is given. A kind has one handler, so a join of two routers that both handle a
kind is refused; nothing is registered by importing a module.

What a handler takes is agreed between a router's owner and its users: an inbox handler takes the
store and the entry, and GitHub's event router inside bot.github.handlers hands its actions one
event. Every handler returns its outcome, in words for the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

Handler = TypeVar("Handler", bound=Callable[..., str])


class RejectedInput(ValueError):
    """An input that cannot be applied; the message says why."""


class Deferred(Exception):
    """An input that cannot be applied yet: left pending for the next tick; the message says why."""


class Router(Generic[Handler]):
    """Kind -> its one handler. `Router(a, b)` holds the handlers of both."""

    def __init__(self, *routers: Router[Handler]) -> None:
        self._handlers: dict[str, Handler] = {}
        for router in routers:
            for kind, handler in router._handlers.items():
                self._add(kind, handler)

    def on(self, kind: str) -> Callable[[Handler], Handler]:
        """Register the handler of `kind` (a decorator)."""

        def register(handler: Handler) -> Handler:
            self._add(kind, handler)
            return handler

        return register

    def handler(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def _add(self, kind: str, handler: Handler) -> None:
        if kind in self._handlers:
            raise ValueError(f"two handlers for {kind!r}: a kind has one")
        self._handlers[kind] = handler
