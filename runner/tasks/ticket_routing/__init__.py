"""The ticket-routing task's evaluator: route support tickets to queues, judged by hold-out accuracy.

The asset is `router.py`, Python with two functions (the starting one is router.py beside this file):

    def train(examples: list[tuple[str, str]]) -> None   # (ticket text, queue) pairs: the training split
    def route(texts: list[str]) -> list[str]             # one queue per text, in order

The tickets are real: BANKING77's customer-service queries, 77 queues (tickets.py: the source, its
licence and checksums, the cache, and the seeded split). The evaluator (evaluation.py) runs the
router sandboxed with the training split only, gives it the hold-out's texts a batch at a time,
gates every answer (a known queue for every ticket) and computes the accuracy itself.

Profiles: "smoke" is a vendored sample (360 tickets, 12 queues) and a 60 s time box; "cpu" is the
whole set (13,072 distinct tickets, 77 queues) and a 300 s box. Each run's split comes from its seed, so the
metric of repeated runs of one router spreads as the choice of hold-out moves it (tickets.py).

A user's own tickets replace the profile's with `data` (a CSV or JSONL file, or a pinned URL of
one: tickets.py), which the three functions take; the profile then sets the time box only.

Accuracy, not macro-F1: BANKING77's queues are nearly balanced, accuracy is the figure its
literature reports, and a person reads it at once ("83% of tickets reach the right queue").
Macro-F1 is kept in the metrics, for queues of very different sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parts import pyarrow's runner.data: the service reads only the constants here
    from runner.tasks import Evaluation

HERE = Path(__file__).parent
STARTER = HERE / "router.py"  # the asset a new repository starts from
PROGRAM = HERE / "program.md"  # and its research program
PROFILES = ("smoke", "cpu")  # what `profile` may be (tickets.SOURCES, evaluation.SCALES)
DATA_SOURCES = (
    "a CSV (text, category) or JSONL file of labelled tickets: a path, or an https URL pinned as URL#sha256=HEX"
)


def prepare(profile: str, *, data: str | None = None, progress: bool = False) -> str:
    """The profile's tickets (or `data`'s) in the cache, made once; their fingerprint."""
    from runner.tasks.ticket_routing import tickets

    return tickets.prepare_pool(profile, data, progress=progress).fingerprint


def fingerprint(profile: str, *, data: str | None = None) -> str:
    """The prepared tickets' fingerprint, checked against the pool on disk (runner.tasks.run asks
    it before evaluating); runner.data.DataMissing when they are not prepared or have changed."""
    from runner.tasks.ticket_routing import tickets

    return tickets.load_pool(profile, data).fingerprint


def evaluate(asset: str, profile: str, seed: int, workdir: Path, *, data: str | None = None) -> Evaluation:
    """Train the router in `asset` on the training split of `seed` and measure its accuracy on the
    hold-out (evaluation.py). Missing or changed prepared tickets raise runner.data.DataMissing."""
    from runner.tasks.ticket_routing import tickets
    from runner.tasks.ticket_routing.evaluation import SCALES, evaluate_router

    pool = tickets.load_pool(profile, data)
    train, holdout = tickets.split(pool.tickets, seed)
    evaluation = evaluate_router(asset, train, holdout, workdir, scale=SCALES[profile], seed=seed)
    evaluation.metrics.update(data=pool.fingerprint, source=pool.source)
    return evaluation
