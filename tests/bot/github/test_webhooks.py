"""Webhook payloads -> GitHubEvent: every vendored example of @octokit/webhooks-examples normalizes
to the kind and fields the handlers rely on, the rest is ignored, commands parse as documented,
and a payload that lacks what a handler needs is refused with a reason, never with a crash."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from bot.github.webhooks import (
    COMMANDS,
    KINDS,
    ZERO_SHA,
    GitHubEvent,
    MalformedPayload,
    normalize,
    parse_command,
    verify_signature,
)

EXAMPLES_DIR = Path(__file__).parent / "webhook_examples"
HANDLED_EVENTS = (
    "ping",
    "push",
    "pull_request",
    "issue_comment",
    "pull_request_review",
    "pull_request_review_comment",
    "check_run",
    "installation",
    "installation_repositories",
)


def examples(event: str) -> list[dict[str, Any]]:
    return json.loads((EXAMPLES_DIR / f"{event}.json").read_text())


def all_examples() -> list[tuple[str, int, dict[str, Any]]]:
    return [
        (path.stem, i, payload)
        for path in sorted(EXAMPLES_DIR.glob("*.json"))
        for i, payload in enumerate(json.loads(path.read_text()))
    ]


def example(event: str, action: str | None = None, **where: Any) -> dict[str, Any]:
    """A deep copy of the first vendored example of `event` with this action (to change freely)."""
    for payload in examples(event):
        if payload.get("action") == action and all(payload.get(k) == v for k, v in where.items()):
            return copy.deepcopy(payload)
    raise LookupError(f"no vendored {event}.{action} example")


def expected_kind(event: str, payload: dict[str, Any]) -> str:
    """The kind of a vendored example, from the table in the module docstring. The vendored issue
    comments are on plain issues and carry no command, and the vendored reviews have no body: the
    variants below cover feedback and commands."""
    action = payload.get("action")
    if event == "ping":
        return "ping"
    if event == "push":
        return "push" if payload["ref"].startswith("refs/heads/") else "ignored"
    if event in ("installation", "installation_repositories"):
        return "installation"
    return {
        ("pull_request", "closed"): "pr_closed",
        ("pull_request", "reopened"): "pr_reopened",
        ("pull_request_review_comment", "created"): "feedback",
        ("check_run", "rerequested"): "check_rerun",
        ("check_run", "requested_action"): "check_action",
    }.get((event, action), "ignored")


def expected_fields(kind: str, p: dict[str, Any]) -> dict[str, Any]:
    """The fields a handler of `kind` reads, taken straight from the payload."""
    common = {
        "sender": p["sender"]["login"],
        "sender_type": p["sender"]["type"],
        "installation_id": (p.get("installation") or {}).get("id"),
    }
    if kind == "push":
        files = {f for c in p["commits"] for key in ("added", "modified", "removed") for f in c[key]}
        return {
            **common,
            "repository": p["repository"]["full_name"],
            "ref": p["ref"],
            "before": p["before"],
            "after": p["after"],
            "branch": p["ref"].removeprefix("refs/heads/"),
            "changed_files": tuple(sorted(files)),
        }
    if kind in ("pr_closed", "pr_reopened"):
        pr = p["pull_request"]
        return {
            **common,
            "repository": p["repository"]["full_name"],
            "number": pr["number"],
            "branch": pr["head"]["ref"],
            "head_sha": pr["head"]["sha"],
            "merged": pr["merged"],
        }
    if kind == "feedback":  # the vendored review comments
        pr, comment = p["pull_request"], p["comment"]
        return {
            **common,
            "repository": p["repository"]["full_name"],
            "number": pr["number"],
            "branch": pr["head"]["ref"],
            "head_sha": pr["head"]["sha"],
            "body": comment["body"],
            "comment_id": comment["id"],
            "association": comment["author_association"],
            "command": None,
        }
    if kind in ("check_rerun", "check_action"):
        run = p["check_run"]
        return {
            **common,
            "repository": p["repository"]["full_name"],
            "check_run_id": run["id"],
            "check_name": run["name"],
            "head_sha": run["head_sha"],
            "external_id": run["external_id"] or None,
            "number": run["pull_requests"][0]["number"] if run["pull_requests"] else None,
            "branch": run["check_suite"]["head_branch"],
            "requested_action": (p.get("requested_action") or {}).get("identifier"),
        }
    if kind == "installation":
        return {**common, "repository": None, "installation_id": p["installation"]["id"]}
    if kind == "ping":
        return {**common, "repository": (p.get("repository") or {}).get("full_name")}
    return {}


@pytest.mark.parametrize(
    ("event", "index", "payload"),
    all_examples(),
    ids=[f"{e}-{i}-{p.get('action') or '-'}" for e, i, p in all_examples()],
)
def test_every_vendored_example_normalizes_to_its_kind_and_fields(event: str, index: int, payload: dict) -> None:
    result = normalize(event, f"delivery-{index}", payload)
    kind = expected_kind(event, payload)
    assert (result.kind, result.event, result.delivery, result.action) == (
        kind,
        event,
        f"delivery-{index}",
        payload.get("action"),
    )
    for name, value in expected_fields(kind, payload).items():
        assert getattr(result, name) == value, name


def test_the_vendored_examples_cover_every_event_handled_and_every_kind_but_the_text_ones() -> None:
    assert sorted(p.stem for p in EXAMPLES_DIR.glob("*.json")) == sorted((*HANDLED_EVENTS, "star", "issues"))
    kinds = {normalize(event, "d", payload).kind for event, _, payload in all_examples()}
    assert kinds == set(KINDS) - {"command"}  # commands: the variants below


def test_unrelated_events_and_unknown_actions_are_ignored_whatever_their_payload() -> None:
    for event, payload in [
        ("star", example("star", "created")),
        ("issues", example("issues", "opened")),
        ("a_future_event", {"action": 5, "repository": None}),
        ("pull_request", {"action": "labeled"}),
        ("check_run", {"action": "completed"}),
        ("issue_comment", {"action": "edited", "comment": None}),
        ("pull_request_review", {"action": "dismissed"}),
        ("check_suite", {}),
    ]:
        result = normalize(event, "d", payload)
        assert result.kind == "ignored", event


# --- variants of the vendored examples: what the vendored ones do not show -------------------------


def comment_on_pull_request(body: str, *, action: str = "created") -> dict[str, Any]:
    payload = example("issue_comment", action)
    payload["issue"]["pull_request"] = {"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"}
    payload["comment"]["body"] = body
    return payload


def test_a_comment_on_a_pull_request_is_feedback_with_its_author_and_association() -> None:
    payload = comment_on_pull_request("Try a warmup of 200 steps instead.")
    result = normalize("issue_comment", "d", payload)
    assert (
        result.kind,
        result.body,
        result.number,
        result.comment_id,
        result.association,
        result.sender,
        result.sender_type,
        result.repository,
    ) == (
        "feedback",
        "Try a warmup of 200 steps instead.",
        payload["issue"]["number"],
        payload["comment"]["id"],
        "OWNER",
        "Codertocat",
        "User",
        "Codertocat/Hello-World",
    )
    assert result.command is None and result.argument == ""


def test_a_command_on_a_pull_request_carries_the_command_and_its_argument() -> None:
    result = normalize("issue_comment", "d", comment_on_pull_request("/TRY a lower learning rate\nwith warmup"))
    assert (result.kind, result.command, result.argument) == ("command", "try", "a lower learning rate\nwith warmup")
    assert result.body == "/TRY a lower learning rate\nwith warmup"


def test_a_comment_on_a_plain_issue_is_a_command_or_nothing() -> None:
    pause = example("issue_comment", "created")
    pause["comment"]["body"] = "/pause"
    result = normalize("issue_comment", "d", pause)
    assert (result.kind, result.command, result.number) == ("command", "pause", None)
    assert result.issue_number == pause["issue"]["number"]  # where its answer goes
    chat = example("issue_comment", "created")
    assert "pull_request" not in chat["issue"]
    assert normalize("issue_comment", "d", chat).kind == "ignored"
    bare_try = example("issue_comment", "created")
    bare_try["comment"]["body"] = "/try"
    assert normalize("issue_comment", "d", bare_try).kind == "ignored"


def test_comment_text_is_made_valid_utf8_so_it_can_go_anywhere() -> None:
    result = normalize("issue_comment", "d", comment_on_pull_request("half an emoji \ud83d here"))
    assert result.body == "half an emoji ? here"
    result.body.encode("utf-8")


def test_edited_and_deleted_comments_never_act_even_when_they_hold_a_command() -> None:
    for action in ("edited", "deleted"):
        assert normalize("issue_comment", "d", comment_on_pull_request("/keep", action=action)).kind == "ignored"
    for action in ("edited", "deleted"):
        payload = example("pull_request_review_comment", action)
        payload["comment"]["body"] = "/discard"
        assert normalize("pull_request_review_comment", "d", payload).kind == "ignored"


def test_a_submitted_review_with_text_is_feedback_or_a_command_and_without_text_nothing() -> None:
    review = example("pull_request_review", "submitted")
    assert review["review"]["body"] is None
    assert normalize("pull_request_review", "d", review).kind == "ignored"
    review["review"]["body"] = "The loss curve looks noisy."
    result = normalize("pull_request_review", "d", review)
    assert (
        result.kind,
        result.body,
        result.comment_id,
        result.number,
        result.branch,
        result.head_sha,
        result.association,
    ) == (
        "feedback",
        "The loss curve looks noisy.",
        review["review"]["id"],
        review["pull_request"]["number"],
        review["pull_request"]["head"]["ref"],
        review["pull_request"]["head"]["sha"],
        review["review"]["author_association"],
    )
    review["review"]["body"] = "/discard it is noise"
    assert (
        normalize("pull_request_review", "d", review).command,
        normalize("pull_request_review", "d", review).argument,
    ) == ("discard", "it is noise")
    review["review"]["body"] = "   \n "
    assert normalize("pull_request_review", "d", review).kind == "ignored"
    dismissed = example("pull_request_review", "dismissed")
    dismissed["review"]["body"] = "/keep"
    assert normalize("pull_request_review", "d", dismissed).kind == "ignored"


def test_a_review_comment_command() -> None:
    payload = example("pull_request_review_comment", "created")
    payload["comment"]["body"] = "/rerun"
    result = normalize("pull_request_review_comment", "d", payload)
    assert (result.kind, result.command, result.argument, result.number) == ("command", "rerun", "", 2)


def test_a_comment_by_a_bot_carries_its_sender_type_for_the_handler_to_judge() -> None:
    payload = comment_on_pull_request("/keep")
    payload["sender"]["type"] = "Bot"
    payload["sender"]["login"] = "autoresearch-bot[bot]"
    payload["comment"]["author_association"] = "NONE"
    result = normalize("issue_comment", "d", payload)
    assert (result.kind, result.sender, result.sender_type, result.association) == (
        "command",
        "autoresearch-bot[bot]",
        "Bot",
        "NONE",
    )


def test_a_merged_pull_request_says_so() -> None:
    payload = example("pull_request", "closed")
    assert normalize("pull_request", "d", payload).merged is False
    payload["pull_request"]["merged"] = True
    assert normalize("pull_request", "d", payload).merged is True


def test_a_push_lists_the_union_of_the_files_its_commits_touched() -> None:
    payload = example("push", None, ref="refs/heads/master")
    commit = payload["commits"][0]
    payload["commits"] = [
        {**commit, "added": ["train.py"], "modified": ["README.md"], "removed": []},
        {**commit, "added": [], "modified": ["train.py", "program.md"], "removed": ["old.txt"]},
    ]
    assert normalize("push", "d", payload).changed_files == ("README.md", "old.txt", "program.md", "train.py")


def test_a_branch_deletion_is_a_push_and_a_tag_is_not() -> None:
    payload = example("push", None, ref="refs/tags/simple-tag", deleted=True)
    assert normalize("push", "d", payload).kind == "ignored"
    payload["ref"] = "refs/heads/autoresearch/3-lower-lr"
    result = normalize("push", "d", payload)
    assert (result.kind, result.branch, result.after, result.changed_files) == (
        "push",
        "autoresearch/3-lower-lr",
        ZERO_SHA,
        (),
    )


def test_a_check_run_with_our_external_id_carries_it() -> None:
    payload = example("check_run", "rerequested")
    payload["check_run"]["external_id"] = "experiment-7"
    assert normalize("check_run", "d", payload).external_id == "experiment-7"


# --- commands -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("/rerun", ("rerun", "")),
        ("/keep", ("keep", "")),
        ("/discard", ("discard", "")),
        ("/pause", ("pause", "")),
        ("/resume", ("resume", "")),
        ("/try a lower learning rate", ("try", "a lower learning rate")),
        ("/Keep", ("keep", "")),
        ("/RERUN please, the GPU was busy", ("rerun", "please, the GPU was busy")),
        ("/try\tdouble the batch", ("try", "double the batch")),
        ("/try\nuse a cosine schedule\nwith warmup", ("try", "use a cosine schedule\nwith warmup")),
        ("/discard\r\nnoise\r\nonly", ("discard", "noise\nonly")),
        ("\n\n  /pause", ("pause", "")),
        ("/keep\n\nThanks!", ("keep", "Thanks!")),
        ("/try", None),  # no idea: plain feedback
        ("/try   \n  ", None),
        ("/keeping it", None),  # a longer word is not the command
        ("/keep.", None),
        ("/ keep", None),
        ("/", None),
        ("", None),
        ("keep", None),
        ("please /keep", None),  # not at the start of the first line
        ("> /keep\nno", None),  # a quoted command is not a command
        ("Looks good\n/keep", None),  # the first line decides
        ("/merge", None),
        ("//keep", None),
    ],
)
def test_parse_command(text: str, parsed: tuple[str, str] | None) -> None:
    assert parse_command(text) == parsed


def test_every_command_word_is_recognised() -> None:
    for command in COMMANDS:
        assert parse_command(f"/{command} x") == (command, "x")


# --- malformed payloads ---------------------------------------------------------------------------


def _set(payload: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = payload
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return payload


_DELETE = object()

MALFORMED = [
    # (event, action or where, field, new value, reason)
    ("pull_request", "closed", "repository", _DELETE, "repository.full_name is missing"),
    ("pull_request", "closed", "repository", "Codertocat/Hello-World", "repository must be an object, not a string"),
    ("pull_request", "closed", "repository.full_name", 5, "repository.full_name must be a string, not a number"),
    ("pull_request", "closed", "repository.full_name", "Hello-World", "must read owner/name"),
    ("pull_request", "closed", "pull_request.number", "2", "pull_request.number must be an integer, not a string"),
    ("pull_request", "closed", "pull_request.number", True, "pull_request.number must be an integer, not a boolean"),
    ("pull_request", "closed", "pull_request.head", None, "pull_request.head.ref is missing"),
    (
        "pull_request",
        "reopened",
        "pull_request.head.sha",
        ["x"],
        "pull_request.head.sha must be a string, not an array",
    ),
    ("pull_request", "closed", "pull_request.merged", "yes", "pull_request.merged must be a boolean"),
    ("pull_request", "closed", "action", 3, "action must be a string"),
    ("push", None, "ref", _DELETE, "push: ref is missing"),
    ("push", None, "after", None, "push: after is missing"),
    ("push", None, "commits", {}, "commits must be an array, not an object"),
    ("push", None, "commits", [None], "commits[0] must be an object, not null"),
    ("push", None, "commits.0.added", "README.md", "commits[0].added must be a list of paths"),
    (
        "pull_request_review_comment",
        "created",
        "comment.author_association",
        _DELETE,
        "comment.author_association is missing",
    ),
    ("pull_request_review_comment", "created", "comment.body", 5, "comment.body must be a string, not a number"),
    ("pull_request_review_comment", "created", "comment.id", "1", "comment.id must be an integer"),
    ("pull_request_review_comment", "created", "sender", _DELETE, "sender.login is missing"),
    ("pull_request_review_comment", "created", "pull_request", _DELETE, "pull_request.number is missing"),
    ("issue_comment", "created", "issue", None, "issue_comment.created: issue is missing"),
    ("check_run", "requested_action", "requested_action", _DELETE, "requested_action.identifier is missing"),
    ("check_run", "rerequested", "check_run.id", "4", "check_run.id must be an integer"),
    (
        "check_run",
        "rerequested",
        "check_run.pull_requests",
        [{"number": "2"}],
        "check_run.pull_requests[0].number must be an integer",
    ),
    ("check_run", "rerequested", "check_run.head_sha", None, "check_run.head_sha is missing"),
    ("installation", "created", "installation", _DELETE, "installation.id is missing"),
    ("installation_repositories", "added", "installation.id", 1.5, "installation.id must be an integer, not a number"),
    ("installation", "created", "sender", "octocat", "sender must be an object, not a string"),
]


@pytest.mark.parametrize(
    ("event", "action", "path", "value", "reason"), MALFORMED, ids=[f"{e}.{a}:{p}" for e, a, p, _, _ in MALFORMED]
)
def test_a_handled_payload_without_what_its_handler_needs_is_refused_with_the_reason(
    event: str, action: str | None, path: str, value: Any, reason: str
) -> None:
    if event == "push":
        payload = example("push", None, ref="refs/heads/master")
    elif event == "issue_comment":
        payload = comment_on_pull_request("more warmup")
    else:
        payload = example(event, action)
    if path.startswith("commits.0."):
        _set(payload["commits"][0], path.removeprefix("commits.0."), value)
    else:
        _set(payload, path, value)
    with pytest.raises(MalformedPayload, match=None) as raised:
        normalize(event, "d", payload)
    assert reason in str(raised.value)


def test_a_payload_that_is_not_an_object_is_refused() -> None:
    for payload in ([], None, "x", 3):
        with pytest.raises(MalformedPayload, match="must be a JSON object"):
            normalize("push", "d", payload)  # type: ignore[arg-type]


JUNK = [None, "", 1, 1.5, True, [None], {"a": None}]


def _handled_examples() -> list[tuple[str, dict[str, Any]]]:
    """One vendored example per (event, action) that is not ignored, and the text variants."""
    seen, out = set(), []
    for event, _, payload in all_examples():
        key = (event, payload.get("action"), payload.get("ref"))
        if key not in seen and normalize(event, "d", payload).kind != "ignored":
            seen.add(key)
            out.append((event, payload))
    out += [
        ("issue_comment", comment_on_pull_request("/try more heads")),
        ("issue_comment", comment_on_pull_request("feedback")),
    ]
    review = example("pull_request_review", "submitted")
    review["review"]["body"] = "nice"
    return out + [("pull_request_review", review)]


def test_any_field_nulled_or_of_the_wrong_type_gives_an_event_or_a_reason_never_a_crash() -> None:
    """Every top- and second-level field of every handled payload replaced by junk: normalize
    returns an event or raises MalformedPayload, nothing else."""
    tried = 0
    for event, payload in _handled_examples():
        for key, value in payload.items():
            for junk in JUNK:
                for changed in _variants(payload, key, value, junk):
                    tried += 1
                    try:
                        result = normalize(event, "d", changed)
                    except MalformedPayload as error:
                        assert str(error)
                    else:
                        assert result.kind in KINDS
                        json.dumps(result.to_payload())
    assert tried > 5_000


def _variants(payload: dict, key: str, value: Any, junk: Any):
    yield {**payload, key: junk}
    if isinstance(value, dict):
        for inner in value:
            yield {**payload, key: {**value, inner: junk}}


# --- the inbox payload ----------------------------------------------------------------------------


def test_an_event_survives_the_trip_through_the_inbox_json() -> None:
    payloads = [(e, p) for e, _, p in all_examples()] + [("issue_comment", comment_on_pull_request("/keep x"))]
    for event, payload in payloads:
        original = normalize(event, "d-1", payload)
        stored = json.loads(json.dumps(original.to_payload()))
        assert GitHubEvent.from_payload(stored) == original


def test_from_payload_reads_older_and_newer_writers_and_refuses_nonsense() -> None:
    minimal = {"delivery": "d", "event": "ping", "kind": "ping", "a_field_from_the_future": 1}
    event = GitHubEvent.from_payload(minimal)
    assert (event.kind, event.repository, event.changed_files, event.merged) == ("ping", None, (), False)
    for bad, reason in [
        ([], "must be a JSON object"),
        ({"event": "ping", "kind": "ping"}, "lacks delivery"),
        ({**minimal, "kind": "weather"}, "unknown kind"),
        ({**minimal, "changed_files": "a.py"}, "list of paths"),
    ]:
        with pytest.raises(MalformedPayload, match=reason):
            GitHubEvent.from_payload(bad)


# --- signatures -----------------------------------------------------------------------------------


def _sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def test_verify_signature() -> None:
    body = b'{"zen": "Keep it logically awesome."}'
    good = _sign(b"s3cret", body)
    assert verify_signature(b"s3cret", body, good)
    assert verify_signature(b"s3cret", body, good.upper().replace("SHA256=", "sha256="))
    assert not verify_signature(b"s3cret", body + b" ", good)
    assert not verify_signature(b"other", body, good)
    assert not verify_signature(b"s3cret", body, None)
    assert not verify_signature(b"s3cret", body, "")
    assert not verify_signature(b"s3cret", body, good.removeprefix("sha256="))
    assert not verify_signature(b"s3cret", body, "sha1=" + hashlib.sha1(body).hexdigest())
    assert not verify_signature(b"s3cret", body, "sha256=\xff\u20ac")
    assert not verify_signature(b"", body, _sign(b"", body))  # no secret: nothing verifies
