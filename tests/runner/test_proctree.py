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


def test_kill_tree_gives_up_on_a_process_that_never_dies_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed process stuck in the kernel (uninterruptible sleep) is never a zombie: kill_tree
    returns at its deadline, names it, and looks at it less often once nothing is left to kill."""
    passes = [{10: _proc(1000, 5), 11: _proc(10, 6)}] + [{10: _proc(1000, 5, zombie=True), 11: _proc(1, 6)}] * 1000
    seen: list[int] = []

    def snapshot() -> dict[int, Proc]:
        seen.append(len(seen))
        return passes[min(len(seen) - 1, len(passes) - 1)]

    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(proctree, "snapshot", snapshot)
    monkeypatch.setattr(proctree.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(proctree.time, "sleep", sleep)
    monkeypatch.setattr(proctree.time, "monotonic", lambda: now[0])

    with caplog.at_level("WARNING", logger="runner.proctree"):
        assert proctree.kill_tree([10], within_s=1.0) == 2
    assert 1.0 < now[0] - 100.0 < 1.2  # it gave up at the deadline
    assert sleeps[0] == 0.01 and set(sleeps[1:]) == {proctree.DYING_POLL_S}  # then only waiting: polled less
    assert "still dying: [11]" in caplog.text


def test_a_stopped_supervisor_ends_its_trees_within_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """end_all_and_exit shares one deadline, under the runner's grace, among every tree it ends:
    a stuck first tree leaves the next less time, never another whole KILL_PASSES_S."""
    from runner import launch, processes

    now = [0.0]
    given: list[float] = []

    def kill_tree(roots: object, *, within_s: float, **_: object) -> int:
        given.append(within_s)
        now[0] += 5.0  # each tree takes five seconds to end
        return 1

    def exit_(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(processes, "managed", lambda: {21, 22})
    monkeypatch.setattr(processes, "_KILLED", set())
    monkeypatch.setattr(processes.proctree, "kill_tree", kill_tree)
    monkeypatch.setattr(processes.proctree, "is_subreaper", lambda: True)
    monkeypatch.setattr(processes.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(processes.os, "_exit", exit_)

    with pytest.raises(SystemExit):
        processes.end_all_and_exit(signal.SIGTERM, None)
    assert given == [processes.END_ALL_S, processes.END_ALL_S - 5.0, 0.0]
    assert processes.END_ALL_S < launch.STOP_GRACE_S
