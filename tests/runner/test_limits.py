"""What one run may hold (runner.limits), as the supervisor sees it: the memory and tasks of a run's
whole process tree and its scratch directory's size, each named in words once crossed. The tree here
is plain Python processes that hold what a test gives them and say so; the same check stopping real
runs is tests/runner/test_isolated_limits.py (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import limits, proctree

HOLD = """
import os, sys, threading, time
megabytes, children, threads = (int(arg) for arg in sys.argv[1:4])
for _ in range(children):
    if os.fork() == 0:
        break
block = bytearray(megabytes << 20)
for i in range(0, len(block), 4096):
    block[i] = 1  # resident, not just reserved
for _ in range(threads):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
os.write(1, b"holding\\n")  # one write: the tree's lines never interleave
time.sleep(600)
"""
ROOMY = limits.RunLimits(memory=64 << 30, tasks=10_000, scratch=1 << 30)


@pytest.fixture
def tree() -> Iterator:
    """Start a tree of 1 + `children` processes, each holding `megabytes` and `threads` sleeping
    threads; returns its root's pid once every process says it holds them."""
    started: list[subprocess.Popen] = []

    def start(megabytes: int = 0, children: int = 0, threads: int = 0) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(megabytes), str(children), str(threads)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        for _ in range(1 + children):
            assert proc.stdout.readline() == "holding\n"
        return proc.pid

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # its process group: the whole tree
        proc.wait()


def others(root: int) -> set[int]:
    """This process's other children: what the supervisor passes as `spare` (other runs' processes).
    Some earlier test may have made this process a subreaper, and then whatever it still has running
    (another test's server, a worker of xdist's) would otherwise count toward the tree."""
    return {pid for pid, p in proctree.snapshot().items() if p.ppid == os.getpid()} - {root}


def test_a_tree_within_its_limits_crossed_nothing(tree, tmp_path: Path) -> None:
    root = tree(megabytes=8, children=2, threads=2)
    assert limits.crossed(ROOMY, root, tmp_path, spare=others(root)) == ""


def test_memory_is_counted_over_the_whole_tree(tree, tmp_path: Path) -> None:
    # three processes of 40 MiB: none passes a 64 MiB limit alone, the tree does
    root = tree(megabytes=40, children=2)
    why = limits.crossed(
        limits.RunLimits(memory=64 << 20, tasks=10_000, scratch=1 << 30), root, tmp_path, spare=others(root)
    )
    assert why.startswith("train.py used more than 64 MiB of memory (the limit per run): its 3 process(es)"), why
    assert "needs a smaller model or batch, or a larger share of the machine" in why


def test_another_tasks_asset_is_named_in_the_words_of_each_limit(tree, tmp_path: Path) -> None:
    root = tree(megabytes=40, children=2)
    memory = limits.crossed(
        limits.RunLimits(memory=64 << 20, tasks=10_000, scratch=1 << 30),
        root,
        tmp_path,
        spare=others(root),
        asset="router.py",
    )
    assert memory.startswith("router.py used more than 64 MiB of memory (the limit per run)"), memory
    assert "needs a leaner router.py, or a larger share of the machine" in memory
    tasks = limits.crossed(
        limits.RunLimits(memory=64 << 30, tasks=2, scratch=1 << 30),
        root,
        tmp_path,
        spare=others(root),
        asset="router.py",
    )
    assert tasks.startswith("router.py ran more than 2 processes and threads at once"), tasks


def test_tasks_count_processes_and_threads(tree, tmp_path: Path) -> None:
    root = tree(children=2, threads=4)  # 3 processes of 5 tasks each
    why = limits.crossed(
        limits.RunLimits(memory=64 << 30, tasks=10, scratch=1 << 30), root, tmp_path, spare=others(root)
    )
    assert why.startswith("train.py ran more than 10 processes and threads at once (the limit per run): 15"), why


def test_scratch_is_counted_by_the_blocks_its_files_take(tree, tmp_path: Path) -> None:
    root = tree()
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "filler").write_bytes(b"\x01" * (3 << 20))
    why = limits.crossed(
        limits.RunLimits(memory=64 << 30, tasks=10_000, scratch=2 << 20), root, tmp_path, spare=others(root)
    )
    assert why.startswith("train.py wrote more than 2 MiB to its scratch directory (the limit per run): 3"), why
