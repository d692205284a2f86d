"""The research log against the stand-in: one issue, created once and found again (after a lost
answer, after a restart, after a lost store), its body edited in place only when the summary
changed and at most once per interval unless a change was kept, and a closed log left closed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.core.states import State
from bot.github import render
from bot.github.research_log import LABEL, TITLE, ResearchLog, log_body
from bot.store import Store
from bot.views.research_log import Facts, Kept, content_digest

BOT = "autoresearch-bot[bot]"
EVERY_S = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    standin: GitHubStandIn
    store: Store
    repo: object
    clock: Clock
    main: str
    writes: list[str] = field(default_factory=list)

    def log(self, store: Store | None = None) -> ResearchLog:
        """A ResearchLog as a fresh process makes it (nothing kept in memory between them)."""
        return ResearchLog(
            store or self.store,
            self.repo,
            pace_write=lambda what: self.writes.append("w"),
            clock=self.clock,
            every_s=EVERY_S,
        )

    def keep(self, title: str, val_bpb: float, pull: int | None = None) -> int:
        """An experiment that ran, was kept, and (with `pull`) was shown as that pull request."""
        store = self.store
        exp = store.experiments.start_proposing(self.main)
        store.experiments.fill_proposal(
            exp.id,
            title=title,
            hypothesis="h",
            slug=f"exp-{exp.id}",
            code_hash=f"c{exp.id}",
            asset=f"# {title}\n",
            meta={},
        )
        store.experiments.update(exp.id, state=State.BRANCHED, head_sha="b" * 40)
        store.experiments.update(exp.id, state=State.MEASURING)
        store.experiments.update(
            exp.id,
            state=State.CLOSING,
            status="keep",
            val_bpb=val_bpb,
            delta=val_bpb - 1.0,
            margin=0.01,
            reason="keep: better",
        )
        store.experiments.update(exp.id, state=State.DONE)
        if pull is not None:
            store.published.set(exp.id, "pr", str(pull))
        return exp.id

    def start(self, title: str) -> tuple[int, int]:
        """An experiment whose candidate run is training now: (experiment id, run id)."""
        store = self.store
        exp = store.experiments.start_proposing(self.main)
        store.experiments.fill_proposal(
            exp.id,
            title=title,
            hypothesis="h",
            slug=f"exp-{exp.id}",
            code_hash=f"c{exp.id}",
            asset=f"# {title}\n",
            meta={},
        )
        store.experiments.update(exp.id, state=State.BRANCHED, head_sha="c" * 40)
        run = store.runs.add(
            experiment_id=exp.id,
            purpose="candidate",
            code_hash=f"c{exp.id}",
            commit_sha="c" * 40,
            base_sha=self.main,
            asset=f"# {title}\n",
            profile="smoke",
            experiment_fields={"state": State.MEASURING},
        )
        store.runs.mark_started(run.id, "fake://1")
        return exp.id, run.id

    def issue(self) -> dict:
        [issue] = self.standin.issues()
        return issue

    def edits(self) -> int:
        return len(self.standin.calls("PATCH", r"/issues/\d+$"))

    def creates(self) -> int:
        return len(self.standin.calls("POST", r"/issues$"))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with GitHubStandIn(
        tmp_path / "github",
        files={"train.py": "lr = 0.01\n"},
        token_users={"tok": BOT},
        collaborators={"researcher": "admin"},
    ) as gh:
        repo = github.Github(
            auth=github.Auth.Token("tok"),
            base_url=gh.api_url,
            retry=None,
            seconds_between_requests=None,
            seconds_between_writes=None,
        ).get_repo("octo-org/research")
        store = Store(tmp_path / "state.db")
        store.state.bot_login = BOT  # as bot.app.serve writes it when it connects
        main = gh.ref("heads/main") or ""
        run = store.runs.add(
            experiment_id=None,
            purpose="baseline",
            code_hash="main",
            commit_sha=main,
            base_sha=main,
            asset="lr = 0.01\n",
            profile="smoke",
        )
        store.runs.finish(run.id, status="ok", val_bpb=1.0, metrics={}, error=None, log_tail=None)
        yield World(gh, store, repo, Clock(), main)
        assert gh.violations == []


def test_the_log_is_created_once_and_edited_in_place_when_a_change_is_kept(world: World) -> None:
    world.log().update()
    issue = world.issue()
    assert issue["title"] == TITLE and [x["name"] for x in issue["labels"]] == [LABEL.name]
    assert render.find_marker(issue["body"]) == ("log", 0, "") and "No change has been kept yet." in issue["body"]
    world.clock.now += 1  # an experiment finishing is shown at once, however soon after the last edit
    world.keep("raise the learning rate", 0.98, pull=7)
    world.store.state.spent_usd = 1.25
    world.log().update()
    body = world.issue()["body"]
    assert "raise the learning rate" in body and "#7" in body and "-0.020000" in body
    assert "**0.980000** (experiment 1, #7)" in body and "(-2.00%) from 1.000000" in body
    assert "1 finished: 1 kept, 0 discarded, 0 crashed" in body and "$1.25" in body
    assert len(world.standin.issues()) == 1 and world.creates() == 1 and world.edits() == 1
    assert len(world.writes) == 3  # the label, the issue, one edit: each write paced
    assert world.store.state.research_log["number"] == world.issue()["number"]


def test_an_unchanged_summary_is_not_written_again(world: World) -> None:
    world.log().update()
    requests = len(world.standin.requests)
    for _ in range(3):
        world.clock.now += 2 * EVERY_S
        world.log().update()
    assert world.edits() == 0 and len(world.standin.requests) == requests  # not even a read


def test_a_busy_run_edits_at_most_once_per_interval(world: World) -> None:
    world.log().update()
    assert "Nothing is running." in world.issue()["body"]
    exp_id, run_id = world.start("deeper model")
    for spent in (0.10, 0.20, 0.30):  # the agent spends, a run trains: no experiment finishes
        world.clock.now += EVERY_S / 4
        world.store.state.spent_usd = spent
        world.log().update()
    assert world.edits() == 0
    world.clock.now += EVERY_S
    world.log().update()
    body = world.issue()["body"]
    assert world.edits() == 1 and "$0.30" in body and "1 in progress" in body
    assert f"- Experiment {exp_id} *deeper model*: candidate run {run_id}, since " in body


def test_discarded_experiments_wait_for_the_interval_and_a_kept_change_does_not(world: World) -> None:
    world.log().update()
    for _ in range(3):  # experiments that finish without a kept change: their counts wait
        world.clock.now += 1
        exp_id = world.keep("a worse idea", 1.1)
        world.store.experiments.update(exp_id, status="discard")
        world.log().update()
    assert world.edits() == 0
    world.clock.now += 1
    world.keep("a better idea", 0.9)
    world.log().update()
    assert world.edits() == 1 and "4 finished: 1 kept, 3 discarded" in world.issue()["body"]


def test_a_lost_answer_to_the_create_makes_no_second_issue(world: World) -> None:
    world.standin.inject("POST", r"/issues$", "502", apply_first=True)
    with pytest.raises(github.GithubException):
        world.log().update()
    world.log().update()
    world.log().update()
    assert len(world.standin.issues()) == 1 and world.creates() == 1
    assert world.edits() == 0  # found by its marker with the same summary: nothing to write


def test_a_restart_finds_the_log_again_without_creating_it(world: World, tmp_path: Path) -> None:
    world.log().update()
    number = world.issue()["number"]
    requests = len(world.standin.requests)
    world.log().update()  # a restart with its store: the number is known, nothing is asked
    assert len(world.standin.requests) == requests
    lost = Store(tmp_path / "lost.db")  # a restart without it: one search by label and marker
    lost.state.spent_usd = 2.50
    lost.state.bot_login = BOT
    world.log(lost).update()
    assert [r.operation for r in world.standin.requests[requests:]] == ["issues/list-for-repo", "issues/update"]
    assert world.creates() == 1
    assert world.edits() == 1 and "$2.50" in world.issue()["body"]
    assert lost.state.research_log["number"] == number


def test_a_persons_issue_quoting_the_marker_is_not_taken_for_the_log(world: World) -> None:
    world.standin.open_issue("someone", "the log is wrong", f"It says:\n{render.marker('log', 0)}\n...")
    world.log().update()
    [log] = [i for i in world.standin.issues() if i["user"]["login"] == BOT]
    assert len(world.standin.issues()) == 2 and world.creates() == 1 and log["title"] == TITLE


def test_a_closed_log_stays_closed_but_its_body_is_updated(world: World) -> None:
    world.log().update()
    world.standin.close_issue(world.issue()["number"], "researcher", "not_planned")
    world.clock.now += 1
    world.keep("wider MLP", 0.97, pull=9)
    world.log().update()
    issue = world.issue()
    assert issue["state"] == "closed" and issue["state_reason"] == "not_planned"
    assert "wider MLP" in issue["body"] and "#9" in issue["body"]


def test_a_deleted_log_is_opened_again(world: World) -> None:
    world.log().update()
    world.standin.delete_issue(world.issue()["number"])  # by an admin: GitHub answers 410 Gone
    world.keep("wider MLP", 0.97)
    world.log().update()
    assert [r.status for r in world.standin.calls("PATCH", r"/issues/\d+$")] == [410]
    assert world.creates() == 2 and "wider MLP" in world.issue()["body"]


def test_the_body_keeps_github_limits_however_many_changes_are_kept() -> None:
    title = "<!-- autoresearch:log:0 --> a long title " + "é" * 300
    kept = [Kept(i, title, 1.0 - i * 1e-4, -1e-4, None, 1000 + i) for i in range(1, 2001)]
    facts = Facts(
        baseline=1.0,
        kept=kept,
        finished={"keep": 2000},
        in_progress=1,
        finished_last_day=48,
        spent_usd=12.5,
        running=[],
        queued=2,
    )
    body = log_body(facts, now=0.0)
    assert len(body.encode()) <= 65_536 and body.count("<!-- autoresearch:") == 1
    assert "| 2000 |" in body and "| 1 |" not in body and "kept changes are not listed" in body
    assert "48 finished in the last 24 h (2.00 per hour)" in body
    assert content_digest(body) == content_digest(log_body(facts, now=3600.0))  # the time is not content


def test_a_persons_labelled_issue_with_the_marker_is_not_taken_for_the_log(world: World) -> None:
    world.standin.open_issue("researcher", "fake log", f"{render.marker('log', 0)}\nall is well", labels=[LABEL.name])
    world.log().update()
    [log] = [i for i in world.standin.issues() if i["user"]["login"] == BOT]
    assert world.creates() == 1 and log["title"] == TITLE
    assert world.store.state.research_log["number"] == log["number"]
