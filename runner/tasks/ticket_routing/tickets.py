"""The ticket-routing task's labelled tickets: where they come from, their cache, and the seeded
split of each run into a training split and a hold-out.

A profile names a source. "cpu" is BANKING77 (13,083 real customer-service queries of an online
bank, each labelled with one of 77 intents: the queues), downloaded from PolyAI's repository at a
pinned commit, each file checked against its sha256 (runner.download: retries, atomic writes).
"smoke" is a vendored sample of it (sample/SOURCE.md), so that tests and a first try need no
network. `prepare_pool` turns a source into one file of distinct labelled tickets, the pool
(cache_dir()/tasks/ticket-routing/SOURCE/pool.jsonl: BANKING77 gives 13,072, as 11 of its texts
appear twice once their spaces are trimmed, each time with the same intent), with a manifest whose fingerprint covers the
pool and the split rule; `load_pool` checks the pool against it.

Each run splits the pool afresh from its seed (`split`): per queue, a seeded HOLDOUT_FRACTION of its
tickets is held out. Runs of one seed see the same split, so main and an experiment run with one
seed are compared on the same tickets; runs of different seeds see different ones, so the metric of
repeated runs of main spreads as much as the choice of hold-out moves it, and the judge's noise
estimate has that spread to measure.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from runner import files
from runner.data import DataCorrupt, DataMissing, cache_dir

Ticket = tuple[str, str]  # (text, queue)

HOLDOUT_FRACTION = 0.2  # of each queue's tickets, held out in every run
SPLIT_VERSION = 1  # bump when `split` changes: the fingerprint changes with it
SAMPLE_DIR = Path(__file__).parent / "sample"
RETRIES, BACKOFF_S = 5, 1.0  # a download's retries, and the wait before the first (doubling after)


@dataclass(frozen=True)
class RemoteFile:
    url: str
    sha256: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Source:
    name: str  # the cache directory's name
    description: str  # one line, for the manifest and for people
    licence: str
    remote: tuple[RemoteFile, ...] = ()  # downloaded, in this order
    vendored: Path | None = None  # or a file shipped in the package


_BANKING77_AT = (
    "https://raw.githubusercontent.com/PolyAI-LDN/task-specific-datasets/57ec275d8078af65b7731c2a98be812d844a6d6b"
)
BANKING77 = Source(
    name="banking77",
    description="BANKING77 (PolyAI, 2020): 13,083 online-banking customer-service queries, 77 intents",
    licence="CC BY 4.0",
    remote=(
        RemoteFile(
            f"{_BANKING77_AT}/banking_data/train.csv",
            "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b",
        ),
        RemoteFile(
            f"{_BANKING77_AT}/banking_data/test.csv", "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d"
        ),
    ),
)
BANKING77_SAMPLE = Source(
    name="banking77-sample",
    description="360 queries of BANKING77, 30 for each of 12 intents (sample/SOURCE.md)",
    licence="CC BY 4.0",
    vendored=SAMPLE_DIR / "banking77_sample.csv",
)
SOURCES = {"smoke": BANKING77_SAMPLE, "cpu": BANKING77}


@dataclass(frozen=True)
class Pool:
    """The prepared tickets of one source: distinct texts, each with its queue."""

    root: Path
    source: str
    fingerprint: str
    tickets: tuple[Ticket, ...]

    @property
    def queues(self) -> list[str]:
        return sorted({queue for _, queue in self.tickets})


def source_for(profile: str) -> Source:
    try:
        return SOURCES[profile]
    except KeyError:
        raise ValueError(
            f"the ticket-routing task has no profile {profile!r}: choose one of {', '.join(SOURCES)}"
        ) from None


def pool_dir(source: Source) -> Path:
    return cache_dir() / "tasks" / "ticket-routing" / source.name


def prepare_pool(profile: str, *, progress: bool = False) -> Pool:
    """The profile's pool, made once in the cache (downloaded and checked, or copied from the
    package); a later call finds it and does no work."""
    source = source_for(profile)
    root = pool_dir(source)
    if (root / "manifest.json").exists():
        return load_pool(profile)
    root.mkdir(parents=True, exist_ok=True)
    if source.vendored is not None:
        tickets = read_csv(source.vendored.read_bytes(), source.vendored.name)
        origin = [f"{SAMPLE_DIR.name}/{source.vendored.name} in the runner.tasks.ticket_routing package"]
    else:
        tickets, origin = [], [remote.url for remote in source.remote]
        for remote in source.remote:
            if progress:
                print(f"ticket-routing: fetching {remote.url}", file=sys.stderr, flush=True)
            tickets += read_csv(_download(remote, root / "downloads").read_bytes(), remote.name)
    pool = _distinct(tickets)
    body = "".join(json.dumps({"text": text, "queue": queue}) + "\n" for text, queue in pool).encode()
    files.write_bytes(root / "pool.jsonl", body)
    manifest = {
        "source": source.name,
        "description": source.description,
        "licence": source.licence,
        "origin": origin,
        "tickets": len(pool),
        "queues": len({queue for _, queue in pool}),
        "holdout_fraction": HOLDOUT_FRACTION,
        "split_version": SPLIT_VERSION,
        "pool_sha256": hashlib.sha256(body).hexdigest(),
        "fingerprint": _fingerprint(body),
    }
    files.write_text(root / "manifest.json", json.dumps(manifest, indent=2))
    return load_pool(profile)


def load_pool(profile: str) -> Pool:
    """The profile's prepared pool, checked against its manifest; DataMissing says which command
    prepares it, DataCorrupt that a file changed since."""
    source = source_for(profile)
    root = pool_dir(source)
    redo = f"Delete {root} and run `autoresearch prepare --task ticket-routing --profile {profile}` again."
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        body = (root / "pool.jsonl").read_bytes()
    except FileNotFoundError:
        raise DataMissing(
            f"no prepared tickets for the {profile} profile (looked in {root}). "
            f"Run `autoresearch prepare --task ticket-routing --profile {profile}` first."
        ) from None
    except ValueError as error:
        raise DataCorrupt(f"{root / 'manifest.json'} is unreadable ({error}). {redo}") from None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != _fingerprint(body):
        raise DataCorrupt(f"the tickets in {root} do not match their manifest: pool.jsonl changed. {redo}")
    tickets = tuple((row["text"], row["queue"]) for row in map(json.loads, body.decode().splitlines()))
    return Pool(root=root, source=source.name, fingerprint=str(manifest["fingerprint"]), tickets=tickets)


def read_csv(data: bytes, name: str) -> list[Ticket]:
    """Tickets from CSV with a header naming a `text` column and a `category` (or `queue` or
    `label`) column, as BANKING77's files have."""
    rows = csv.DictReader(io.StringIO(data.decode("utf-8-sig")))
    fields = rows.fieldnames or []
    queue_field = next((field for field in ("category", "queue", "label") if field in fields), None)
    if "text" not in fields or queue_field is None:
        raise DataCorrupt(f"{name} has no `text` and `category` columns (its header: {', '.join(fields) or 'none'})")
    tickets = [(row["text"].strip(), (row[queue_field] or "").strip()) for row in rows]
    return [(text, queue) for text, queue in tickets if text and queue]


