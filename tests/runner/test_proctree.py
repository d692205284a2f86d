"""runner.proctree: ending a run's tree whole, read from a /proc that the test scripts pass by pass."""

from __future__ import annotations

import signal

import pytest

from runner import proctree
from runner.proctree import Proc


def _proc(ppid: int, start: int, *, zombie: bool = False) -> Proc:
    return Proc(ppid=ppid, start=start, cpu=0.0, threads=1, zombie=zombie)


def test_kill_tree_waits_for_a_killed_process_that_was_re_parented_while_it_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bubblewrap's outer process (10) dies at once; the pid namespace's first process (11), killed
    in the same pass, is re-parented away and goes on dying while it waits for its namespace. Until
    it is a zombie the run is not over: seen as a flake of test_local's cancel test."""
    passes = [
        {10: _proc(1000, 5), 11: _proc(10, 6), 12: _proc(11, 7)},  # the tree, all alive
        {10: _proc(1000, 5, zombie=True), 11: _proc(1, 6)},  # 10 dead, 11 re-parented and still dying
        {10: _proc(1000, 5, zombie=True), 11: _proc(1, 6)},
        {10: _proc(1000, 5, zombie=True), 11: _proc(1, 6, zombie=True)},
    ]
    seen: list[int] = []

    def snapshot() -> dict[int, Proc]:
        seen.append(len(seen))
        return passes[min(len(seen) - 1, len(passes) - 1)]

    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(proctree, "snapshot", snapshot)
    monkeypatch.setattr(proctree.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(proctree.time, "sleep", lambda s: None)

    assert proctree.kill_tree([10]) == 3
    assert len(seen) == 4  # it returned only once 11 was a zombie
    assert sorted(killed) == [(10, signal.SIGKILL), (11, signal.SIGKILL), (12, signal.SIGKILL)]


def test_kill_tree_does_not_wait_for_a_pid_reused_by_another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed process whose pid now names another process (another start time) is gone."""
    passes = [
        {10: _proc(1000, 5), 11: _proc(10, 6)},
        {10: _proc(1000, 5, zombie=True), 11: _proc(1, 99)},  # 11 died and its pid was reused
    ]
    seen: list[int] = []

    def snapshot() -> dict[int, Proc]:
        seen.append(len(seen))
        return passes[min(len(seen) - 1, len(passes) - 1)]

    monkeypatch.setattr(proctree, "snapshot", snapshot)
    monkeypatch.setattr(proctree.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(proctree.time, "sleep", lambda s: None)

    assert proctree.kill_tree([10]) == 2
    assert len(seen) == 2
