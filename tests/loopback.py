"""An ASGI app served by uvicorn on a free loopback port, in a background thread, for the stand-ins
(github_standin, anthropic_standin): started and stopped without uvicorn's fixed waits, because
most tests start and stop one.

    server = LoopbackServer(name="my-standin")      # the port is taken here: server.base_url
    server.start(build_app())                        # returns once it accepts connections
    ...
    server.stop()                                    # milliseconds, not uvicorn's 0.2 s
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server without its fixed waits: uvicorn looks at `should_exit` every 0.1 s, and
    its shutdown sleeps 0.1 s before it looks at its connections and then looks every 0.1 s.
    `exit_now()` wakes the main loop at once, and the shutdown ends as soon as the last connection
    is closed and the last request answered (or after `timeout_graceful_shutdown`, as in uvicorn)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _woken: asyncio.Event

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = threading.Event()  # set when startup has ended, listening (`started`) or not

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.up.set()

    def exit_now(self) -> None:
        self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        ticks = 0
        while not await self.on_tick(ticks):  # a tick that is a multiple of 10 refreshes the Date header
            ticks = (ticks + 10) % 864000
            try:
                await asyncio.wait_for(self._woken.wait(), timeout=1.0)
            except TimeoutError:
                pass

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # an idle keep-alive connection closes now, a busy one after its answer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.timeout_graceful_shutdown or 0)
        while (self.server_state.connections or self.server_state.tasks) and loop.time() < deadline:
            await asyncio.sleep(0.002)
        for task in self.server_state.tasks:
            task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class LoopbackServer:
    def __init__(self, name: str, grace_s: float = 2.0) -> None:
        """Takes a free port on 127.0.0.1 now (so `base_url` is known before the app is built);
        `grace_s` is how long stop() lets requests in flight finish before they are cancelled."""
        # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on each connection; without it every
        # answer waits out the peer's delayed ACK (40 ms a request on Linux loopback)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.name, self.grace_s = name, grace_s
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, app: Any) -> None:
        """Serve `app`; returns once it accepts connections (RuntimeError if it cannot within 10 s)."""
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=self.grace_s
        )
        self._server = _Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.up.wait(timeout=0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                break
        if not self._server.started:
            raise RuntimeError(f"the {self.name} server did not start; see the log above")

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.exit_now()
            self._thread.join(timeout=10)
        else:
            self._socket.close()
