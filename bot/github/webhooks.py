"""GitHub webhook deliveries -> one small GitHubEvent each: what the inbox stores and handlers read.

Pure: no I/O, no clock, no GitHub calls. `normalize()` reads the few fields the bot acts on from a
delivery's payload and names what happened with one `kind`; `verify_signature()` checks the
`X-Hub-Signature-256` header. Deciding whether the sender may steer the bot (trust), whether the
delivery is about the research repository, and whether a pull request is an experiment's is the
handler's job: this module only carries `repository`, `association`, `sender_type` and, for a
pull request, `head_repository` (a fork's pull request has its own) for it.

What each delivery becomes (event.action -> kind), and why:

- `ping` -> ping (GitHub's hello when a hook or an App is set up).
- `push` to a branch (`refs/heads/...`) -> push, with `changed_files` the union of the files the
  listed commits added, modified or removed, and `branch` the short branch name. A branch deletion
  is a push too (`after` is forty zeros): an experiment branch deleted by hand matters. Tag pushes
  are ignored. GitHub lists a bounded number of commits in a push payload, so for a very large push
  `changed_files` can miss files: a handler that must be sure asks the API.
- `pull_request.closed` -> pr_closed (`merged` says whether it was merged);
  `pull_request.reopened` -> pr_reopened. Other actions (opened, synchronize, labeled, ...) are the
  bot's own writes echoed back or do not concern it: ignored.
- `issue_comment.created`, `pull_request_review_comment.created`, and `pull_request_review.submitted`
  with a non-empty body -> command when the text starts with one (see `parse_command`), else
  feedback. Edited and deleted comments are ignored: a command acts once, when it is written.
  A comment on a plain issue (not a pull request: `issue.pull_request` absent) is a command or
  nothing: `/pause` in a tracking issue is useful, a chat about the weather is not the agent's
  feedback. Its `number` is None, so a handler can refuse `/keep` there; its `issue_number` (set
  for every `issue_comment`, on a pull request too) is where the answer to the command goes. For a
  review, `comment_id` is the review's id and `issue_number` is None (a review gets no answer).
- `check_run.rerequested` -> check_rerun; `check_run.requested_action` -> check_action with the
  button's identifier. `created` and `completed` are the bot's own writes echoed back: ignored.
  An empty `external_id` is carried as None.
- `installation.*` and `installation_repositories.*` -> installation (the handler reads `action`).
- Anything else (an unknown event or action) -> ignored, never an error.

A delivery that should be handled but lacks a field the handler needs (or has it with the wrong
type) raises MalformedPayload, whose message names the field.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

KINDS = (
    "ping",
    "push",
    "pr_closed",
    "pr_reopened",
    "feedback",
    "command",
    "check_rerun",
    "check_action",
    "installation",
    "ignored",
)
COMMANDS = ("rerun", "keep", "discard", "pause", "resume", "try")
ZERO_SHA = "0" * 40  # `before` of a branch creation, `after` of a branch deletion


class MalformedPayload(ValueError):
    """A delivery the bot should handle whose payload lacks a field it needs; the message says which."""


@dataclass(frozen=True)
class GitHubEvent:
    delivery: str  # X-GitHub-Delivery: the inbox key is github:<delivery>
    event: str  # X-GitHub-Event
    action: str | None
    kind: str  # one of KINDS
    repository: str | None  # "owner/name"; None for ping (org hooks) and installation events
    sender: str | None  # login of who caused it
    sender_type: str | None  # "User" | "Bot" | "Organization"
    association: str | None  # author_association of the comment/review author (OWNER, MEMBER, ...)
    number: int | None  # pull request number
    branch: str | None  # PR head ref (push: the branch pushed)
    head_sha: str | None
    ref: str | None  # push: "refs/heads/main"
    before: str | None
    after: str | None
    changed_files: tuple[str, ...] = ()  # push: union of added/modified/removed over the commits
    merged: bool = False  # pull_request closed: merged or not
    body: str = ""  # comment / review text, as written
    comment_id: int | None = None  # the comment's id (a review's id for a review)
    command: str | None = None  # one of COMMANDS
    argument: str = ""  # text after the command (the idea of /try)
    check_run_id: int | None = None
    check_name: str | None = None
    external_id: str | None = None
    requested_action: str | None = None  # identifier of the button pressed
    installation_id: int | None = None
    head_repository: str | None = None  # PR head's repository ("owner/name"; a fork's own; None: deleted)
    issue_number: int | None = None  # issue_comment: the issue or pull request it is on (where a reply goes)

    def to_payload(self) -> dict[str, Any]:
        """A JSON-safe dict for the inbox; `from_payload` reads it back."""
        data = asdict(self)
        data["changed_files"] = list(self.changed_files)
        return data

    @classmethod
    def from_payload(cls, data: Any) -> GitHubEvent:
        """The event `to_payload` wrote (keys it does not know are left out, for newer writers)."""
        if not isinstance(data, dict):
            raise MalformedPayload(f"a stored GitHub event must be a JSON object, not {_json_type(data)}")
        known = {f.name: f for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        missing = [name for name in ("delivery", "event", "kind") if not isinstance(values.get(name), str)]
        if missing:
            raise MalformedPayload(f"a stored GitHub event lacks {', '.join(missing)}")
        if values["kind"] not in KINDS:
            raise MalformedPayload(f"a stored GitHub event has an unknown kind {values['kind']!r}")
        files = values.get("changed_files", [])
        if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) for f in files):
            raise MalformedPayload("a stored GitHub event's changed_files must be a list of paths")
        values["changed_files"] = tuple(files)
        for name, spec in known.items():
            if name not in values and spec.default is MISSING:
                values[name] = None
        return cls(**values)


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """True when `header` is `sha256=<hex HMAC-SHA256 of body under secret>` (constant-time compare)."""
    if not secret or header is None or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode("ascii")
    # bytes, not str: compare_digest refuses non-ASCII str, and a header can hold anything
    given = header[len("sha256=") :].strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected, given)


def parse_command(text: str) -> tuple[str, str] | None:
    """(command, argument) when the text's first line starts with a command word, else None.

    The command word is one of `/rerun`, `/keep`, `/discard`, `/pause`, `/resume`, `/try`, in any
    case, followed by whitespace or the end of the text (`/keeping` is not `/keep`). Leading blank
    lines are skipped. The argument is everything after the word, the following lines included,
    stripped and with Windows line ends made plain. `/try` needs an idea: a bare `/try` is None,
    so it reaches the agent as plain feedback.
    """
    if not isinstance(text, str):
        return None
    text = text.replace("\r\n", "\n").lstrip()
    if not text.startswith("/"):
        return None
    word = text.split("\n", 1)[0].split(None, 1)[0]
    name = word[1:].lower()
    if name not in COMMANDS:
        return None
    argument = text[len(word) :].strip()
    if name == "try" and not argument:
        return None
    return name, argument


def normalize(event: str, delivery: str, payload: dict[str, Any]) -> GitHubEvent:
    """The GitHubEvent of one delivery (`event` and `delivery` are its X-GitHub-* headers)."""
    if not isinstance(payload, dict):
        raise MalformedPayload(f"the payload must be a JSON object, not {_json_type(payload)}")
    action = payload.get("action")
    reader = _READERS.get(event)
    if reader is None:
        return _ignored(event, delivery, payload)
    if action is not None and not isinstance(action, str):
        raise MalformedPayload(f"{event}: action must be a string, not {_json_type(action)}")
    try:
        fields_ = reader(_Payload(event, action, payload))
    except _Ignore:
        return _ignored(event, delivery, payload)
    base = {
        "repository": None,
        "sender": None,
        "sender_type": None,
        "association": None,
        "number": None,
        "branch": None,
        "head_sha": None,
        "ref": None,
        "before": None,
        "after": None,
    }
    return GitHubEvent(delivery=delivery, event=event, action=action, **{**base, **fields_})


# --- reading payloads ------------------------------------------------------------------------------


class _Ignore(Exception):
    """This delivery is of a handled event but an action (or ref) the bot does not act on."""


class _Payload:
    """A payload with typed, dotted-path getters whose errors name the field."""

    def __init__(self, event: str, action: str | None, data: dict[str, Any]) -> None:
        self.event, self.action, self.data = event, action, data
        self.name = f"{event}.{action}" if action else event

    def get(self, path: str, kind: type, *, required: bool = True) -> Any:
        value: Any = self.data
        walked = []
        for part in path.split("."):
            if not isinstance(value, dict):
                raise MalformedPayload(f"{self.name}: {'.'.join(walked)} must be an object, not {_json_type(value)}")
            walked.append(part)
            value = value.get(part)
            if value is None:
                if required:
                    raise MalformedPayload(f"{self.name}: {path} is missing")
                return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise MalformedPayload(f"{self.name}: {path} must be {_TYPE_NAMES[kind]}, not {_json_type(value)}")
        return value

    def common(self, *, repository: bool = True, people: bool = False) -> dict[str, Any]:
        """repository, sender, sender_type and installation_id; `people` makes the sender required."""
        out: dict[str, Any] = {
            "sender": self.get("sender.login", str, required=people),
            "sender_type": self.get("sender.type", str, required=people),
            "installation_id": self.get("installation.id", int, required=False),
        }
        if repository:
            full_name = self.get("repository.full_name", str)
            if full_name.count("/") != 1 or full_name.startswith("/") or full_name.endswith("/"):
                raise MalformedPayload(f"{self.name}: repository.full_name must read owner/name, not {full_name!r}")
            out["repository"] = full_name
        return out


def _ping(p: _Payload) -> dict[str, Any]:
    out = p.common(repository=False)
    out["repository"] = p.get("repository.full_name", str, required=False)
    return {"kind": "ping", **out}


def _push(p: _Payload) -> dict[str, Any]:
    ref = p.get("ref", str)
    if not ref.startswith("refs/heads/"):
        raise _Ignore
    commits = p.get("commits", list, required=False) or []
    changed: set[str] = set()
    for i, commit in enumerate(commits):
        if not isinstance(commit, dict):
            raise MalformedPayload(f"{p.name}: commits[{i}] must be an object, not {_json_type(commit)}")
        for key in ("added", "modified", "removed"):
            paths = commit.get(key) or []
            if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
                raise MalformedPayload(f"{p.name}: commits[{i}].{key} must be a list of paths")
            changed.update(paths)
    return {
        "kind": "push",
        **p.common(),
        "ref": ref,
        "branch": ref[len("refs/heads/") :],
        "before": p.get("before", str),
        "after": p.get("after", str),
        "changed_files": tuple(sorted(changed)),
    }


def _pull_request(p: _Payload) -> dict[str, Any]:
    kind = {"closed": "pr_closed", "reopened": "pr_reopened"}.get(p.action or "")
    if kind is None:
        raise _Ignore
    merged = p.get("pull_request.merged", bool, required=False)
    return {"kind": kind, **p.common(), **_pull_head(p), "merged": bool(merged)}


def _text(body: str, *, on_pull_request: bool) -> dict[str, Any]:
    """command or feedback from a comment's text; _Ignore when it is neither."""
    # a lone surrogate (valid in JSON, not in UTF-8) would fail later in SQLite, git or a prompt
    body = body.encode("utf-8", "replace").decode("utf-8")
    parsed = parse_command(body)
    if parsed:
        return {"kind": "command", "command": parsed[0], "argument": parsed[1], "body": body}
    if not on_pull_request or not body.strip():
        raise _Ignore
    return {"kind": "feedback", "body": body}


