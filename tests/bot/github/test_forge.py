"""The GitHub forge against the stand-in: branches built through the Git Data API, idempotent on
retry, rebased by a 3-way merge of train.py, and main moved only by a fast-forward that GitHub
refuses when main has moved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.forge import MainMoved, MergeConflict
from bot.github.forge import GitHubForge

TRAIN = "".join(f"line {i}\n" for i in range(20))
FILES = {"train.py": TRAIN, "program.md": "# Program\n"}
BRANCH = "autoresearch/1-change"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(tmp_path / "github", files=FILES, token_users={"tok-bot": "autoresearch-bot[bot]"},
                       collaborators={"alice": "write"}) as gh:
        yield gh
        assert gh.violations == []


@pytest.fixture
def forge(standin: GitHubStandIn) -> GitHubForge:
    gh = github.Github(auth=github.Auth.Token("tok-bot"), base_url=standin.api_url, retry=None,
                       seconds_between_requests=None, seconds_between_writes=None)
    return GitHubForge(gh.get_repo("octo-org/research"))


def changed(line: int, text: str) -> str:
    lines = TRAIN.splitlines(keepends=True)
    lines[line] = text + "\n"
    return "".join(lines)


def test_a_branch_is_one_commit_on_its_base_and_a_retry_changes_nothing(forge: GitHubForge,
                                                                        standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider\n\nhypothesis")
    assert forge.read_file(head, "train.py") == changed(3, "wider")
    assert forge.read_file(head, "program.md") == "# Program\n"
    commits = len(standin.calls("POST", r"/git/commits$"))
    assert forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider\n\nhypothesis") == head
    assert len(standin.calls("POST", r"/git/commits$")) == commits
    assert forge.branch_head(BRANCH) == head and forge.list_branches() == [BRANCH]
    assert forge.main_sha() == main


def test_a_lost_answer_to_the_ref_creation_does_not_fail_the_retry(forge: GitHubForge,
                                                                   standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    standin.inject("POST", r"/git/refs$", "502", apply_first=True)
    with pytest.raises(github.GithubException):
        forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    assert standin.ref(f"heads/{BRANCH}") == head


def test_merging_fast_forwards_main_to_the_measured_commit(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    assert forge.merge(BRANCH, main, "kept") == head
    assert forge.main_sha() == head
    assert forge.merge(BRANCH, main, "kept") == head  # a retry after the merge happened


def test_a_moved_main_refuses_the_merge(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    standin.push_file("program.md", "# Program, edited\n", user="alice", message="a human edit")
    with pytest.raises(MainMoved):
        forge.merge(BRANCH, main, "kept")
    assert standin.read("main", "program.md") == "# Program, edited\n"


def test_a_rebase_carries_only_the_change_to_train_py(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    new_main = standin.push_file("train.py", changed(15, "human"), user="alice", message="human change")
    head = forge.rebase_branch(BRANCH, new_main, "train.py")
    assert forge.read_file(head, "train.py") == changed(15, "human").replace("line 3\n", "wider\n")
    assert forge.merge(BRANCH, new_main, "kept") == head


def test_a_conflicting_rebase_raises_merge_conflict(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    new_main = standin.push_file("train.py", changed(3, "narrower"), user="alice", message="human change")
    with pytest.raises(MergeConflict):
        forge.rebase_branch(BRANCH, new_main, "train.py")


def test_a_missing_file_or_branch_is_reported_as_such(forge: GitHubForge) -> None:
    with pytest.raises(FileNotFoundError):
        forge.read_file(forge.main_sha(), "no-such-file.py")
    assert forge.branch_head("autoresearch/none") is None


def test_main_is_read_with_a_conditional_request(forge: GitHubForge, standin: GitHubStandIn) -> None:
    first = forge.main_sha()
    assert forge.main_sha() == first and forge.main_sha() == first
    reads = [r.status for r in standin.calls("GET", r"/git/ref/heads/main$")]
    assert reads[-2:] == [304, 304]
    moved = standin.push_file("program.md", "# edited\n", user="alice", message="edit")
    assert forge.main_sha() == moved


def test_new_branches_cost_one_listing_and_no_read_of_their_own(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    before = len(standin.requests)
    first = forge.create_branch("autoresearch/1-a", main, {"train.py": changed(1, "a")}, "a")
    forge.create_branch("autoresearch/2-b", main, {"train.py": changed(2, "b")}, "b")
    reads = [r.operation for r in standin.requests[before:] if r.method == "GET"]
    assert reads == ["git/list-matching-refs", "git/get-commit"]  # the prefix once, main's tree once
    assert forge.merge("autoresearch/1-a", main, "kept") == first  # its parents known: no read of the commit
    assert [r.operation for r in standin.requests[before:] if r.method == "GET"].count("git/get-commit") == 1
