"""The publisher against the stand-in: what GitHub shows of one experiment as its state changes,
progress paced to one update per 120 s, no label until the verdict, commit statuses when the bot
has a token and not an App, and nothing shown twice however often it runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.core.protocols import Snapshot
from bot.core.router import Router
from bot.core.states import State
from bot.github import render
from bot.github.budget import WriteBudget
from bot.github.forge import GitHubForge
from bot.github.handlers import GitHubEvents
from bot.github.permissions import CollaboratorPermissions
from bot.github.publisher import CHECK_NAME, GitHubPublisher, check_name, pull_request_first
from bot.github.replies import REPLY_TRIES
from bot.loop import inbox
from bot.loop.inbox import apply_inbox
from bot.store import Store
from bot.store.writes import WriteMode
from runner.tasks import TRAINING

TRAIN = "lr = 0.01\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    standin: GitHubStandIn
    store: Store
    publisher: GitHubPublisher
    clock: Clock
    exp_id: int
    run_id: int
    budget_s: float = 1800.0  # a long run: its check shows it in progress (a short run's is made at its end)

    def publish(self, **progress: object) -> None:
        self.publisher.publish(
            Snapshot(
                main_sha="",
                main_val_bpb=2.0,
                margin=0.01,
                progress={self.run_id: dict(progress)} if progress else {},
                budget_s=self.budget_s,
            )
        )


def world_for(tmp_path: Path, token_user: str) -> Iterator[World]:
    with GitHubStandIn(
        tmp_path / "github",
        files={"train.py": TRAIN},
        token_users={"tok": token_user},
        collaborators={"researcher": "admin"},
    ) as gh:
        repo = github.Github(
            auth=github.Auth.Token("tok"),
            base_url=gh.api_url,
            retry=None,
            seconds_between_requests=None,
            seconds_between_writes=None,
        ).get_repo("octo-org/research")
        forge = GitHubForge(repo)
        main = forge.main_sha()
        store = Store(tmp_path / "state.db")
        exp = store.experiments.start_proposing(main)
        store.experiments.fill_proposal(
            exp.id,
            title="higher lr",
            hypothesis="faster",
            slug="higher-lr",
            code_hash="c1",
            asset="lr = 0.02\n",
            meta={},
        )
        head = forge.create_branch("autoresearch/1-higher-lr", main, {"train.py": "lr = 0.02\n"}, "higher lr")
        store.experiments.update(exp.id, state=State.BRANCHED, head_sha=head)
        run = store.runs.add(
            experiment_id=exp.id,
            purpose="candidate",
            code_hash="c1",
            commit_sha=head,
            base_sha=main,
            asset="lr = 0.02\n",
            profile="smoke",
            experiment_fields={"state": State.MEASURING},
        )
        store.state.bot_login = token_user  # as bot.app.serve writes it when it connects
        clock = Clock()
        publisher = GitHubPublisher(
            store, repo, read_file=forge.read_file, uses_app=token_user.endswith("[bot]"), clock=clock
        )
        yield World(gh, store, publisher, clock, exp.id, run.id)
        assert gh.violations == []


@pytest.fixture
def app_world(tmp_path: Path) -> Iterator[World]:
    yield from world_for(tmp_path, "autoresearch-bot[bot]")


@pytest.fixture
def token_world(tmp_path: Path) -> Iterator[World]:
    yield from world_for(tmp_path, "researcher")


def finish(world: World, status: str, val_bpb: float) -> None:
    store = world.store
    store.runs.finish(
        world.run_id, status="ok", val_bpb=val_bpb, metrics={"num_steps": 100}, error=None, log_tail="step 100 loss 3.2"
    )
    store.experiments.update(
        world.exp_id,
        state=State.CLOSING,
        status=status,
        val_bpb=val_bpb,
        delta=val_bpb - 2.0,
        margin=0.01,
        reason=f"{status}: numbers",
    )
    store.experiments.update(world.exp_id, state=State.DONE)


def test_progress_updates_the_check_at_most_every_120_seconds(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    world.store.runs.mark_started(world.run_id, "fake://1")
    world.publish(step=10, loss=4.1, progress=0.1)
    patches = len(gh.calls("PATCH", r"/check-runs/\d+$"))
    for step in (20, 30, 35):
        world.clock.now += 30
        world.publish(step=step, loss=3.9, progress=step / 100)
    assert len(gh.calls("PATCH", r"/check-runs/\d+$")) == patches  # too soon: 90 s
    world.clock.now += 30
    world.publish(step=40, loss=3.7, progress=0.4)
    assert len(gh.calls("PATCH", r"/check-runs/\d+$")) == patches + 1
    [check] = gh.check_runs()
    assert check["status"] == "in_progress" and "40" in check["output"]["title"]


def test_a_finished_experiment_is_shown_once_however_often_it_is_published(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    finish(world, "discard", 2.1)
    for _ in range(3):
        world.publish()
    [pull] = gh.pulls()
    assert pull["state"] == "closed" and gh.labels(pull["number"]) == ["autoresearch: discarded"]
    [check] = [c for c in gh.check_runs() if c["name"] == CHECK_NAME]
    assert check["conclusion"] == "neutral" and check["output"]["title"].startswith("val_bpb 2.10000")
    assert len(gh.comments(pull["number"])) == 1
    assert world.store.published.behind() == []


def test_a_lost_answer_creates_nothing_twice(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    gh.inject("POST", r"/pulls$", "502", apply_first=True)
    with pytest.raises(RuntimeError):
        world.publish()
    world.publish()
    finish(world, "keep", 1.9)
    gh.inject("POST", r"/issues/\d+/comments$", "502", apply_first=True)
    gh.inject("POST", r"/check-runs$", "502", apply_first=True)
    with pytest.raises(RuntimeError):
        world.publish()
    world.publish()
    world.publish()
    [pull] = gh.pulls()
    assert len(gh.comments(pull["number"])) == 1
    assert len([c for c in gh.check_runs() if c["name"] == CHECK_NAME]) == 1


def test_with_a_token_the_verdict_is_a_commit_status(token_world: World) -> None:
    gh, world = token_world.standin, token_world
    world.publish()
    finish(world, "keep", 1.9)
    world.publish()
    head = world.store.experiments.get(world.exp_id).head_sha
    statuses = gh.statuses(head)  # oldest first
    assert [s["state"] for s in statuses] == ["pending", "success"] and statuses[-1]["context"] == CHECK_NAME
    assert all(len(s["description"]) <= 140 for s in statuses)
    assert gh.check_runs() == []


ACCURACY_LOOP = {"task": "ticket-routing", "profile": "smoke", "harness_hash": "h", "data_fingerprint": "d"}


def finish_accuracy(world: World, status: str, accuracy: float, main: float) -> None:
    """A ticket-routing verdict, its numbers as the store holds them: accuracy's loss, its negation."""
    world.store.runs.finish(world.run_id, status="ok", val_bpb=-accuracy, metrics={}, error=None, log_tail="")
    world.store.experiments.update(
        world.exp_id,
        state=State.CLOSING,
        status=status,
        val_bpb=-accuracy,
        delta=main - accuracy,
        margin=0.01,
        reason="judged",
        meta={"main_val_bpb": -main},
    )
    world.store.experiments.update(world.exp_id, state=State.DONE)


