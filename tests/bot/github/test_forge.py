"""The GitHub forge against the stand-in: a branch made with two writes (its ref at the base, then
PUT contents), idempotent on retry and after a crash between or during them, rebased by a 3-way
merge of train.py (Git Data API), and main moved only by a fast-forward that GitHub refuses when
main has moved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import github
import pytest
from github_standin import GitHubStandIn

from bot.core.protocols import ForgeError, MainMoved, MergeConflict
from bot.github.client import GitHubRetry
from bot.github.forge import GitHubForge

TRAIN = "".join(f"line {i}\n" for i in range(20))
FILES = {"train.py": TRAIN, "program.md": "# Program\n"}
BRANCH = "autoresearch/1-change"


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[GitHubStandIn]:
    with GitHubStandIn(
        tmp_path / "github",
        files=FILES,
        token_users={"tok-bot": "autoresearch-bot[bot]"},
        collaborators={"alice": "write"},
    ) as gh:
        yield gh
        assert gh.violations == []


def new_forge(standin: GitHubStandIn, retry: GitHubRetry | None = None) -> GitHubForge:
    """A forge as a freshly started process has it: nothing learnt yet."""
    gh = github.Github(
        auth=github.Auth.Token("tok-bot"),
        base_url=standin.api_url,
        retry=retry,
        seconds_between_requests=None,
        seconds_between_writes=None,
    )
    return GitHubForge(gh.get_repo("octo-org/research"))


@pytest.fixture
def forge(standin: GitHubStandIn) -> GitHubForge:
    return new_forge(standin)


def writes(standin: GitHubStandIn, since: int = 0) -> list[str]:
    return [r.operation for r in standin.requests[since:] if r.method != "GET"]


def commits_on(standin: GitHubStandIn, branch: str, main: str) -> list[str]:
    return standin.state.repo.rev_list(f"{main}..refs/heads/{branch}")


def changed(line: int, text: str) -> str:
    lines = TRAIN.splitlines(keepends=True)
    lines[line] = text + "\n"
    return "".join(lines)


def test_a_branch_is_one_commit_on_its_base_and_a_retry_changes_nothing(
    forge: GitHubForge, standin: GitHubStandIn
) -> None:
    main = forge.main_sha()
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider\n\nhypothesis")
    assert forge.read_file(head, "train.py") == changed(3, "wider")
    assert forge.read_file(head, "program.md") == "# Program\n"
    assert writes(standin) == ["git/create-ref", "repos/create-or-update-file-contents"]
    before = len(standin.requests)
    assert forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider\n\nhypothesis") == head
    assert new_forge(standin).create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider") == head
    assert writes(standin, before) == []
    assert forge.branch_head(BRANCH) == head and forge.list_branches() == [BRANCH]
    assert commits_on(standin, BRANCH, main) == [head] and forge.main_sha() == main


def test_the_commit_carries_the_message_and_author_and_the_asset_byte_for_byte(
    forge: GitHubForge, standin: GitHubStandIn
) -> None:
    main = forge.main_sha()
    asset = changed(3, "λ = 0.5  # ünïcode, a tab\there, CRLF next\r") + "no newline at the end"
    message = "wider λ\n\nwhy it should help\n\nautoresearch-experiment: 1"
    head = forge.create_branch(BRANCH, main, {"train.py": asset}, message)
    commit = standin.state.repo.read_commit(head)
    assert commit.message == message and commit.parents == [main]
    assert commit.author.name == commit.committer.name == "autoresearch-bot[bot]"  # the caller, as with git/commits
    entry = standin.state.repo.entry(head, "train.py")
    assert standin.state.repo.read_blob(entry.sha) == asset.encode("utf-8") and entry.mode == "100644"
    [change] = standin.state.repo.changes(main, head)
    assert change.filename == "train.py"  # program.md untouched


def test_a_lost_answer_to_the_ref_creation_does_not_fail_the_retry(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    standin.inject("POST", r"/git/refs$", "502", apply_first=True)
    with pytest.raises(github.GithubException):
        forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    assert standin.ref(f"heads/{BRANCH}") == head and commits_on(standin, BRANCH, main) == [head]


def test_a_crash_between_the_ref_and_the_put_is_finished_by_the_next_process(
    forge: GitHubForge, standin: GitHubStandIn
) -> None:
    main = forge.main_sha()
    standin.inject("PUT", r"/contents/train\.py$", "502")  # the PUT never lands (the process died before it)
    with pytest.raises(github.GithubException):
        forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    assert standin.ref(f"heads/{BRANCH}") == main  # the branch stands at its base
    before = len(standin.requests)
    head = new_forge(standin).create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    assert writes(standin, before) == ["repos/create-or-update-file-contents"]
    assert commits_on(standin, BRANCH, main) == [head] and standin.read(head, "train.py") == changed(3, "x")


def test_a_put_whose_answer_was_lost_is_not_made_twice(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    standin.inject("PUT", r"/contents/train\.py$", "502", apply_first=True)
    with pytest.raises(github.GithubException):
        forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    [made] = commits_on(standin, BRANCH, main)
    before = len(standin.requests)
    assert forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x") == made
    assert new_forge(standin).create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x") == made
    assert writes(standin, before) == [] and commits_on(standin, BRANCH, main) == [made]


def test_a_put_repeated_by_the_client_after_a_lost_answer_resolves_its_409(standin: GitHubStandIn) -> None:
    forge = new_forge(standin, GitHubRetry(total=2, backoff_factor=0, sleep=lambda s: None))
    main = forge.main_sha()
    standin.inject("PUT", r"/contents/train\.py$", "502", apply_first=True)
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "x")}, "x")
    statuses = [r.status for r in standin.calls("PUT", r"/contents/train\.py$")]
    assert statuses == [502, 409]  # the write landed; the client's repeat was refused, not applied
    assert commits_on(standin, BRANCH, main) == [head] and standin.read(head, "train.py") == changed(3, "x")


def test_a_branch_left_on_an_older_main_is_rebuilt_on_the_new_base(forge: GitHubForge, standin: GitHubStandIn) -> None:
    old_main = forge.main_sha()
    forge.create_branch(BRANCH, old_main, {"train.py": changed(3, "x")}, "x")
    new_main = standin.push_file("program.md", "# edited\n", user="alice", message="edit")
    head = new_forge(standin).create_branch(BRANCH, new_main, {"train.py": changed(3, "x")}, "x")
    assert commits_on(standin, BRANCH, new_main) == [head] and standin.ref(f"heads/{BRANCH}") == head


def test_merging_fast_forwards_main_to_the_measured_commit(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    assert forge.merge(BRANCH, main, "kept") == head
    assert forge.main_sha() == head
    assert forge.merge(BRANCH, main, "kept") == head  # a retry after the merge happened


def test_a_branch_moved_since_it_was_measured_is_not_merged(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    measured = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    # force-pushed since: another single commit on main, as a person with write access could
    other = new_forge(standin).create_branch(BRANCH, main, {"train.py": changed(3, "unmeasured")}, "x")
    assert other != measured
    with pytest.raises(ForgeError, match="since .* was measured: not merged"):
        forge.merge(BRANCH, main, "kept", measured=measured)
    assert forge.main_sha() == main


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
    before = len(standin.requests)
    assert forge.read_file(head, "train.py") == changed(15, "human").replace("line 3\n", "wider\n")
    assert len(standin.requests) == before  # the forge wrote it: known without a read
    assert forge.merge(BRANCH, new_main, "kept") == head
    assert new_forge(standin).read_file(head, "train.py") == forge.read_file(head, "train.py")  # as GitHub has it
    # the kept rebase is main now: the next proposal's branch is one commit on it (its compare-and-swap
    # takes the blob sha the forge worked out for the text it wrote)
    before = len(standin.requests)
    nxt = forge.create_branch("autoresearch/2-next", head, {"train.py": changed(9, "next")}, "next")
    assert writes(standin, before) == ["git/create-ref", "repos/create-or-update-file-contents"]
    assert "repos/get-content" not in [r.operation for r in standin.requests[before:]]
    assert standin.read("autoresearch/2-next", "train.py") == changed(9, "next") and nxt != head


@pytest.mark.parametrize("extra", [{}, {"notes.md": "why\n"}])
def test_main_after_a_keep_is_read_with_no_request_for_its_files(
    forge: GitHubForge, standin: GitHubStandIn, extra: dict[str, str]
) -> None:
    """A keep fast-forwards main to a commit this forge made; the tick that merged reads main's
    train.py and program.md at once, while the freed slots wait: the forge knows both. With a second
    file the commit is made from a tree, not by a PUT."""
    main = forge.main_sha()
    assert forge.read_file(main, "program.md") == "# Program\n"  # the conductor read main when it was main
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider"), **extra}, "wider")
    assert forge.merge(BRANCH, main, "kept", measured=head) == head
    before = len(standin.requests)
    assert forge.read_file(head, "train.py") == standin.read("main", "train.py")
    assert forge.read_file(head, "program.md") == standin.read("main", "program.md") == "# Program\n"
    assert "repos/get-content" not in [r.operation for r in standin.requests[before:]]
    # and the next proposal's compare-and-swap on it needs no read either
    before = len(standin.requests)
    forge.create_branch("autoresearch/2-next", head, {"train.py": changed(9, "next")}, "next")
    assert "repos/get-content" not in [r.operation for r in standin.requests[before:]]
    assert standin.read("autoresearch/2-next", "train.py") == changed(9, "next")


def test_a_commit_made_on_a_branch_someone_moved_is_not_remembered_as_the_base(
    forge: GitHubForge, standin: GitHubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PUT commits on the branch's head as it is then: a person who pushed program.md there
    between the branch's creation and the PUT is the new commit's parent, so its program.md is
    theirs, not the base's, and is read, never remembered from the base."""
    main = forge.main_sha()
    assert forge.read_file(main, "program.md") == "# Program\n"
    create_ref = forge._create_ref

    def created_then_moved(branch: str, sha: str) -> str | None:
        head = create_ref(branch, sha)
        standin.push_file("program.md", "# Alice's program\n", user="alice", message="alice", branch=branch)
        return head

    monkeypatch.setattr(forge, "_create_ref", created_then_moved)
    head = forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    assert forge.read_file(head, "program.md") == "# Alice's program\n" == standin.read(BRANCH, "program.md")
    assert forge.read_file(head, "train.py") == changed(3, "wider")


