"""The ticket-routing task's evaluator (runner.tasks.ticket_routing): the tickets' download, cache and
seeded split; the starting router's accuracy on the vendored sample; and what the gate, the sandbox
and the time box make of routers that cheat, lie, crash, hang or print.

Every evaluation here is real (a process on the vendored sample's tickets) and deterministic: a
router's answers depend on its seed only. Tests of what the sandbox hides skip where bubblewrap
cannot run; without it a router reads what the user can (the unsandboxed test shows that the
cheat is real), and everything else here holds the same.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runner import sandbox
from runner.data import DataCorrupt, DataMissing
from runner.download import DownloadError
from runner.tasks import ticket_routing
from runner.tasks.ticket_routing import evaluation, tickets
from runner.tasks.ticket_routing.evaluation import SCALES, Scale, evaluate_router

SANDBOX, WHY_NOT = sandbox.available()
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason=f"no sandbox here: {WHY_NOT}")
SMALL = Scale(time_box_s=30.0, batch_size=8)
SAMPLE = tickets.read_csv((tickets.SAMPLE_DIR / "banking77_sample.csv").read_bytes(), "sample")


@pytest.fixture(scope="module")
def split() -> tuple[list[tickets.Ticket], list[tickets.Ticket]]:
    """The sample's split of seed 0, cut to 40 hold-out tickets (5 batches of SMALL)."""
    train, holdout = tickets.split(SAMPLE, 0)
    return train, holdout[:40]


def router(route: str, *, train: str = "pass", head: str = "") -> str:
    """The text of a router.py whose train() and route(texts) have the bodies given."""
    return f"{head}\ndef train(examples):\n    {train}\n\ndef route(texts):\n    {route}\n"


FIRST_QUEUE = "return ['card_arrival'] * len(texts)"


def run(asset: str, split, tmp_path: Path, scale: Scale = SMALL, **options):
    train, holdout = split
    return evaluate_router(asset, train, holdout, tmp_path / "work", scale=scale, **options)


# --- the tickets -----------------------------------------------------------------------------------
def test_split_holds_out_a_fifth_of_every_queue_disjointly_and_repeats_for_a_seed() -> None:
    train, holdout = tickets.split(SAMPLE, 7)
    assert len(train) + len(holdout) == len(SAMPLE) == 360
    assert not {text for text, _ in train} & {text for text, _ in holdout}
    per_queue = {queue: sum(q == queue for _, q in holdout) for _, queue in SAMPLE}
    assert set(per_queue.values()) == {6}  # 20% of 30, in each of the 12 queues
    assert tickets.split(SAMPLE, 7) == (train, holdout)
    assert tickets.split(SAMPLE, 8)[1] != holdout


def test_the_profiles_the_task_declares_are_its_sources_and_scales() -> None:
    assert ticket_routing.PROFILES == tuple(tickets.SOURCES) == tuple(SCALES)


def test_csv_with_other_columns_says_what_it_lacks() -> None:
    assert tickets.read_csv(b"text,queue\nmy card is lost,lost_card\n,empty\n", "t.csv") == [
        ("my card is lost", "lost_card")
    ]
    with pytest.raises(tickets.TicketsUnusable, match="no `text` and `category`.*columns.*body, label"):
        tickets.read_csv(b"body,label\nx,y\n", "t.csv")


def test_prepare_smoke_once_and_a_changed_pool_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    with pytest.raises(DataMissing, match="autoresearch prepare --task ticket-routing --profile smoke"):
        ticket_routing.fingerprint("smoke")
    first = ticket_routing.prepare("smoke")
    assert ticket_routing.prepare("smoke") == ticket_routing.fingerprint("smoke") == first
    pool = tickets.load_pool("smoke")
    assert len(pool.tickets) == 360 and len(pool.queues) == 12
    manifest = json.loads((pool.root / "manifest.json").read_text())
    assert manifest["licence"] == "CC BY 4.0" and manifest["tickets"] == 360
    with (pool.root / "pool.jsonl").open("a") as handle:
        handle.write(json.dumps({"text": "planted", "queue": "card_arrival"}) + "\n")
    with pytest.raises(DataCorrupt, match="do not match their manifest"):
        ticket_routing.fingerprint("smoke")


