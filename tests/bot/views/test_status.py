"""`autoresearch status`'s line on GitHub's write budget: the writes of the last minute and hour
against GitHub's limits, and the publisher's mode, since when and why."""

from __future__ import annotations

import time
from pathlib import Path

from bot.store import Store
from bot.store.writes import Write, WriteMode
from bot.views.status import write_budget_line


def test_the_write_budget_line_says_the_counts_and_why_the_mode_is_degraded(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    now = time.time()
    store.writes.add([Write(now - 600, "branch", True), Write(now - 10, "pull", False)])
    assert write_budget_line(store.writes.summary(now)) == (
        "GitHub writes: 2 in the last hour / 500, 1 in the last minute / 80; full"
    )
    store.writes.mode = WriteMode("degraded", now, "full would take 640 writes per 3600 s")
    line = write_budget_line(store.writes.summary(now))
    assert line.startswith("GitHub writes: 2 in the last hour / 500, 1 in the last minute / 80; degraded since ")
    assert line.endswith("(full would take 640 writes per 3600 s)")