def test_trainings_check_keeps_the_name_it_had_before_tasks() -> None:
    """A repository's branch protection may require the check by name."""
    assert CHECK_NAME == check_name(TRAINING.metric) == "autoresearch / val_bpb"


def test_a_higher_is_better_tasks_check_pr_and_comment_speak_its_metric(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.store.state.identity = ACCURACY_LOOP
    world.publish()
    finish_accuracy(world, "keep", 0.85, main=0.80)
    world.publish()
    assert {c["name"] for c in gh.check_runs()} == {"autoresearch / accuracy"}
    [check] = gh.check_runs()
    assert check["output"]["title"] == "accuracy 0.85000 (+0.05000 vs main, noise margin 0.01000): kept"
    summary = check["output"]["summary"]
    assert "| accuracy | 0.850000 |" in summary and "| main | 0.800000 |" in summary
    assert "| Δ vs main | +0.050000 |" in summary and "val_bpb" not in summary
    [pull] = gh.pulls()
    assert "`router.py`: **+1" in pull["body"] and "one more run of this router.py" in pull["body"]
    assert "train.py" not in pull["body"] and "val_bpb" not in pull["body"]
    [comment] = [c["body"] for c in gh.comments(pull["number"]) if "autoresearch:decision" in c["body"]]
    assert "| accuracy | 0.850000 |" in comment and "| Δ vs main | +0.050000 |" in comment


def test_with_a_token_a_tasks_status_is_named_after_its_metric(token_world: World) -> None:
    gh, world = token_world.standin, token_world
    world.store.state.identity = ACCURACY_LOOP
    world.publish()
    finish_accuracy(world, "discard", 0.79, main=0.80)
    world.publish()
    head = world.store.experiments.get(world.exp_id).head_sha
    statuses = gh.statuses(head)
    assert {s["context"] for s in statuses} == {"autoresearch / accuracy"}
    assert statuses[-1]["description"].startswith("accuracy 0.79000 (-0.01000 vs main")


def test_a_first_publish_creates_without_looking_first(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    before = len(gh.requests)  # the branch is the forge's
    world.publish()
    shown = [(r.method, r.operation) for r in gh.requests[before:]]
    assert shown[: shown.index(("GET", "issues/list-for-repo"))] == [  # then the research log's first lookup
        ("POST", "pulls/create"),
        ("POST", "checks/create"),
    ]  # the base train.py: the forge read it for the branch
    [check] = gh.check_runs()
    assert check["status"] == "queued" and gh.labels(gh.pulls()[0]["number"]) == []  # the check shows it


def test_a_keep_waits_for_its_pull_request_in_full_mode_and_never_in_degraded_mode(app_world: World) -> None:
    world = app_world
    budget = WriteBudget(clock=world.clock)
    holds = pull_request_first(world.store, budget)
    exp = world.store.experiments.get(world.exp_id)
    opened: list[int] = []
    world.publisher.on_pull_request = lambda: opened.append(1)
    assert holds(exp) == "its pull request is not open yet"
    budget._save_mode(WriteMode("degraded", world.clock(), "a test's"))
    assert holds(exp) is None  # degraded: the research never waits on what people see
    budget._save_mode(WriteMode("full", world.clock(), "a test's"))
    world.publish()
    assert opened == [1] and holds(exp) is None  # open, and the conductor was told

    finish(world, "discard", 2.1)
    world.publish()  # closed with its verdict; then a person has it measured again, and it is kept
    world.store.experiments.update(world.exp_id, state=State.BRANCHED, reopened=1)
    exp = world.store.experiments.update(world.exp_id, state=State.MEASURING)
    assert holds(exp) == "its pull request is not open again yet"  # main would take it from a closed one
    world.publish()
    assert holds(exp) is None and world.standin.pulls()[0]["state"] == "open"


def test_the_verdict_is_one_edit_that_keeps_peoples_labels_and_closes_the_pull_request(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    [pull] = gh.pulls()
    gh.state.add_labels(pull["number"], ["needs a GPU"], "researcher")
    finish(world, "crash", 2.5)
    before = len(gh.requests)
    world.publish()
    writes = [r.operation for r in gh.requests[before:] if r.method != "GET" and r.operation != "issues/create-label"]
    assert writes == ["checks/update", "issues/create-comment", "issues/update"]
    [pull] = gh.pulls()
    assert pull["state"] == "closed" and gh.labels(pull["number"]) == ["needs a GPU", "autoresearch: crashed"]


def test_with_a_token_a_run_in_progress_posts_no_status_per_progress(token_world: World) -> None:
    gh, world = token_world.standin, token_world
    world.publish()
    world.store.runs.mark_started(world.run_id, "fake://1")
    for step in (10, 20, 30):
        world.clock.now += 60
        world.publish(step=step, loss=4.0, progress=step / 100)
    head = world.store.experiments.get(world.exp_id).head_sha
    assert len(gh.statuses(head)) <= 2  # queued, then running: the progress itself shows nowhere in a status
    finish(world, "discard", 2.1)
    world.publish()
    assert gh.statuses(head)[-1]["state"] == "success"


def test_an_experiment_measured_again_loses_its_verdict_label_until_the_new_verdict(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    finish(world, "discard", 2.1)
    world.publish()
    [pull] = gh.pulls()
    gh.state.add_labels(pull["number"], ["needs a GPU"], "researcher")
    world.store.experiments.update(world.exp_id, state=State.BRANCHED, reopened=1)  # reopened by a person
    before = len(gh.requests)
    world.publish()
    assert [r.operation for r in gh.requests[before:] if r.method != "GET"] == [
        "pulls/update",
        "issues/remove-label",
        "checks/create",
    ]
    [pull] = gh.pulls()
    assert pull["state"] == "open" and gh.labels(pull["number"]) == ["needs a GPU"]
    world.publish()
    finish(world, "keep", 1.9)
    world.publish()
    assert gh.labels(pull["number"]) == ["needs a GPU", "autoresearch: kept"]


def test_a_round_measured_again_and_ended_before_the_publisher_looked_is_shown(app_world: World) -> None:
    """A /rerun whose run ends, with the verdict it had, between two passes of the publisher: the
    round is shown all the same (its own check run and decision comment), from the count the
    lifecycle keeps, not from a state the publisher never saw."""
    gh, world = app_world.standin, app_world
    world.publish()
    finish(world, "discard", 2.1)
    world.publish()
    [pull] = gh.pulls()
    comments = len(gh.comments(pull["number"]))
    world.store.experiments.update(world.exp_id, state=State.BRANCHED, reopened=1)  # as the lifecycle reopens it
    finish(world, "discard", 2.12)  # and the round ends before the next pass
    world.publish()
    assert [c["external_id"].rsplit(":", 1)[1] for c in gh.check_runs()] == ["0", "1"]
    assert all(c["status"] == "completed" for c in gh.check_runs())
    assert len(gh.comments(pull["number"])) == comments + 1  # the round's decision
    assert world.store.published.behind() == []
    before = len(gh.requests)
    world.publish()
    assert [r for r in gh.requests[before:] if r.method != "GET"] == []  # shown once


# --- only the bot's own content is the bot's: markers, replies ---------------------------------------


def test_a_persons_comment_with_the_bots_decision_marker_is_not_adopted(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    number = gh.pulls()[0]["number"]
    finish(world, "keep", 1.9)
    gh.inject("POST", r"/issues/\d+/comments$", "502")  # the bot's decision comment is not made
    with pytest.raises(RuntimeError):
        world.publish()
    gh.comment(number, "mallory", f"{render.marker('decision', world.exp_id, 'discard')}\nclosing this")
    world.publish()
    decisions = [c for c in gh.comments(number) if c["user"]["login"] == "autoresearch-bot[bot]"]
    assert len(decisions) == 1 and "Kept" in decisions[0]["body"]
    assert world.store.published.get(world.exp_id)["comment:decision:0"] == str(decisions[0]["id"])


def test_a_reply_that_cannot_be_posted_is_given_up_and_the_rest_go_on(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    number = gh.pulls()[0]["number"]
    command = gh.comment(number, "researcher", "/rerun")
    world.store.replies.add(424242, 9999, render.ack_comment("pause", "", "paused", 424242))  # no issue #9999 here
    world.store.replies.add(command, number, render.ack_comment("rerun", "", "measured once more", command))
    world.publish()
    assert world.store.replies.pending() == []
    assert [c["body"] for c in gh.comments(number) if c["user"]["login"] == "autoresearch-bot[bot]"] == [
        render.ack_comment("rerun", "", "measured once more", command)
    ]
    assert any("given up" in e["message"] and "9999" in e["message"] for e in world.store.events.all())


def test_a_reply_failing_on_githubs_side_is_tried_a_bounded_number_of_times(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    number = gh.pulls()[0]["number"]
    command = gh.comment(number, "researcher", "/rerun")
    world.store.replies.add(command, number, render.ack_comment("rerun", "", "measured once more", command))
    gh.inject("POST", r"/issues/\d+/comments$", "502", times=REPLY_TRIES)
    for _ in range(REPLY_TRIES):
        with pytest.raises(RuntimeError, match="reply to comment"):
            world.publish()
    assert world.store.replies.pending() == []
    world.publish()  # given up: not tried again
    assert [r.status for r in gh.calls("POST", r"/issues/\d+/comments$")] == [502] * REPLY_TRIES


def test_a_persons_comment_with_the_bots_ack_marker_does_not_stand_for_the_reply(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    number = gh.pulls()[0]["number"]
    command = gh.comment(number, "researcher", "/rerun")
    gh.comment(number, "mallory", f"{render.marker('ack', command)}\nsure, done")
    world.store.replies.add(command, number, render.ack_comment("rerun", "", "measured once more", command))
    world.publish()
    assert [
        c["user"]["login"] for c in gh.comments(number) if (render.find_marker(c["body"]) or ("",))[0] == "ack"
    ] == ["mallory", "autoresearch-bot[bot]"]


def test_a_pull_request_closed_while_away_goes_through_the_same_permission_check(app_world: World) -> None:
    gh, world = app_world.standin, app_world
    world.publish()
    number = gh.pulls()[0]["number"]
    gh.state.collaborators["tom"] = "triage"
    gh.close_pr(number, "tom")  # its webhook found nobody listening
    restarted = GitHubPublisher(
        world.store, world.publisher.repo, read_file=world.publisher.read_file, uses_app=True, clock=world.clock
    )
    world.publisher = restarted
    world.publish()
    [entry] = [e for e in world.store.inbox.all() if e.key.startswith("github:reconcile-pr-")]
    events = GitHubEvents(
        "octo-org/research", CollaboratorPermissions.for_repository(restarted.repo), loop=inbox.router
    )
    apply_inbox(world.store, Router(inbox.router, events.router()))
    assert "triage role" in (world.store.inbox.all()[0].outcome or "")
    assert world.store.experiments.get(world.exp_id).request is None
    world.publish()  # judged already: the experiment is shown as usual, nothing stored twice
    assert len([e for e in world.store.inbox.all() if e.key == entry.key]) == 1