class _Files(ThreadingHTTPServer):
    """Serves `files` (name -> bytes) on 127.0.0.1 and records each path asked for."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), _Serve)
        self.files, self.hits = files, []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Serve(BaseHTTPRequestHandler):
    server: _Files

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        self.server.hits.append(name)
        body = self.server.files.get(name)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[_Files]:
    halves = {"train.csv": SAMPLE[:200], "test.csv": SAMPLE[200:]}
    files = {
        name: ("text,category\n" + "".join(f'"{t}",{q}\n' for t, q in rows)).encode() for name, rows in halves.items()
    }
    server = _Files(files)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _remote_source(server: _Files, corrupt: str = "") -> tickets.Source:
    def sha(name: str) -> str:
        return hashlib.sha256(server.files[name] + (b"x" if name == corrupt else b"")).hexdigest()

    remote = tuple(tickets.RemoteFile(f"{server.url}/{name}", sha(name)) for name in ("train.csv", "test.csv"))
    return tickets.Source(name="served", description="the sample, served", licence="CC BY 4.0", remote=remote)


def test_cpu_tickets_are_downloaded_checked_and_pooled_once(
    served: _Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    monkeypatch.setitem(tickets.SOURCES, "cpu", _remote_source(served))
    fingerprint = ticket_routing.prepare("cpu")
    assert served.hits == ["train.csv", "test.csv"]
    assert len(tickets.load_pool("cpu").tickets) == 360
    assert ticket_routing.prepare("cpu") == fingerprint and len(served.hits) == 2  # found, not fetched again


def test_a_download_that_fails_its_checksum_leaves_no_pool(
    served: _Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    monkeypatch.setitem(tickets.SOURCES, "cpu", _remote_source(served, corrupt="test.csv"))
    monkeypatch.setattr(tickets, "RETRIES", 0)
    with pytest.raises(DownloadError, match="checksum mismatch"):
        ticket_routing.prepare("cpu")
    with pytest.raises(DataMissing):
        ticket_routing.fingerprint("cpu")


# --- tickets the user names (data) ----------------------------------------------------------------
# A small set written here (invented texts, three queues of six): the format a team's export has.
OWN = [
    *((f"my card {n} has not arrived yet", "card_arrival") for n in range(6)),
    *((f"please refund order {n}, it came broken", "refund") for n in range(6)),
    *((f"how do I change the address on account {n}", "change_address") for n in range(6)),
]


def _own_csv(path: Path, rows: list[tuple[str, str]] = OWN) -> Path:
    path.write_text("text,category\n" + "".join(f'"{text}",{queue}\n' for text, queue in rows))
    return path


def test_a_named_csv_is_prepared_apart_fingerprinted_and_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    own = str(_own_csv(tmp_path / "own.csv"))
    with pytest.raises(DataMissing, match=f"autoresearch prepare --task ticket-routing --profile smoke --data {own}"):
        ticket_routing.fingerprint("smoke", data=own)
    fingerprint = ticket_routing.prepare("smoke", data=own)
    assert ticket_routing.prepare("smoke", data=own) == ticket_routing.fingerprint("smoke", data=own) == fingerprint
    pool = tickets.load_pool("smoke", own)
    assert pool.root.name.startswith("data-") and len(pool.tickets) == 18 and len(pool.queues) == 3
    assert json.loads((pool.root / "manifest.json").read_text())["origin"] == [str(Path(own).resolve())]
    assert fingerprint != ticket_routing.prepare("smoke")  # the profile's own tickets stay apart
    result = ticket_routing.evaluate(ticket_routing.STARTER.read_text(), "smoke", 1, tmp_path / "run", data=own)
    assert result.status == "ok", result.error
    assert (result.metrics["holdout_tickets"], result.metrics["queues"]) == (3, 3)
    assert (result.metrics["data"], result.metrics["source"]) == (fingerprint, pool.root.name)
    _own_csv(Path(own), OWN[:-1])  # a changed file is new data, prepared on its own
    with pytest.raises(DataMissing, match="--data"):
        ticket_routing.fingerprint("smoke", data=own)


def test_a_named_jsonl_gives_the_same_tickets_as_the_csv(tmp_path: Path) -> None:
    lines = "".join(json.dumps({"text": text, "label": queue}) + "\n" for text, queue in OWN)
    assert tickets.read_tickets(lines.encode(), "own.jsonl") == OWN
    assert tickets.read_tickets(_own_csv(tmp_path / "own.csv").read_bytes(), "own.csv") == OWN


@pytest.mark.parametrize(
    ("name", "body", "why"),
    [
        ("own.csv", "body,label\nx,y\n", "no `text` and `category`"),
        ("own.csv", "text,queue\n" + "".join(f"ticket {n},refund\n" for n in range(10)), "only the queue 'refund'"),
        ("own.csv", "text,queue\n", "no labelled tickets"),
        (
            "own.csv",
            "text,queue\n" + "".join(f"t{n},refund\n" for n in range(6)) + "a,lost\nb,lost\n",
            r"1 queue\(s\) with fewer than 5 distinct tickets: 'lost' \(2\)",
        ),
        ("own.jsonl", '{"text": "a", "queue": "x"}\nnot json\n', "own.jsonl, line 2: not JSON"),
        ("own.jsonl", '{"body": "a"}\n', "line 1: not an object with a `text` string"),
    ],
)
def test_a_file_that_cannot_make_a_routing_task_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str, why: str
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / name).write_text(body)
    with pytest.raises(tickets.TicketsUnusable, match=why):
        ticket_routing.prepare("smoke", data=str(tmp_path / name))
    assert not (tmp_path / "cache" / "tasks" / "ticket-routing").exists() or not list(
        (tmp_path / "cache" / "tasks" / "ticket-routing").glob("*/manifest.json")
    )


def test_a_data_source_that_names_no_usable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no file of tickets at"):
        tickets.named_source(str(tmp_path / "absent.csv"))
    (tmp_path / "own.txt").write_text("text,queue\n")
    with pytest.raises(ValueError, match="must be a .csv or a .jsonl file"):
        tickets.named_source(str(tmp_path / "own.txt"))
    with pytest.raises(ValueError, match=r"not pinned: name them as https://example.org/t.csv#sha256=HEX"):
        tickets.named_source("https://example.org/t.csv")
    with pytest.raises(ValueError, match="not pinned"):
        tickets.named_source("https://example.org/t.csv#sha256=abc")


def test_a_pinned_url_is_downloaded_checked_and_pooled_by_its_checksum(
    served: _Files, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path))
    monkeypatch.setattr(tickets, "RETRIES", 0)
    sha = hashlib.sha256(served.files["train.csv"]).hexdigest()
    pinned = f"{served.url}/train.csv#sha256={sha}"
    fingerprint = ticket_routing.prepare("cpu", data=pinned)
    assert served.hits == ["train.csv"] and tickets.load_pool("cpu", pinned).root.name == f"data-{sha[:16]}"
    assert ticket_routing.fingerprint("smoke", data=pinned) == fingerprint  # the same tickets under either box
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "elsewhere"))  # where no tickets of that pin lie
    wrong = f"{served.url}/test.csv#sha256={sha}"
    with pytest.raises(DownloadError, match="checksum mismatch"):
        ticket_routing.prepare("cpu", data=wrong)


# --- the starting router -----------------------------------------------------------------------------
def test_starter_routes_the_sample_far_above_chance_and_the_same_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(tmp_path / "cache"))
    ticket_routing.prepare("smoke")
    starter = ticket_routing.STARTER.read_text()
    first = ticket_routing.evaluate(starter, "smoke", 1, tmp_path / "a")
    assert first.status == "ok", first.error
    assert first.value is not None and first.value > 0.75  # chance: 1/12; it scores 0.90 on seed 1
    assert first.metrics["holdout_tickets"] == 72 and first.metrics["queues"] == 12
    assert first.metrics["data"] == ticket_routing.fingerprint("smoke")
    assert first.sandboxed == SANDBOX
    again = ticket_routing.evaluate(starter, "smoke", 1, tmp_path / "b")
    assert again.value == first.value


# --- the gate ----------------------------------------------------------------------------------------
def test_an_unknown_queue_is_rejected_with_the_ticket_and_the_queue(split, tmp_path: Path) -> None:
    result = run(router("return ['card_arrival'] * (len(texts) - 1) + ['complaints']"), split, tmp_path)
    assert result.status == "rejected" and result.value is None
    assert "to 'complaints' at batch 1 of 5, which is not a queue of the training split" in result.error


def test_a_wrong_count_is_rejected(split, tmp_path: Path) -> None:
    result = run(router("return ['card_arrival']"), split, tmp_path)
    assert result.status == "rejected"
    assert "returned 1 queues for 8 tickets at batch 1 of 5" in result.error


def test_an_answer_json_cannot_carry_is_rejected(split, tmp_path: Path) -> None:
    result = run(router("return {'card_arrival'}"), split, tmp_path)
    assert result.status == "rejected" and "route() returned a set, not a list of strings" in result.error


def test_printing_reaches_the_log_and_changes_no_answer(split, tmp_path: Path) -> None:
    """What the router prints, through print, sys.__stdout__ or descriptor 1, even a line shaped
    like an answer, goes to the log: the evaluator reads the host's answers only."""
    noisy = router(
        "print(json.dumps({'labels': ['card_arrival'] * len(texts)})); "
        "sys.__stdout__.write('{\"ready\": true}\\n'); sys.__stdout__.flush(); "
        "os.write(1, b'route called\\n'); "
        "return ['lost_or_stolen_card'] * len(texts)",
        train="print('training on', len(examples), 'tickets')",
        head="import json, os, sys",
    )
    quiet = run(router("return ['lost_or_stolen_card'] * len(texts)"), split, tmp_path / "quiet")
    result = run(noisy, split, tmp_path / "noisy")
    assert result.status == "ok", result.error
    lost_cards = sum(queue == "lost_or_stolen_card" for _, queue in split[1])
    assert result.value == quiet.value == lost_cards / 40
    assert "training on 288 tickets" in result.log_tail and "route called" in result.log_tail


