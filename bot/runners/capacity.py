"""How many runs a runner may hold now, changed by an operator while the bot runs.

Runners come and go in a lab: a GPU is lent to another project for an afternoon, a rack is
added, Modal's spending is raised. The number lives in one file, `<state_dir>/slots` (one
integer, `echo 12 > autoresearch-state/slots`), which every runner reads again when it changes
(its modification time; a stat per tick costs microseconds). Without the file the configured
number counts (`AUTORESEARCH_SLOTS` for the local runner, `AUTORESEARCH_ACTIONS_RUNNERS` for
Actions, `AUTORESEARCH_MODAL_GPUS` for Modal); for Actions the file counts runners, as that
setting does (each holds `queue_ahead` more jobs queued on GitHub). A file, not a signal or the settings' .env: it
works the same under systemd, docker or a terminal, for every runner, needs no restart and no
process id, and it sits beside the store that a lab already backs up and watches. For Actions the
bot does not count the online self-hosted runners itself: listing them needs the App to hold the
repository's Administration permission, and a runner online for other workflows, or between two
reboots, is not a slot; the file says what the lab means to lend.

The conductor asks `runner.slots` before each dispatch (bot.loop.runs), so a larger number takes
new runs at the next tick, and a smaller one takes effect as runs end: a slot removed finishes
the run it holds and takes no new one. A runner may cap the number (the local runner, at the
slots it was started with: each slot's CPU threads and memory share are part of what its runs
measure). A file that cannot be read, or holds no positive integer, is said once in the log and
the last good number kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

SLOTS_FILE = "slots"


class Slots:
    """The slot count: `configured`, or the number in `path` while it holds one, at most `cap`
    (no `path`: always `configured`)."""

    def __init__(self, path: Path | None, configured: int, *, cap: int | None = None) -> None:
        if configured < 1:
            raise ValueError("a runner needs at least one slot")
        self.path = path
        self.configured = configured
        self.cap = cap
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._value = self._capped(configured)

    def __call__(self) -> int:
        if self.path is None:
            return self._value
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._seen is not None:
                log.info("%s removed: back to the configured %d slot(s)", self.path, self.configured)
                self._seen, self._value = None, self._capped(self.configured)
            return self._value
        except OSError as error:
            return self._keep(f"cannot be read ({error})", (0, 0))
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return self._value
        try:
            text = self.path.read_text().strip()
        except OSError as error:
            return self._keep(f"cannot be read ({error})", seen)
        try:
            wanted = int(text)
        except ValueError:
            return self._keep(f"holds {text[:40]!r}, not a number of slots", seen)
        if wanted < 1:
            return self._keep(f"asks for {wanted} slots; at least 1 (stop the bot to run nothing)", seen)
        value = self._capped(wanted)
        if value != wanted:
            log.warning(
                "%s asks for %d slots; this runner holds at most %d (restart it with more to have more)",
                self.path,
                wanted,
                value,
            )
        if value != self._value:
            log.info("slots: %d -> %d (%s)", self._value, value, self.path)
        self._seen, self._value = seen, value
        return value

    def _keep(self, why: str, seen: tuple[int, int]) -> int:
        if seen != self._seen:
            log.warning("%s %s: keeping %d slot(s)", self.path, why, self._value)
            self._seen = seen
        return self._value

    def _capped(self, wanted: int) -> int:
        return wanted if self.cap is None else min(wanted, self.cap)


def slots_file(state_dir: Path) -> Path:
    """Where an operator writes the number of slots for the bot whose state is in `state_dir`."""
    return state_dir / SLOTS_FILE
