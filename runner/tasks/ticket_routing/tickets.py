"""The ticket-routing task's labelled tickets: where they come from, their cache, and the seeded
split of each run into a training split and a hold-out.

A profile names a source. "cpu" is BANKING77 (13,083 real customer-service queries of an online
bank, each labelled with one of 77 intents: the queues), downloaded from PolyAI's repository at a
pinned commit, each file checked against its sha256 (runner.download: retries, atomic writes).
"smoke" is a vendored sample of it (sample/SOURCE.md), so that tests and a first try need no
network. `prepare_pool` turns a source into one file of distinct labelled tickets, the pool
(cache_dir()/tasks/ticket-routing/SOURCE/pool.jsonl: BANKING77 gives 13,072, as 11 of its texts
appear twice once their spaces are trimmed, each time with the same intent), with a manifest whose
fingerprint covers the pool and the split rule; `load_pool` checks the pool against it.

A user names their own tickets with `data` (`autoresearch prepare --task ticket-routing --data D`,
as training's --data names its text): D is a CSV file (a header naming a `text` column and a
`category`, `queue` or `label` column) or a JSONL file (one object a line with those keys), as a
path on this machine or as an https URL pinned by its content, `URL#sha256=HEX` (pip's form; the
download is checked against it, and refused unpinned: every runner must measure the same tickets).
Its pool lives in a directory named by the file's sha256 (data-HEX16), so a changed file is new
data and asks for its own preparation. The profile then only sets the time box. A file that cannot
make a routing task is refused at preparation, saying why (`TicketsUnusable`): columns missing, a
line that is not JSON, fewer than two queues, or a queue with fewer than MIN_PER_QUEUE tickets.

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
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from runner import files
from runner.data import DataCorrupt, DataMissing, cache_dir

Ticket = tuple[str, str]  # (text, queue)

HOLDOUT_FRACTION = 0.2  # of each queue's tickets, held out in every run
SPLIT_VERSION = 1  # bump when `split` changes: the fingerprint changes with it
SAMPLE_DIR = Path(__file__).parent / "sample"
RETRIES, BACKOFF_S = 5, 1.0  # a download's retries, and the wait before the first (doubling after)
MIN_PER_QUEUE = 5  # tickets a queue needs: one held out, four to learn from
FORMATS = (".csv", ".jsonl")


class TicketsUnusable(ValueError):
    """A file of tickets that cannot make a routing task (the message says what to change)."""


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
    file: Path | None = None  # or a file on this machine: shipped in the package, or the user's
    data: str | None = None  # what the user named (None for a profile's own source)


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
    file=SAMPLE_DIR / "banking77_sample.csv",
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


def source_for(profile: str, data: str | None = None) -> Source:
    """The profile's own source, or the one `data` names (see the module docstring)."""
    if profile not in SOURCES:
        raise ValueError(f"the ticket-routing task has no profile {profile!r}: choose one of {', '.join(SOURCES)}")
    return SOURCES[profile] if data is None else named_source(data)


def named_source(data: str) -> Source:
    """The source of a user's tickets: a local CSV or JSONL file, or a pinned https URL of one.
    ValueError says what is wrong with the name (no such file, another format, no pin)."""
    if data.startswith(("https://", "http://")):
        url, _, pin = data.partition("#")
        digest = pin.removeprefix("sha256=").lower()
        if not pin.startswith("sha256=") or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(
                f"the tickets at {url} are not pinned: name them as {url}#sha256=HEX, HEX being the file's sha256 "
                "(`sha256sum FILE`), so that every runner measures the same tickets"
            )
        _check_format(url.split("?")[0])
        remote = RemoteFile(url, digest)
        return Source(
            name=f"data-{digest[:16]}",
            description=f"tickets from {url}",
            licence="as its source says",
            remote=(remote,),
            data=data,
        )
    path = Path(data).expanduser()
    if not path.is_file():
        raise ValueError(f"no file of tickets at {path}: name a CSV or JSONL file, or an https URL#sha256=HEX")
    _check_format(path.name)
    return Source(
        name=f"data-{_sha256(path)[:16]}",
        description=f"tickets from {path.resolve()}",
        licence="as its source says",
        file=path.resolve(),
        data=data,
    )


def _check_format(name: str) -> None:
    if not name.lower().endswith(FORMATS):
        raise ValueError(f"{name}: the tickets must be a .csv or a .jsonl file")


def pool_dir(source: Source) -> Path:
    return cache_dir() / "tasks" / "ticket-routing" / source.name