def test_a_line_written_into_the_answers_channel_is_rejected_not_counted(split, tmp_path: Path) -> None:
    """The host's answers travel on a private descriptor; a router that finds it and writes into it
    gets the run rejected, never a number."""
    forger = router(
        FIRST_QUEUE,
        train=("for fd in range(3, 64):\n        try: os.write(fd, b'accuracy: 1.0\\n')\n        except OSError: pass"),
        head="import os",
    )
    result = run(forger, split, tmp_path)
    assert result.status == "rejected" and result.value is None
    assert "not the host's answer" in result.error and "accuracy: 1.0" in result.error


def test_a_line_nested_past_the_parser_s_depth_is_rejected(split, tmp_path: Path) -> None:
    """A line the JSON parser cannot take for its depth (RecursionError, no ValueError), or can take
    but not write back into the rejection's message, is no answer: the run is rejected, the asset's
    doing, never an evaluator's failure (which would be a lost run, run again)."""
    nester = router(
        FIRST_QUEUE,
        train="for fd in range(3, 64):\n        try: os.write(fd, b'[' * 100000 + b'\\n')\n        except OSError: pass",
        head="import os",
    )
    result = run(nester, split, tmp_path)
    assert result.status == "rejected" and result.value is None, result.error
    assert "not the host's answer" in result.error
    # a line just under the parser's depth parses, but cannot be written back into the message
    nested: list = []
    for _ in range(sys.getrecursionlimit()):
        nested = [nested]
    said = evaluation._not_an_answer({"unparsed": nested}, "at batch 1 of 5")
    assert "a JSON value nested too deep to show" in said