def split(tickets: tuple[Ticket, ...] | list[Ticket], seed: int) -> tuple[list[Ticket], list[Ticket]]:
    """(training split, hold-out) for `seed`: per queue, a seeded HOLDOUT_FRACTION of its tickets
    (at least one, never all) is held out. Both lists are in a seeded order that mixes the queues."""
    by_queue: dict[str, list[str]] = defaultdict(list)
    for text, queue in tickets:
        by_queue[queue].append(text)
    train: list[Ticket] = []
    holdout: list[Ticket] = []
    for queue in sorted(by_queue):
        texts = sorted(by_queue[queue])
        random.Random(f"{SPLIT_VERSION}:{seed}:{queue}").shuffle(texts)
        held = min(len(texts) - 1, max(1, round(len(texts) * HOLDOUT_FRACTION)))
        holdout += [(text, queue) for text in texts[:held]]
        train += [(text, queue) for text in texts[held:]]
    random.Random(f"{SPLIT_VERSION}:{seed}:order").shuffle(train)
    random.Random(f"{SPLIT_VERSION}:{seed}:order").shuffle(holdout)
    return train, holdout


def _distinct(tickets: list[Ticket]) -> list[Ticket]:
    """Each text once, in first-seen order; a text labelled with two queues is dropped (no router
    could be right about it)."""
    queues: dict[str, set[str]] = defaultdict(set)
    for text, queue in tickets:
        queues[text].add(queue)
    return [(text, next(iter(labels))) for text, labels in queues.items() if len(labels) == 1]


def _fingerprint(pool: bytes) -> str:
    digest = hashlib.sha256(pool)
    digest.update(f"split {SPLIT_VERSION} holdout {HOLDOUT_FRACTION}".encode())
    return digest.hexdigest()[:16]


def _download(remote: RemoteFile, directory: Path) -> Path:
    from runner import download  # httpx: only a profile that downloads needs it

    return download.download_file(
        remote.url, directory / remote.name, sha256=remote.sha256, retries=RETRIES, backoff_s=BACKOFF_S
    )
