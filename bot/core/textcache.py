"""A cache for what is worked out from a whole text (a train.py's size, its normalised hash), keyed
by the text's SHA-256 rather than the text itself.

The loop asks for these again at every decision and every proposal, for each experiment in flight
and for main. `functools.lru_cache` would keep every text it has seen (tens of kilobytes each) and,
at 32 entries, forgot main's between two of its uses once 16 runners kept more experiments than
that in flight: sizing train.py again took 40% of the conductor's time in bench/duty_cycle.py at
K=16. Here 4,096 entries cost about 1.4 MiB a function. Arguments are positional only (the
decorated function should say so with `/`). Safe from any thread: the table is locked,
the work is not (at worst two threads work out the same value once each).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

MAX_ENTRIES = 4096


def by_digest(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn(text, *rest)`, remembered by the text's SHA-256 (and `rest`, hashable) for the last
    MAX_ENTRIES calls."""
    seen: OrderedDict[tuple[Hashable, ...], T] = OrderedDict()
    lock = threading.Lock()

    @functools.wraps(fn)
    def cached(text: str, *rest: Hashable) -> T:
        key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), *rest)
        with lock:
            if key in seen:
                seen.move_to_end(key)
                return seen[key]
        value = fn(text, *rest)
        with lock:
            seen[key] = value
            while len(seen) > MAX_ENTRIES:
                seen.popitem(last=False)
        return value

    return cached