# --- crashes, the time box, the limits ---------------------------------------------------------------
def test_an_exception_is_a_crash_with_its_traceback(split, tmp_path: Path) -> None:
    result = run(router(FIRST_QUEUE, train="raise ValueError('no tickets about mortgages')"), split, tmp_path)
    assert result.status == "crash"
    assert "Traceback" in result.error and "ValueError: no tickets about mortgages" in result.error


def test_a_router_that_exits_is_a_crash(split, tmp_path: Path) -> None:
    result = run(router("os._exit(3)", head="import os"), split, tmp_path)
    assert result.status == "crash" and "ended at batch 1 of 5 without an answer (exit code 3)" in result.error


def test_an_endless_loop_is_stopped_at_the_time_box(split, tmp_path: Path) -> None:
    result = run(router("while True: pass"), split, tmp_path, scale=Scale(time_box_s=1.0, batch_size=8))
    assert result.status == "timeout" and result.value is None
    assert "ran past its time box of 1 s" in result.error and "at batch 1 of 5" in result.error


def test_memory_past_the_run_limit_is_a_crash_that_names_the_limit(
    split, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTORESEARCH_RUN_MEMORY", "512M")
    result = run(router(FIRST_QUEUE, train="bytearray(2 << 30)"), split, tmp_path)
    assert result.status == "crash"
    assert "router.py ran out of memory: a run may hold 512 MiB" in result.error


HOLDERS = """
import subprocess, sys, time
HOLD = "import time; held = bytes(range(256)) * (60 << 12); print('held', flush=True); time.sleep(120)"

def start_holders():  # three processes holding 60 MiB each, then a wait
    holders = [subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE) for _ in range(3)]
    for holder in holders:
        holder.stdout.readline()
    time.sleep(120)
"""


def test_memory_held_across_the_routers_processes_is_a_crash_that_names_it(
    split, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three processes of 60 MiB: none passes a 128 MiB limit alone (the kernel lets each be), the
    tree does, and the evaluator's look at the tree stops it (long before the time box)."""
    monkeypatch.setenv("AUTORESEARCH_RUN_MEMORY", "128M")
    result = run(router(FIRST_QUEUE, train="start_holders()", head=HOLDERS), split, tmp_path)
    assert result.status == "crash", result.error
    assert result.error.startswith("router.py used more than 128 MiB of memory (the limit per run)"), result.error
    assert "(stopped while it started and train() ran)" in result.error


# --- what the router can see -------------------------------------------------------------------------
def _snoop(*places: Path | str) -> str:
    """A router that looks for the hold-out's labels wherever it could guess they are (`places`, and
    the file descriptors of its own first process and its parent's) in any file of JSON lines or
    CSV, routes a ticket by any labelled copy of its text it finds, and logs how many it found."""
    return f"""
import csv, json, os, stat, sys
PLACES = {[str(place) for place in places]!r}
# The Python installation, the virtual environment and the runner package, which every sandbox shows
# read-only: their files are ours and hold no ticket (the sample's directory, hidden, is searched on
# its own), and a checkout under /tmp would otherwise have the walk of /tmp read a whole venv.
OURS = {[str(path) for path in sandbox.python_dirs() if Path(tickets.SAMPLE_DIR).resolve() not in (path, *path.parents)]!r}
labelled = {{}}

def look(path):
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read(4 << 20).splitlines()
    except OSError:
        return
    for line in lines:
        try:
            row = json.loads(line)
            labelled[row["text"]] = row["queue"]
        except Exception:
            pass
    try:
        labelled.update(row for row in csv.reader(lines) if len(row) == 2)
    except csv.Error:
        pass

def train(examples):
    for place in PLACES:
        for root, dirs, files in os.walk(place):
            if root.startswith("/proc/") and root.count("/") > 2:
                dirs[:] = []
            dirs[:] = [d for d in dirs if os.path.join(root, d) not in OURS]
            for name in files:
                if not root.startswith("/proc") or name in ("environ", "cmdline"):
                    look(os.path.join(root, name))
    for proc in ("/proc/1", "/proc/%d" % os.getppid()):
        for fd in range(64):
            look(proc + "/fd/%d" % fd)
    train.queues = sorted(set(queue for _, queue in examples))
    labelled.update({{text: queue for text, queue in examples}})

def route(texts):
    print("FOUND", sum(text in labelled for text in texts), "of", len(texts), file=sys.stderr)
    return [labelled[text] if labelled.get(text) in train.queues else train.queues[0] for text in texts]
"""


@needs_sandbox
def test_a_router_that_looks_for_the_holdout_labels_finds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    ticket_routing.prepare("smoke")
    workdir = tmp_path / "run" / "work"
    snoop = _snoop(cache, tickets.SAMPLE_DIR, workdir, workdir.parent, "/proc", "/tmp")
    result = ticket_routing.evaluate(snoop, "smoke", 1, workdir)
    assert result.status == "ok" and result.sandboxed, result.error
    assert "FOUND 0 of 24" in result.log_tail and "FOUND 1" not in result.log_tail
    assert result.value == 6 / 72  # the first queue's six tickets: chance, nothing learned from the hold-out


def test_unsandboxed_the_same_router_reads_the_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sandbox is for: without it the cache is readable, and the snooping router is right
    about every ticket (so the sandboxed test above would catch a sandbox that let it see)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(cache))
    ticket_routing.prepare("smoke")
    train, holdout = tickets.split(tickets.load_pool("smoke").tickets, 1)
    workdir = tmp_path / "run" / "work"
    result = evaluate_router(_snoop(cache, workdir), train, holdout, workdir, scale=SCALES["smoke"], use_sandbox=False)
    assert result.status == "ok" and not result.sandboxed
    assert result.value == 1.0
    assert "WITHOUT a sandbox" in result.log_tail
