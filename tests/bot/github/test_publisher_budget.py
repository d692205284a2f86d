"""The publisher under the write budget, against the stand-in that counts every content-creating
request: a short run's check is made once, in its final state; enough experiments to bind a scaled
budget keep every window within its limit, turn the mode degraded, and show each experiment exactly
once (kept and promising ones on their pull request, the rest in one batch comment on the research log)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.core.protocols import Snapshot
from bot.core.states import State
from bot.github.budget import WriteBudget, WriteBudgetStopped, open_ledger
from bot.github.forge import GitHubForge
from bot.github.publisher import GitHubPublisher
from bot.github.summaries import BATCH, DIFF_CHARS, EVERY_S, change_diff, summary_comment
from bot.loop.publishing import PublishWorker
from bot.store import Store
from runner.tasks import TRAINING

LIMITS = ((60.0, 12), (600.0, 40))  # GitHub's 80 a minute and 500 an hour, scaled down
BOT = "autoresearch-bot[bot]"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Lab:
    """A store, the forge and the publisher on one stand-in, one clock and one write budget; `stamps`
    holds (number of requests the stand-in had served, the clock) at each write charged."""

    def __init__(self, gh: GitHubStandIn, tmp_path: Path, limits: tuple[tuple[float, int], ...] | None) -> None:
        self.gh, self.clock = gh, FakeClock()
        repo = github.Github(
            auth=github.Auth.Token("tok"),
            base_url=gh.api_url,
            retry=None,
            seconds_between_requests=None,
            seconds_between_writes=None,
        ).get_repo("octo-org/research")
        self.store = Store(tmp_path / "state.db")
        self.store.state.bot_login = BOT
        self.budget = (
            WriteBudget(open_ledger(tmp_path / "state.db"), clock=self.clock, sleep=self.clock.sleep, limits=limits)
            if limits
            else None
        )
        self.stamps: list[tuple[int, float]] = []
        self.forge = GitHubForge(repo, pace_write=self._charge)
        self.main = self.forge.main_sha()
        self.publisher = GitHubPublisher(
            self.store, repo, read_file=self.forge.read_file, uses_app=True, budget=self.budget, clock=self.clock
        )
        if self.budget is not None:
            wait = self.budget.wait

            def stamped_wait(what: str) -> float:
                waited = wait(what)
                self.stamps.append((len(self.gh.requests), self.clock.now))
                return waited

            self.budget.wait = stamped_wait  # type: ignore[method-assign]

    def _charge(self, what: str) -> None:
        if self.budget is not None:
            self.budget.charge(what)
            self.stamps.append((len(self.gh.requests), self.clock.now))

    def experiment(self, i: int, *, pushed: bool = True) -> tuple[int, int]:
        """A new experiment, its branch made (unless not `pushed`: bot.github.branches), its candidate
        run queued: (experiment id, run id)."""
        store = self.store
        exp = store.experiments.start_proposing(self.main)
        asset = f"lr = 0.{i:03d}\n"
        store.experiments.fill_proposal(
            exp.id, title=f"change {i}", hypothesis="h", slug=f"change-{i}", code_hash=f"c{i}", asset=asset, meta={}
        )
        head = None
        if pushed:
            head = self.forge.create_branch(f"autoresearch/{exp.id}-change-{i}", self.main, {"train.py": asset}, "c")
        store.experiments.update(exp.id, state=State.BRANCHED, head_sha=head)
        run = store.runs.add(
            experiment_id=exp.id,
            purpose="candidate",
            code_hash=f"c{i}",
            commit_sha=head or "",
            base_sha=self.main,
            asset=asset,
            profile="smoke",
            experiment_fields={"state": State.MEASURING},
        )
        return exp.id, run.id

    def finish(self, exp_id: int, run_id: int, status: str, val_bpb: float) -> None:
        self.store.runs.finish(run_id, status="ok", val_bpb=val_bpb, metrics={}, error=None, log_tail="done")
        self.store.experiments.update(
            exp_id, state=State.CLOSING, status=status, val_bpb=val_bpb, delta=val_bpb - 2.0, margin=0.01, reason=status
        )
        self.store.experiments.update(exp_id, state=State.DONE)

    def publish(self, budget_s: float = 300.0) -> None:
        self.publisher.publish(Snapshot(main_sha="", main_val_bpb=2.0, margin=0.01, progress={}, budget_s=budget_s))

    def write_times(self) -> list[float]:
        """When each content-creating request the stand-in served was charged (the last stamp before it)."""
        times, stamp = [], 0
        for index, request in enumerate(self.gh.requests):
            while stamp + 1 < len(self.stamps) and self.stamps[stamp + 1][0] <= index:
                stamp += 1
            if request.created:
                times.append(self.stamps[stamp][1])
        return times


def lab(tmp_path: Path, limits: tuple[tuple[float, int], ...] | None) -> Iterator[Lab]:
    with GitHubStandIn(
        tmp_path / "github", files={"train.py": "lr = 0.01\n"}, token_users={"tok": BOT}, collaborators={}
    ) as gh:
        yield Lab(gh, tmp_path, limits)
        assert gh.violations == []


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[Lab]:
    yield from lab(tmp_path, LIMITS)


@pytest.fixture
def unbounded(tmp_path: Path) -> Iterator[Lab]:
    yield from lab(tmp_path, None)


def test_a_short_runs_check_is_made_once_in_its_final_state(unbounded: Lab) -> None:
    exp_id, run_id = unbounded.experiment(1)
    unbounded.publish()
    unbounded.store.runs.mark_started(run_id, "fake://1")
    unbounded.publish()
    assert unbounded.gh.check_runs() == []  # a 5-minute run: nothing while it trains
    unbounded.finish(exp_id, run_id, "discard", 2.1)
    unbounded.publish()
    [check] = unbounded.gh.check_runs()
    assert check["status"] == "completed" and check["conclusion"] == "neutral"
    assert unbounded.gh.calls("PATCH", r"/check-runs/\d+$") == []
    writes = [r.operation for r in unbounded.gh.requests if r.created]
    # once: the verdict's and the log's labels, the log
    once = ["issues/create-label", "issues/create-label", "issues/create"]
    assert sorted(writes) == sorted(
        [*once, "git/create-ref", "repos/create-or-update-file-contents", "pulls/create", "checks/create"]
        + ["issues/create-comment", "issues/update"]
    )  # the experiment's 6: branch 2, pull request, check run, decision comment, label and close


def test_a_bound_budget_degrades_keeps_every_window_and_shows_each_experiment_once(bound: Lab) -> None:
    shown_on_pull: set[int] = set()
    modes = []
    for i in range(1, 31):  # one experiment a minute: 2 writes for its branch, 4 more to show it in full
        exp_id, run_id = bound.experiment(i)
        bound.publish()
        if i % 5 == 0:  # the judge asks to confirm it: promising
            bound.store.runs.add(
                experiment_id=exp_id,
                purpose="confirm",
                code_hash=f"c{i}",
                commit_sha=bound.store.experiments.get(exp_id).head_sha or "",
                base_sha=bound.main,
                asset="",
                profile="smoke",
            )
            shown_on_pull.add(exp_id)
        bound.publish()
        bound.finish(exp_id, run_id, "keep" if i % 10 == 0 else "discard", 1.9 if i % 10 == 0 else 2.1)
        bound.publish()
        modes.append(bound.store.writes.mode.mode)
        bound.clock.now += 60.0
    assert modes[0] == "degraded" and set(modes) == {"degraded"}  # 6 writes a minute in full: over 90% of 40 / 600 s
    bound.clock.now += 3600.0  # quiet: full again, and what waited for a batch is posted
    bound.publish()
    assert bound.store.writes.mode.mode == "full"
    times = bound.write_times()
    assert len(times) == len(bound.stamps)  # every write the stand-in served was charged, once
    for window, most in LIMITS:
        busiest = max(sum(1 for t in times if start - window < t <= start) for start in times)
        assert busiest <= most, f"{busiest} writes in {window:.0f} s"

    pulls = bound.gh.pulls()
    on_pull = {int(re.match(r"autoresearch/(\d+)-", p["head"]["ref"])[1]) for p in pulls}
    assert len(pulls) == len(on_pull) and on_pull == shown_on_pull
    [log] = bound.gh.issues()
    batches = [
        [int(line.split("|")[1]) for line in comment["body"].splitlines() if re.match(r"\| \d+ \|", line)]
        for comment in bound.gh.comments(log["number"])
    ]
    assert all(0 < len(batch) <= BATCH for batch in batches)
    rows = [exp_id for batch in batches for exp_id in batch]
    assert sorted(rows) == sorted(set(range(1, 31)) - on_pull)  # each of the rest once
    assert bound.store.published.behind() == []


def test_a_keep_merged_before_its_pull_request_is_listed_once_with_its_check(bound: Lab) -> None:
    exp_id, run_id = bound.experiment(1)  # degraded from the first branch on (as above): no pull request yet
    bound.publish()
    branch = bound.store.experiments.get(exp_id).branch or ""
    bound.forge.merge(branch, bound.main, "kept")  # main moves in the tick that keeps it
    bound.finish(exp_id, run_id, "keep", 1.9)
    bound.publish()
    bound.clock.now += 3600.0
    bound.publish()
    assert bound.gh.pulls() == []  # GitHub refuses a pull request for a branch main holds
    [check] = bound.gh.check_runs()
    assert check["head_sha"] == bound.gh.ref("heads/main") and check["conclusion"] == "success"
    [log] = bound.gh.issues()
    [summary] = bound.gh.comments(log["number"])
    assert f"| {exp_id} | change 1 | keep |" in summary["body"]
    assert bound.store.published.behind() == []


@pytest.mark.parametrize("limits", [None, LIMITS], ids=["full", "bound"])
def test_an_experiment_never_pushed_is_listed_once_with_its_diff_in_any_mode(tmp_path: Path, limits) -> None:
    for the in lab(tmp_path, limits):
        exp_id, run_id = the.experiment(1, pushed=False)
        the.store.runs.mark_started(run_id, "fake://1")
        the.publish()  # in flight without a branch: nothing can show it yet
        the.finish(exp_id, run_id, "discard", 2.1)
        the.publish()
        the.clock.now += EVERY_S + 1
        the.publish()
        assert the.gh.pulls() == [] and the.gh.check_runs() == []
        assert the.gh.calls("POST", r"/pulls$") == []  # never tried: GitHub would refuse a missing branch
        [log] = the.gh.issues()
        [summary] = the.gh.comments(log["number"])
        body = summary["body"]
        assert f"| {exp_id} | change 1 | discard |" in body and "| no branch: below |" in body
        assert f"<summary>Experiment {exp_id}: its change</summary>" in body
        assert "```diff\n--- a/train.py\n+++ b/train.py\n" in body and "-lr = 0.01\n+lr = 0.001\n" in body
        assert the.store.published.behind() == []


def test_a_long_change_is_cut_and_a_fence_in_it_cannot_close_its_block(tmp_path: Path) -> None:
    asset = "".join(f"x{i} = {i}  # ``` a fence in a comment\n" for i in range(500))
    diff = change_diff("", asset, "train.py")
    assert len(diff) < DIFF_CHARS + 200 and diff.endswith("the bot's store keeps the whole file)\n")
    store = Store(tmp_path / "state.db")
    exp = store.experiments.start_proposing("0" * 40)
    store.experiments.fill_proposal(exp.id, title="t", hypothesis="h", slug="t", code_hash="c", asset=asset, meta={})
    exp = store.experiments.update(exp.id, state=State.DONE, status="discard", val_bpb=2.1, delta=0.1, reason="r")
    body = summary_comment(1, [exp], TRAINING.metric, "https://github.com/o/r", {exp.id: diff})
    assert "\n````diff\n" in body and body.endswith("\n````\n\n</details>")  # longer than any fence inside


def test_a_stop_while_a_write_waits_for_room_ends_the_pass_as_stopped_not_as_a_failure(bound: Lab) -> None:
    for i in range(1, 4):
        bound.experiment(i)
    assert bound.budget is not None
    for _ in range(LIMITS[0][1]):  # the research's own writes take the minute's room
        bound.budget.charge("branch")
    bound.budget.stop.set()  # the service stops while the publisher would wait
    with pytest.raises(WriteBudgetStopped):
        bound.publish()
    worker = PublishWorker([bound.publisher], bound.store)
    worker.hand_over(Snapshot(main_sha="", main_val_bpb=2.0, margin=0.01, progress={}, budget_s=300.0))
    assert worker.flush(30.0)
    worker.close()
    assert [e for e in bound.store.events.all() if e["kind"] == "error"] == []  # logged, not recorded
