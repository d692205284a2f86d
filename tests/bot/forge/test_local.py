"""The local forge against real git repositories in tmp_path: branches, squash merges, rebases, closing."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from bot.core.protocols import Forge, ForgeError, MainMoved, MergeConflict
from bot.forge.local import BOT_EMAIL, BOT_NAME, LocalForge, init_research_repo

TRAIN_PY = "".join(f"SETTING_{i} = {i}\n" for i in range(1, 11))
PROGRAM_MD = "# program\nMake val_bpb go down.\n"
PREPARE_PY = "# fixed data preparation\n"


def edit_line(text: str, number: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[number - 1] = new + "\n"
    return "".join(lines)


@pytest.fixture(autouse=True)
def isolated_git_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user/system git config leaks in (identity, signing, hooks): the repo must bring its own."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    for var in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def forge(tmp_path: Path) -> LocalForge:
    return init_research_repo(
        tmp_path / "research", {"train.py": TRAIN_PY, "program.md": PROGRAM_MD, "prepare.py": PREPARE_PY}
    )


def commit_count(forge: LocalForge, ref: str = "--all") -> int:
    return int(forge.repo.git.rev_list("--count", ref))


def loose_objects(forge: LocalForge) -> int:
    stats = dict(line.split(": ", 1) for line in forge.repo.git.count_objects("-v").splitlines())
    return int(stats["count"]) + int(stats["in-pack"])


def worktree_file(forge: LocalForge, path: str = "train.py") -> str:
    return (Path(forge.repo.working_tree_dir) / path).read_text()


def test_local_forge_is_a_forge(forge: LocalForge) -> None:
    assert isinstance(forge, Forge)


def test_create_branch_makes_one_commit_on_base_and_leaves_main_alone(forge: LocalForge) -> None:
    main = forge.main_sha()
    new_train = edit_line(TRAIN_PY, 3, "SETTING_3 = 33")
    before = commit_count(forge)

    head = forge.create_branch("autoresearch/1-raise-setting-3", main, {"train.py": new_train}, "Raise SETTING_3")

    commit = forge.repo.commit(head)
    assert [p.hexsha for p in commit.parents] == [main]
    assert commit.message.strip() == "Raise SETTING_3"
    assert commit_count(forge) == before + 1
    assert forge.branch_head("autoresearch/1-raise-setting-3") == head
    assert forge.read_file("autoresearch/1-raise-setting-3", "train.py") == new_train
    assert forge.read_file(head, "program.md") == PROGRAM_MD  # the rest of base's tree is kept
    # main, HEAD, the index and the working tree are untouched
    assert forge.main_sha() == main
    assert forge.repo.head.ref.name == "main"
    assert not forge.repo.is_dirty(untracked_files=True)
    assert worktree_file(forge) == TRAIN_PY
    assert forge.read_file("main", "train.py") == TRAIN_PY


def test_create_branch_adds_new_files_and_keeps_exact_text(forge: LocalForge) -> None:
    text = "no trailing newline\r\nand a CR"
    head = forge.create_branch("autoresearch/2-notes", forge.main_sha(), {"notes/a.txt": text}, "notes")
    assert forge.read_file(head, "notes/a.txt") == text


def test_create_branch_twice_is_idempotent(forge: LocalForge) -> None:
    main = forge.main_sha()
    files = {"train.py": edit_line(TRAIN_PY, 5, "SETTING_5 = 55")}
    first = forge.create_branch("autoresearch/3-five", main, files, "Five")
    commits, objects = commit_count(forge), loose_objects(forge)
    reflog = forge.repo.git.reflog("show", "refs/heads/autoresearch/3-five").splitlines()

    second = forge.create_branch("autoresearch/3-five", main, files, "Five")

    assert second == first
    assert commit_count(forge) == commits
    assert loose_objects(forge) == objects
    assert forge.repo.git.reflog("show", "refs/heads/autoresearch/3-five").splitlines() == reflog


def test_create_branch_that_differs_is_moved_to_a_fresh_commit(forge: LocalForge) -> None:
    main = forge.main_sha()
    first = forge.create_branch("autoresearch/4-x", main, {"train.py": "A = 1\n"}, "x")
    second = forge.create_branch("autoresearch/4-x", main, {"train.py": "A = 2\n"}, "x")
    assert second != first
    assert forge.branch_head("autoresearch/4-x") == second
    assert [p.hexsha for p in forge.repo.commit(second).parents] == [main]
    assert forge.read_file("autoresearch/4-x", "train.py") == "A = 2\n"


def test_create_branch_refuses_main_and_bad_paths(forge: LocalForge) -> None:
    main = forge.main_sha()
    with pytest.raises(ForgeError):
        forge.create_branch("main", main, {"train.py": "x\n"}, "no")
    with pytest.raises(ForgeError):
        forge.create_branch("autoresearch/5-escape", main, {"../outside.py": "x\n"}, "no")
    assert forge.main_sha() == main
    assert forge.branch_head("autoresearch/5-escape") is None


def test_read_file_missing_raises_file_not_found(forge: LocalForge) -> None:
    with pytest.raises(FileNotFoundError):
        forge.read_file("main", "nope.py")
    assert forge.branch_head("autoresearch/does-not-exist") is None


def test_merge_squashes_into_main_and_updates_the_working_tree(forge: LocalForge) -> None:
    main = forge.main_sha()
    new_train = edit_line(TRAIN_PY, 2, "SETTING_2 = 22")
    head = forge.create_branch("autoresearch/6-two", main, {"train.py": new_train}, "Two")
    on_main = commit_count(forge, "main")
    (Path(forge.repo.working_tree_dir) / "scratch.txt").write_text("a person's untracked file\n")

    new_main = forge.merge("autoresearch/6-two", main, "Keep: SETTING_2 = 22 (val_bpb 1.23)")

    merged = forge.repo.commit(new_main)
    assert forge.main_sha() == new_main
    assert commit_count(forge, "main") == on_main + 1
    assert [p.hexsha for p in merged.parents] == [main]  # a squash, not a merge commit
    assert merged.message.strip() == "Keep: SETTING_2 = 22 (val_bpb 1.23)"
    assert merged.tree.hexsha == forge.repo.commit(head).tree.hexsha
    assert forge.read_file("main", "train.py") == new_train
    # the checkout follows main and the untracked file survives
    assert worktree_file(forge) == new_train
    assert worktree_file(forge, "scratch.txt") == "a person's untracked file\n"
    assert not forge.repo.is_dirty(untracked_files=False)
    assert forge.branch_head("autoresearch/6-two") == head  # the branch stays for the record


def test_merge_with_stale_expected_main_raises_and_changes_nothing(forge: LocalForge) -> None:
    old_main = forge.main_sha()
    forge.create_branch("autoresearch/7-a", old_main, {"train.py": edit_line(TRAIN_PY, 1, "SETTING_1 = 11")}, "a")
    b_head = forge.create_branch(
        "autoresearch/8-b", old_main, {"train.py": edit_line(TRAIN_PY, 9, "SETTING_9 = 99")}, "b"
    )
    new_main = forge.merge("autoresearch/7-a", old_main, "Keep a")
    commits = commit_count(forge)

    with pytest.raises(MainMoved):
        forge.merge("autoresearch/8-b", old_main, "Keep b")  # stale expected_main
    with pytest.raises(MainMoved):
        forge.merge("autoresearch/8-b", new_main, "Keep b")  # b is not based on the current main

    assert forge.main_sha() == new_main
    assert forge.branch_head("autoresearch/8-b") == b_head
    assert commit_count(forge) == commits
    assert worktree_file(forge) == edit_line(TRAIN_PY, 1, "SETTING_1 = 11")


def test_merge_retried_after_success_returns_the_same_sha(forge: LocalForge) -> None:
    main = forge.main_sha()
    forge.create_branch("autoresearch/9-c", main, {"train.py": edit_line(TRAIN_PY, 4, "SETTING_4 = 44")}, "c")
    first = forge.merge("autoresearch/9-c", main, "Keep c")
    commits = commit_count(forge)

    again = forge.merge("autoresearch/9-c", main, "Keep c")

    assert again == first
    assert forge.main_sha() == first
    assert commit_count(forge) == commits


def test_rebase_combines_changes_to_different_lines(forge: LocalForge) -> None:
    main = forge.main_sha()
    first_train = edit_line(TRAIN_PY, 2, "SETTING_2 = 20")
    second_train = edit_line(TRAIN_PY, 8, "SETTING_8 = 80")
    forge.create_branch("autoresearch/10-two", main, {"train.py": first_train}, "Two")
    second = forge.create_branch("autoresearch/11-eight", main, {"train.py": second_train}, "Eight")
    new_main = forge.merge("autoresearch/10-two", main, "Keep two")

    rebased = forge.rebase_branch("autoresearch/11-eight", new_main, "train.py")

    commit = forge.repo.commit(rebased)
    assert rebased != second
    assert forge.branch_head("autoresearch/11-eight") == rebased
    assert [p.hexsha for p in commit.parents] == [new_main]
    assert commit.message.strip() == "Eight"
    assert forge.read_file(rebased, "train.py") == edit_line(first_train, 8, "SETTING_8 = 80")
    # already on new_main: nothing to do; and now it merges cleanly
    assert forge.rebase_branch("autoresearch/11-eight", new_main, "train.py") == rebased
    final = forge.merge("autoresearch/11-eight", new_main, "Keep eight")
    assert worktree_file(forge) == edit_line(first_train, 8, "SETTING_8 = 80")
    assert forge.main_sha() == final


def test_rebase_grafts_only_the_allowed_file(forge: LocalForge) -> None:
    main = forge.main_sha()
    forge.create_branch("autoresearch/12-a", main, {"train.py": edit_line(TRAIN_PY, 1, "SETTING_1 = 10")}, "a")
    forge.create_branch(
        "autoresearch/13-b",
        main,
        {"train.py": edit_line(TRAIN_PY, 10, "SETTING_10 = 100"), "prepare.py": "# tampered\n"},
        "b",
    )
    new_main = forge.merge("autoresearch/12-a", main, "Keep a")

    rebased = forge.rebase_branch("autoresearch/13-b", new_main, "train.py")

    assert forge.read_file(rebased, "prepare.py") == PREPARE_PY
    assert forge.read_file(rebased, "train.py") == edit_line(
        edit_line(TRAIN_PY, 1, "SETTING_1 = 10"), 10, "SETTING_10 = 100"
    )


def test_rebase_with_overlapping_edits_raises_merge_conflict(forge: LocalForge) -> None:
    main = forge.main_sha()
    forge.create_branch("autoresearch/14-up", main, {"train.py": edit_line(TRAIN_PY, 6, "SETTING_6 = 600")}, "up")
    down = forge.create_branch(
        "autoresearch/15-down", main, {"train.py": edit_line(TRAIN_PY, 6, "SETTING_6 = 0")}, "down"
    )
    new_main = forge.merge("autoresearch/14-up", main, "Keep up")
    commits = commit_count(forge)

    with pytest.raises(MergeConflict):
        forge.rebase_branch("autoresearch/15-down", new_main, "train.py")

    assert forge.branch_head("autoresearch/15-down") == down
    assert commit_count(forge) == commits


def test_close_is_idempotent_and_keeps_the_branch(forge: LocalForge) -> None:
    head = forge.create_branch("autoresearch/16-discard-me", forge.main_sha(), {"train.py": "X = 1\n"}, "x")
    assert forge.closed_label("autoresearch/16-discard-me") is None

    forge.close("autoresearch/16-discard-me", "discard")
    tags = forge.repo.git.tag("--list").splitlines()
    forge.close("autoresearch/16-discard-me", "discard")

    assert forge.closed_label("autoresearch/16-discard-me") == "discard"
    assert forge.repo.git.tag("--list").splitlines() == tags == ["autoresearch/closed/16-discard-me"]
    assert forge.branch_head("autoresearch/16-discard-me") == head
    assert "autoresearch/16-discard-me" in forge.list_branches()
    with pytest.raises(ForgeError):
        forge.close("autoresearch/no-such-branch", "discard")


def test_list_branches_lists_experiment_branches(forge: LocalForge) -> None:
    main = forge.main_sha()
    for name in ("autoresearch/12-raise-matrix-lr", "autoresearch/2-smaller-batch", "autoresearch/1-warmup"):
        forge.create_branch(name, main, {"train.py": f"# {name}\n"}, name)
    forge.repo.create_head("someone-elses-branch", main)

    assert forge.list_branches() == [
        "autoresearch/1-warmup",
        "autoresearch/2-smaller-batch",
        "autoresearch/12-raise-matrix-lr",
    ]
    assert forge.list_branches("autoresearch/1") == ["autoresearch/1-warmup", "autoresearch/12-raise-matrix-lr"]
    assert "main" in forge.list_branches("")


def test_init_research_repo_twice_is_idempotent(tmp_path: Path) -> None:
    files = {"train.py": TRAIN_PY, "program.md": PROGRAM_MD}
    first = init_research_repo(tmp_path / "r", files)
    main = first.main_sha()

    second = init_research_repo(tmp_path / "r", {"train.py": "something else\n"}, "again")

    assert second.main_sha() == main
    assert commit_count(second) == 1
    assert second.read_file("main", "train.py") == TRAIN_PY
    assert worktree_file(second) == TRAIN_PY
    assert second.repo.head.ref.name == "main"
    reader = second.repo.config_reader("repository")
    assert reader.get_value("user", "name") == BOT_NAME
    assert reader.get_value("user", "email") == BOT_EMAIL


def test_bare_clone_works_without_a_working_tree_or_identity(tmp_path: Path) -> None:
    source = init_research_repo(tmp_path / "src", {"train.py": TRAIN_PY})
    git.Repo.clone_from(str(source.path), str(tmp_path / "bare.git"), bare=True)
    forge = LocalForge(tmp_path / "bare.git")  # no user.name configured anywhere
    main = forge.main_sha()

    forge.create_branch("autoresearch/1-x", main, {"train.py": "X = 1\n"}, "x")
    new_main = forge.merge("autoresearch/1-x", main, "Keep x")
    forge.close("autoresearch/1-x", "keep")

    assert forge.read_file("main", "train.py") == "X = 1\n"
    assert forge.repo.commit(new_main).committer.name == BOT_NAME
    assert forge.closed_label("autoresearch/1-x") == "keep"
