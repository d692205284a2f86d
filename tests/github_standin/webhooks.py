"""Webhook delivery as GitHub's Hookshot does it: one POST per event to the configured URL, from a
background thread, in the order the events happened, signed with HMAC-SHA256 of the raw body
(X-Hub-Signature-256), with a fresh X-GitHub-Delivery GUID that a redelivery reuses.

Every attempt is logged in `deliveries` (event, action, GUID, status answered, latency).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

USER_AGENT = "GitHub-Hookshot/standin"
HOOK_ID = 424242


@dataclass
class Delivery:
    event: str
    action: str | None
    delivery_id: str
    body: bytes
    status: int | None = None  # what the receiver answered; None until sent (or when unreachable)
    latency: float | None = None
    error: str | None = None
    redelivery: bool = False
    sent: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Hookshot:
    def __init__(self, check: Callable[[str, dict[str, Any]], None], target: tuple[str, int | None]):
        """`check` sees every body before it leaves (the OpenAPI referee); `target` names the
        installation target for the X-GitHub-Hook-Installation-Target headers."""
        self.check, self.target = check, target
        self.url: str | None = None
        self.secret = ""
        self.events: set[str] | None = None
        self.deliveries: list[Delivery] = []
        self._queue: queue.Queue[Delivery | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="standin-hookshot", daemon=True)
        self._thread.start()

    def configure(self, url: str, secret: str, events: set[str] | None) -> None:
        self.url, self.secret, self.events = url, secret, events

    def emit(self, event: str, body: dict[str, Any]) -> None:
        """Called by the state, under its lock, in the order things happen."""
        self.check(event, body)
        if self.url is None or (self.events is not None and event not in self.events):
            return
        raw = json.dumps(body, separators=(",", ":")).encode()
        self._enqueue(Delivery(event, body.get("action"), str(uuid.uuid4()), raw))

    def redeliver(self, delivery_id: str) -> Delivery:
        original = next((d for d in self.deliveries if d.delivery_id == delivery_id), None)
        if original is None:
            raise KeyError(f"no delivery {delivery_id}")
        copy = Delivery(original.event, original.action, delivery_id, original.body, redelivery=True)
        self._enqueue(copy)
        return copy

    def _enqueue(self, delivery: Delivery) -> None:
        with self._idle:
            self._pending += 1
            self.deliveries.append(delivery)
        self._queue.put(delivery)

    def wait(self, timeout: float = 10.0) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: self._pending == 0, timeout):
                raise TimeoutError(f"{self._pending} webhook deliveries still pending after {timeout}s")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(timeout=10.0, transport=nodelay) as client:
            while (delivery := self._queue.get()) is not None:
                self._send(client, delivery)
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _send(self, client: httpx.Client, d: Delivery) -> None:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-GitHub-Event": d.event,
            "X-GitHub-Delivery": d.delivery_id,
            "X-GitHub-Hook-ID": str(HOOK_ID),
            "X-GitHub-Hook-Installation-Target-Type": self.target[0],
            "X-GitHub-Hook-Installation-Target-ID": str(self.target[1]),
            "X-Hub-Signature-256": signature(self.secret, d.body),
            "X-Hub-Signature": "sha1=" + hmac.new(self.secret.encode(), d.body, hashlib.sha1).hexdigest(),
        }
        started = time.monotonic()
        try:
            d.status = client.post(self.url or "", content=d.body, headers=headers).status_code
        except httpx.HTTPError as exc:
            d.error = f"{type(exc).__name__}: {exc}"
        d.latency = time.monotonic() - started
        d.sent.set()