def _issue_comment(p: _Payload) -> dict[str, Any]:
    if p.action != "created":
        raise _Ignore
    issue = p.get("issue", dict)
    on_pull_request = issue.get("pull_request") is not None
    text = _text(p.get("comment.body", str, required=False) or "", on_pull_request=on_pull_request)
    return {
        **text,
        **p.common(people=True),
        "association": p.get("comment.author_association", str),
        "number": p.get("issue.number", int) if on_pull_request else None,
        "issue_number": p.get("issue.number", int),
        "comment_id": p.get("comment.id", int),
    }


def _review(p: _Payload) -> dict[str, Any]:
    if p.action != "submitted":
        raise _Ignore
    text = _text(p.get("review.body", str, required=False) or "", on_pull_request=True)
    return {
        **text,
        **p.common(people=True),
        "association": p.get("review.author_association", str),
        **_pull_head(p),
        "comment_id": p.get("review.id", int),
    }


def _review_comment(p: _Payload) -> dict[str, Any]:
    if p.action != "created":
        raise _Ignore
    text = _text(p.get("comment.body", str, required=False) or "", on_pull_request=True)
    return {
        **text,
        **p.common(people=True),
        "association": p.get("comment.author_association", str),
        **_pull_head(p),
        "comment_id": p.get("comment.id", int),
    }