def test_a_branch_this_process_moved_is_rebased_without_reading_its_ref(
    forge: GitHubForge, standin: GitHubStandIn
) -> None:
    """The wave of rebases after a keep: each is its three writes, no read of the branch."""
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    new_main = standin.push_file("train.py", changed(15, "human"), user="alice", message="human change")
    forge.read_file(new_main, "train.py")  # the conductor read the new main already
    before = len(standin.requests)
    head = forge.rebase_branch(BRANCH, new_main, "train.py")
    assert "git/get-ref" not in [r.operation for r in standin.requests[before:]]
    assert writes(standin, before) == ["git/create-tree", "git/create-commit", "git/update-ref"]
    assert standin.read(BRANCH, "train.py") == changed(15, "human").replace("line 3\n", "wider\n")
    again = standin.push_file("program.md", "# edited\n", user="alice", message="edit")
    before = len(standin.requests)
    assert forge.rebase_branch(BRANCH, again, "train.py") != head  # from where this process moved it
    assert "git/get-ref" not in [r.operation for r in standin.requests[before:]]


def test_a_remembered_head_already_on_main_is_read_before_it_is_the_answer(
    forge: GitHubForge, standin: GitHubStandIn
) -> None:
    """Nothing to do, by what this forge remembers, is checked with a read: a person (or the
    conductor's own forge) may have moved the branch since, and the answer must be where it is."""
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    both = changed(3, "wider").replace("line 12\n", "alice's line\n")
    standin.push_file("train.py", both, user="alice", message="alice", branch=BRANCH)
    head = forge.rebase_branch(BRANCH, main, "train.py")  # main has not moved: by memory, nothing to do
    # the answer is where the branch is: alice's commit, made one commit on main again (as any
    # branch's last commit is carried by a rebase), never the commit this forge remembered
    assert head == standin.ref(BRANCH) and "alice's line\n" in forge.read_file(head, "train.py")


def test_a_branch_deleted_by_hand_is_no_such_branch_at_its_rebase(forge: GitHubForge, standin: GitHubStandIn) -> None:
    main = forge.main_sha()
    forge.create_branch(BRANCH, main, {"train.py": changed(3, "wider")}, "wider")
    standin.state.delete_ref(f"refs/heads/{BRANCH}", "alice")  # deleted by hand
    new_main = standin.push_file("train.py", changed(15, "human"), user="alice", message="human change")
    with pytest.raises(ForgeError, match="no such branch"):
        forge.rebase_branch(BRANCH, new_main, "train.py")


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
    assert reads == ["git/list-matching-refs", "repos/get-content"]  # the prefix once, main's train.py once
    assert writes(standin, before) == ["git/create-ref", "repos/create-or-update-file-contents"] * 2
    forge.read_file(main, "program.md")
    assert forge.merge("autoresearch/1-a", main, "kept") == first  # its parents known: no read of the commit
    assert forge.read_file(first, "train.py") == changed(1, "a")  # known from the PUT: no read either
    assert [r.operation for r in standin.requests[before:] if r.method == "GET"].count("git/get-commit") == 0
    assert [r.operation for r in standin.requests[before:] if r.method == "GET"].count("repos/get-content") == 2