def prepare_pool(profile: str, data: str | None = None, *, progress: bool = False) -> Pool:
    """The pool of the profile's source (or of `data`), made once in the cache (downloaded and
    checked, or read from its file); a later call finds it and does no work. TicketsUnusable
    says why a file cannot make a routing task."""
    source = source_for(profile, data)
    root = pool_dir(source)
    if (root / "manifest.json").exists():
        return load_pool(profile, data)
    if source.file is not None:
        tickets = read_tickets(source.file.read_bytes(), source.file.name)
        origin = [
            str(source.file)
            if source.data is not None
            else f"{SAMPLE_DIR.name}/{source.file.name} in the runner.tasks.ticket_routing package"
        ]
    else:
        tickets, origin = [], [remote.url for remote in source.remote]
        for remote in source.remote:
            if progress:
                print(f"ticket-routing: fetching {remote.url}", file=sys.stderr, flush=True)
            tickets += read_tickets(_download(remote, root / "downloads").read_bytes(), remote.name)
    pool = _distinct(tickets)
    check_pool(pool, source.description)
    root.mkdir(parents=True, exist_ok=True)
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
    return load_pool(profile, data)


def load_pool(profile: str, data: str | None = None) -> Pool:
    """The prepared pool of the profile's source (or of `data`), checked against its manifest;
    DataMissing says which command prepares it, DataCorrupt that a file changed since."""
    source = source_for(profile, data)
    root = pool_dir(source)
    command = f"autoresearch prepare --task ticket-routing --profile {profile}" + (f" --data {data}" if data else "")
    redo = f"Delete {root} and run `{command}` again."
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        body = (root / "pool.jsonl").read_bytes()
    except FileNotFoundError:
        raise DataMissing(
            f"no prepared tickets for the {profile} profile{f' from {data}' if data else ''} (looked in {root}). "
            f"Run `{command}` first."
        ) from None
    except ValueError as error:
        raise DataCorrupt(f"{root / 'manifest.json'} is unreadable ({error}). {redo}") from None
    if not isinstance(manifest, dict) or manifest.get("fingerprint") != _fingerprint(body):
        raise DataCorrupt(f"the tickets in {root} do not match their manifest: pool.jsonl changed. {redo}")
    tickets = tuple((row["text"], row["queue"]) for row in map(json.loads, body.decode().splitlines()))
    return Pool(root=root, source=source.name, fingerprint=str(manifest["fingerprint"]), tickets=tickets)


QUEUE_FIELDS = ("category", "queue", "label")


def read_tickets(data: bytes, name: str) -> list[Ticket]:
    """Tickets from a CSV or JSONL file's bytes, by its name's suffix."""
    return read_jsonl(data, name) if name.lower().endswith(".jsonl") else read_csv(data, name)


def read_csv(data: bytes, name: str) -> list[Ticket]:
    """Tickets from CSV with a header naming a `text` column and a `category` (or `queue` or
    `label`) column, as BANKING77's files have."""
    rows = csv.DictReader(io.StringIO(_text(data, name)))
    fields = rows.fieldnames or []
    queue_field = next((field for field in QUEUE_FIELDS if field in fields), None)
    if "text" not in fields or queue_field is None:
        raise TicketsUnusable(
            f"{name} has no `text` and `category` (or `queue`, `label`) columns (its header: {', '.join(fields) or 'none'})"
        )
    tickets = [((row["text"] or "").strip(), (row[queue_field] or "").strip()) for row in rows]
    return [(text, queue) for text, queue in tickets if text and queue]


def read_jsonl(data: bytes, name: str) -> list[Ticket]:
    """Tickets from JSON lines, each an object with `text` and `category` (or `queue`, `label`)."""
    tickets = []
    for number, line in enumerate(_text(data, name).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise TicketsUnusable(f"{name}, line {number}: not JSON ({error})") from None
        queue_field = next((field for field in QUEUE_FIELDS if isinstance(row, dict) and field in row), None)
        if not isinstance(row, dict) or not isinstance(row.get("text"), str) or queue_field is None:
            raise TicketsUnusable(
                f"{name}, line {number}: not an object with a `text` string and a `category` (or `queue`, `label`)"
            )
        text, queue = row["text"].strip(), str(row[queue_field]).strip()
        if text and queue:
            tickets.append((text, queue))
    return tickets


def check_pool(pool: list[Ticket], what: str) -> None:
    """TicketsUnusable unless the pool makes a routing task: two queues or more, each with at least
    MIN_PER_QUEUE distinct tickets (one held out in every run, the rest to learn from)."""
    sizes = Counter(queue for _, queue in pool)
    if len(sizes) < 2:
        found = f"only the queue {next(iter(sizes))!r}" if sizes else "no labelled tickets"
        raise TicketsUnusable(f"{what}: {found}; a router needs two queues or more to choose from")
    small = sorted((count, queue) for queue, count in sizes.items() if count < MIN_PER_QUEUE)
    if small:
        shown = ", ".join(f"{queue!r} ({count})" for count, queue in small[:8])
        more = f" and {len(small) - 8} more" if len(small) > 8 else ""
        raise TicketsUnusable(
            f"{what}: {len(small)} queue(s) with fewer than {MIN_PER_QUEUE} distinct tickets: {shown}{more}. "
            "Give each queue more tickets, or leave out (or merge) the small ones"
        )


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TicketsUnusable(f"{name} is not UTF-8 text ({error})") from None


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