def _pull_head(p: _Payload) -> dict[str, Any]:
    # head.repo is the fork's own repository for a fork's pull request (null once the fork is deleted)
    return {
        "number": p.get("pull_request.number", int),
        "branch": p.get("pull_request.head.ref", str),
        "head_sha": p.get("pull_request.head.sha", str),
        "head_repository": p.get("pull_request.head.repo.full_name", str, required=False),
    }


def _check_run(p: _Payload) -> dict[str, Any]:
    kind = {"rerequested": "check_rerun", "requested_action": "check_action"}.get(p.action or "")
    if kind is None:
        raise _Ignore
    pulls = p.get("check_run.pull_requests", list, required=False) or []
    number = None
    if pulls:  # empty when the pull request comes from a fork
        if not isinstance(pulls[0], dict) or not isinstance(pulls[0].get("number"), int):
            raise MalformedPayload(f"{p.name}: check_run.pull_requests[0].number must be an integer")
        number = pulls[0]["number"]
    out = {
        "kind": kind,
        **p.common(),
        "number": number,
        "check_run_id": p.get("check_run.id", int),
        "check_name": p.get("check_run.name", str),
        "head_sha": p.get("check_run.head_sha", str),
        "external_id": p.get("check_run.external_id", str, required=False) or None,
        "branch": p.get("check_run.check_suite.head_branch", str, required=False),
    }
    if kind == "check_action":
        out["requested_action"] = p.get("requested_action.identifier", str)
    return out


def _installation(p: _Payload) -> dict[str, Any]:
    out = p.common(repository=False)
    out["installation_id"] = p.get("installation.id", int)
    return {"kind": "installation", **out}


_READERS = {
    "ping": _ping,
    "push": _push,
    "pull_request": _pull_request,
    "issue_comment": _issue_comment,
    "pull_request_review": _review,
    "pull_request_review_comment": _review_comment,
    "check_run": _check_run,
    "installation": _installation,
    "installation_repositories": _installation,
}


def _ignored(event: str, delivery: str, payload: dict[str, Any]) -> GitHubEvent:
    """An event the bot does not act on, with what is cheap to tell about it (for the log line)."""

    def text(*path: str) -> str | None:
        value: Any = payload
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        return value if isinstance(value, str) else None

    return GitHubEvent(
        delivery=delivery,
        event=event,
        action=text("action"),
        kind="ignored",
        repository=text("repository", "full_name"),
        sender=text("sender", "login"),
        sender_type=text("sender", "type"),
        association=None,
        number=None,
        branch=None,
        head_sha=None,
        ref=None,
        before=None,
        after=None,
    )


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "a boolean", list: "an array", dict: "an object"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return _TYPE_NAMES.get(type(value), type(value).__name__)
