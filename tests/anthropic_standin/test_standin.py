"""The Anthropic stand-in, driven the way the bot will drive it: the real `anthropic` SDK over
loopback. Each test pins one behaviour of the Messages API that the bot relies on, and (unless it
provokes one on purpose) ends with the stand-in finding no violation of the API's rules."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from anthropic_standin import AnthropicStandIn, Reply, text_block, tool_use_block

MODEL = "claude-sonnet-5-5"
KEY = "sk-ant-test"
EDIT_TOOL = {
    "name": "propose_edit",
    "description": "Replace one string in train.py.",
    "input_schema": {
        "type": "object",
        "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
        "required": ["old", "new"],
    },
}
SYSTEM = ("You improve train.py; a lower val_bpb wins. " * 120)[:5000]  # 5000 chars: 1250 tokens
assert len(SYSTEM) == 5000


def client(api: AnthropicStandIn, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(api_key=options.pop("api_key", KEY), base_url=api.base_url, **options)


def cached_system(text: str = SYSTEM, **marker: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", **marker}}]


def post(api: AnthropicStandIn, body: Any, path: str = "/v1/messages", **headers: str) -> httpx.Response:
    """A request as a hand-written client would send it: for what the SDK will not send."""
    sent = {"x-api-key": KEY, "anthropic-version": "2023-06-01", **headers}
    return httpx.post(api.base_url + path, json=body, headers={k: v for k, v in sent.items() if v})


# the conversation ----------------------------------------------------------------------------


def test_two_turn_tool_use_exchange_round_trips_through_the_sdk() -> None:
    script = [
        Reply.tool_use("propose_edit", {"old": "lr = 0.01", "new": "lr = 0.02"}, text="Raising the lr."),
        Reply.text("Proposed: lr 0.01 -> 0.02."),
    ]
    with AnthropicStandIn(script) as api:
        claude = client(api)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Propose one edit to train.py."}]
        first = claude.messages.create(
            model=MODEL, max_tokens=1024, system="You are a careful researcher.", tools=[EDIT_TOOL], messages=messages
        )
        assert first.type == "message" and first.role == "assistant" and first.model == MODEL
        assert first.stop_reason == "tool_use" and first.stop_sequence is None
        assert first.id.startswith("msg_") and first._request_id.startswith("req_")
        text, use = first.content
        assert text.text == "Raising the lr."
        assert (use.type, use.name, use.input) == ("tool_use", "propose_edit", {"old": "lr = 0.01", "new": "lr = 0.02"})
        assert use.id.startswith("toolu_")

        messages += [
            first.to_param(),
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "edit applied; 1 replacement"}],
            },
        ]
        second = claude.messages.create(
            model=MODEL, max_tokens=1024, system="You are a careful researcher.", tools=[EDIT_TOOL], messages=messages
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].text == "Proposed: lr 0.01 -> 0.02."

        assert api.calls == 2 and api.remaining == 0
        assert api.last_system_text() == "You are a careful researcher."
        prompt = api.all_text()
        assert "edit applied; 1 replacement" in prompt and '"new": "lr = 0.02"' in prompt
        assert api.last_request.headers["anthropic-version"]
        assert [r.reply for r in api.requests] == [1, 2]
        assert api.violations == []


def test_several_blocks_per_reply_and_explicit_stop_reasons() -> None:
    script = [
        Reply(
            blocks=[
                text_block("Two edits."),
                tool_use_block("propose_edit", {"old": "a", "new": "b"}),
                tool_use_block("propose_edit", {"old": "c", "new": "d"}, id="toolu_mine"),
            ]
        ),
        Reply.text("I can't help with that.", stop_reason="refusal"),
        Reply(blocks=[text_block("cut")], stop_reason="max_tokens"),
    ]
    with AnthropicStandIn(script) as api:
        claude = client(api)
        ask = [{"role": "user", "content": "Go."}]
        both = claude.messages.create(model=MODEL, max_tokens=500, tools=[EDIT_TOOL], messages=ask)
        assert both.stop_reason == "tool_use"
        assert [b.type for b in both.content] == ["text", "tool_use", "tool_use"]
        assert both.content[2].id == "toolu_mine" and both.content[1].id != both.content[2].id
        assert claude.messages.create(model=MODEL, max_tokens=500, messages=ask).stop_reason == "refusal"
        assert claude.messages.create(model=MODEL, max_tokens=1, messages=ask).stop_reason == "max_tokens"
        assert api.violations == []


def test_a_callable_reply_answers_from_the_request() -> None:
    def echo(body: dict[str, Any]) -> Reply:
        return Reply.text(f"you said: {body['messages'][-1]['content']}")

    with AnthropicStandIn([echo]) as api:
        reply = client(api).messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "ping"}])
        assert reply.content[0].text == "you said: ping"


# usage and prompt caching --------------------------------------------------------------------


def test_cache_is_written_then_read_for_the_same_prefix() -> None:
    with AnthropicStandIn([Reply.text("one"), Reply.text("two")]) as api:
        claude = client(api)
        first = claude.messages.create(
            model=MODEL,
            max_tokens=100,
            system=cached_system(),
            messages=[{"role": "user", "content": "Propose an edit."}],
        )  # 16 chars
        assert first.usage.cache_creation_input_tokens == 1250
        assert first.usage.cache_creation.ephemeral_5m_input_tokens == 1250
        assert (first.usage.cache_read_input_tokens, first.usage.input_tokens) == (0, 4)
        assert first.usage.output_tokens == 1  # "one": ceil(3 / 4)

        second = claude.messages.create(
            model=MODEL, max_tokens=100, system=cached_system(), messages=[{"role": "user", "content": "And another."}]
        )  # 12 chars
        assert second.usage.cache_read_input_tokens == 1250
        assert (second.usage.cache_creation_input_tokens, second.usage.input_tokens) == (0, 3)
        assert api.violations == []


def test_a_growing_conversation_reads_the_previous_turn_and_writes_only_the_new_part() -> None:
    question, answer, follow_up = "q" * 2000, "a" * 400, "f" * 400  # 500, 100, 100 tokens
    marked = {"type": "ephemeral"}
    with AnthropicStandIn([Reply.text(answer), Reply.text("done")]) as api:
        claude = client(api)
        turn1 = [{"role": "user", "content": [{"type": "text", "text": question, "cache_control": marked}]}]
        first = claude.messages.create(model=MODEL, max_tokens=200, system=cached_system(), messages=turn1)
        assert (first.usage.cache_creation_input_tokens, first.usage.cache_read_input_tokens) == (1750, 0)

        turn2 = [
            {"role": "user", "content": [{"type": "text", "text": question}]},
            first.to_param(),
            {"role": "user", "content": [{"type": "text", "text": follow_up, "cache_control": marked}]},
        ]
        second = claude.messages.create(model=MODEL, max_tokens=200, system=cached_system(), messages=turn2)
        assert second.usage.cache_read_input_tokens == 1750  # found 2 blocks before the new breakpoint
        assert second.usage.cache_creation_input_tokens == 200  # the answer and the follow-up
        assert second.usage.input_tokens == 0
        assert api.violations == []


def test_a_short_prefix_is_not_cached() -> None:
    short = "Be brief. " * 40  # 400 chars: 100 tokens, under the 1024 minimum
    with AnthropicStandIn([Reply.text("a"), Reply.text("b")]) as api:
        claude = client(api)
        for _ in range(2):
            usage = claude.messages.create(
                model=MODEL, max_tokens=10, system=cached_system(short), messages=[{"role": "user", "content": "Go."}]
            ).usage
            assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens, usage.input_tokens) == (0, 0, 101)

    with AnthropicStandIn([Reply.text("a"), Reply.text("b")], min_cache_tokens=64) as api:  # a lower minimum
        claude = client(api)
        reads = [
            claude.messages.create(
                model=MODEL, max_tokens=10, system=cached_system(short), messages=[{"role": "user", "content": "Go."}]
            ).usage.cache_read_input_tokens
            for _ in range(2)
        ]
        assert reads == [0, 100]


def test_cache_entries_expire_on_the_fake_clock_and_reads_refresh_them() -> None:
    def usage_now(claude: anthropic.Anthropic, **marker: str) -> tuple[int, int]:
        u = claude.messages.create(
            model=MODEL, max_tokens=10, system=cached_system(**marker), messages=[{"role": "user", "content": "Go."}]
        ).usage
        return u.cache_creation_input_tokens, u.cache_read_input_tokens

    with AnthropicStandIn([Reply.text("x")] * 6) as api:
        claude = client(api)
        assert usage_now(claude) == (1250, 0)
        api.advance(299)
        assert usage_now(claude) == (0, 1250)  # and the read starts its 5 minutes again
        api.advance(299)
        assert usage_now(claude) == (0, 1250)
        api.advance(301)
        assert usage_now(claude) == (1250, 0)  # expired: written again
        api.cache.clear()
        assert usage_now(claude, ttl="1h") == (1250, 0)
        api.advance(3000)
        assert usage_now(claude, ttl="1h") == (0, 1250)


def test_count_tokens_follows_the_documented_rule() -> None:
    with AnthropicStandIn() as api:
        counted = client(api).messages.count_tokens(
            model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": "Propose an edit."}]
        )
        assert counted.input_tokens == 1250 + 4
        assert api.calls == 0 and api.requests[0].path == "/v1/messages/count_tokens"


# faults and retries --------------------------------------------------------------------------


def test_429_with_retry_after_is_retried_by_the_sdk_and_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    computed = anthropic.Anthropic._calculate_retry_timeout

    def recorded(self, *args, **kwargs):  # the wait the SDK chose, without timing anything
        waits.append(computed(self, *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(anthropic.Anthropic, "_calculate_retry_timeout", recorded)
    with AnthropicStandIn([Reply.rate_limited(retry_after_s=0.01), Reply.text("ok")]) as api:
        reply = client(api, max_retries=2).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}]
        )
        assert reply.content[0].text == "ok"
        assert waits == [0.01]  # the SDK waited retry-after-ms, not its 0.5 s backoff
        first, second = api.requests
        assert (first.status, second.status) == (429, 200)
        assert first.response == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": first.response["error"]["message"]},
        }
        assert second.headers["x-stainless-retry-count"] == "1"
        assert api.violations == []


def test_429_without_retries_left_raises_rate_limit_error() -> None:
    with AnthropicStandIn([Reply.rate_limited()]) as api:
        with pytest.raises(anthropic.RateLimitError) as raised:
            client(api).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}])
        assert raised.value.status_code == 429 and raised.value.response.headers["retry-after"] == "1"
        assert raised.value.request_id == "req_" + "1".zfill(24)


def test_529_overloaded_is_retried_with_the_sdk_backoff() -> None:
    with AnthropicStandIn([Reply.error(529), Reply.text("ok")]) as api:
        reply = client(api, max_retries=1).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}]
        )
        assert reply.content[0].text == "ok"
        assert [r.status for r in api.requests] == [529, 200]
        assert api.requests[0].response["error"]["type"] == "overloaded_error"

    with AnthropicStandIn([Reply.error(529, message="Overloaded")]) as api, pytest.raises(anthropic.OverloadedError):
        client(api).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}])


def test_a_wrong_key_raises_authentication_error_without_using_the_script() -> None:
    with AnthropicStandIn([Reply.text("never")], api_key="sk-ant-right") as api:
        with pytest.raises(anthropic.AuthenticationError) as raised:
            client(api, api_key="sk-ant-wrong", max_retries=2).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}]
            )
        assert raised.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        }
        assert api.calls == 1 and api.remaining == 1  # not retried, and "the model" never saw it
        assert post(api, {}, **{"x-api-key": ""}).json()["error"]["message"] == "x-api-key header is required"


def test_a_slow_reply_times_out_with_the_sdk_timeout() -> None:
    with AnthropicStandIn([Reply.text("too late", delay_s=5.0)]) as api:
        with pytest.raises(anthropic.APITimeoutError):  # a reply after 5 s would have been answered
            client(api, timeout=0.3).messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}]
            )


def test_slow_replies_are_answered_concurrently() -> None:
    arrived: list[float] = []  # when the server took each request

    def slow_echo(body: dict[str, Any]) -> Reply:
        arrived.append(time.monotonic())
        return Reply.text(body["messages"][0]["content"], delay_s=0.5)

    with AnthropicStandIn([slow_echo, slow_echo]) as api:
        claude = client(api)
        got: dict[str, str] = {}

        answered: list[float] = []

        def ask(word: str) -> None:
            reply = claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": word}])
            answered.append(time.monotonic())
            got[word] = reply.content[0].text

        threads = [threading.Thread(target=ask, args=(w,)) for w in ("left", "right")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == {"left": "left", "right": "right"}
        assert max(arrived) < min(answered)  # the second was taken before the first was answered


def test_the_script_running_out_is_a_500_the_test_sees_at_once() -> None:
    with AnthropicStandIn([Reply.text("only")]) as api:
        claude = client(api, max_retries=2)
        claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Go."}])
        with pytest.raises(anthropic.InternalServerError, match="script has ended"):
            claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Again."}])
        assert api.calls == 2  # x-should-retry: false kept the SDK from retrying
        [violation] = api.take_violations()
        assert "request #2" in violation and "script has ended" in violation


# the API's checks ----------------------------------------------------------------------------


def test_a_tool_result_without_its_tool_use_is_a_400_and_a_violation() -> None:
    with AnthropicStandIn([Reply.text("never")]) as api:
        messages = [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": "I will edit."},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_ghost", "content": "ok"}]},
        ]
        with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`") as raised:
            client(api).messages.create(model=MODEL, max_tokens=10, tools=[EDIT_TOOL], messages=messages)
        assert raised.value.body["error"]["type"] == "invalid_request_error"
        assert api.remaining == 1
        [violation] = api.take_violations()
        assert "messages.2.content.0" in violation and "toolu_ghost" in violation


def test_streaming_is_refused_with_a_clear_400() -> None:
    with AnthropicStandIn([Reply.text("never")]) as api:
        with pytest.raises(anthropic.BadRequestError, match="only non-streaming"):
            client(api).messages.create(
                model=MODEL, max_tokens=10, stream=True, messages=[{"role": "user", "content": "Go."}]
            )
        assert len(api.take_violations()) == 1


def test_the_text_editor_tools_are_accepted() -> None:
    tools = [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 10000}]
    old = [{"type": "text_editor_20250124", "name": "str_replace_editor"}]
    with AnthropicStandIn(
        [Reply.tool_use("str_replace_based_edit_tool", {"command": "view", "path": "train.py"}), Reply.text("ok")]
    ) as api:
        claude = client(api)
        use = claude.messages.create(
            model=MODEL, max_tokens=100, tools=tools, messages=[{"role": "user", "content": "Look."}]
        ).content[0]
        assert use.input == {"command": "view", "path": "train.py"}
        claude.messages.create(model=MODEL, max_tokens=100, tools=old, messages=[{"role": "user", "content": "Look."}])
        assert api.violations == []


GOOD = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Go."}]}
USER, ASSISTANT = {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}
MARK = {"type": "ephemeral"}
TOOL_USE = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "propose_edit", "input": {}}],
}
BAD_REQUESTS = {
    "no model": ({"max_tokens": 10, "messages": GOOD["messages"]}, "model: Field required"),
    "no max_tokens": ({"model": MODEL, "messages": GOOD["messages"]}, "max_tokens: Field required"),
    "no messages": ({**GOOD, "messages": []}, "at least one message"),
    "assistant first": ({**GOOD, "messages": [ASSISTANT, USER]}, 'first message must use the "user" role'),
    "roles repeat": ({**GOOD, "messages": [USER, USER]}, "roles must alternate"),
    "tool_use unanswered": (
        {**GOOD, "tools": [EDIT_TOOL], "messages": [USER, TOOL_USE, USER]},
        "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
    ),
    "tool_result after text": (
        {
            **GOOD,
            "tools": [EDIT_TOOL],
            "messages": [
                USER,
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "here"},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                    ],
                },
            ],
        },
        "tool_result blocks must come first",
    ),
    "tool blocks without tools": (
        {
            **GOOD,
            "messages": [
                USER,
                TOOL_USE,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
            ],
        },
        "must define tools",
    ),
    "tool without schema": ({**GOOD, "tools": [{"name": "edit"}]}, "tools.0.custom.input_schema: Field required"),
    "schema not an object": (
        {**GOOD, "tools": [{"name": "edit", "input_schema": {"type": "string"}}]},
        "input_schema.type: Input should be 'object'",
    ),
    "invalid schema": (
        {**GOOD, "tools": [{"name": "edit", "input_schema": {"type": "object", "required": "x"}}]},
        "JSON schema is invalid",
    ),
    "parameters, not input_schema": (
        {**GOOD, "tools": [{"name": "edit", "parameters": {"type": "object"}}]},
        "tools.0.custom.parameters: Extra inputs are not permitted",
    ),
    "editor misnamed": (
        {**GOOD, "tools": [{"type": "text_editor_20250728", "name": "str_replace_editor"}]},
        "must be named 'str_replace_based_edit_tool'",
    ),
    "unknown tool type": ({**GOOD, "tools": [{"type": "text_editor_20990101", "name": "x"}]}, "unknown tool type"),
    "five breakpoints": (
        {**GOOD, "system": [{"type": "text", "text": f"s{i}", "cache_control": MARK} for i in range(5)]},
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    "cache_control type": (
        {**GOOD, "system": [{"type": "text", "text": "s", "cache_control": {"type": "forever"}}]},
        "system.0.cache_control.type: Input should be 'ephemeral'",
    ),
    "cache_control ttl": (
        {**GOOD, "system": [{"type": "text", "text": "s", "cache_control": {**MARK, "ttl": "2h"}}]},
        "ttl: Input should be '5m' or '1h'",
    ),
    "1h after 5m": (
        {
            **GOOD,
            "system": [
                {"type": "text", "text": "s", "cache_control": MARK},
                {"type": "text", "text": "t", "cache_control": {**MARK, "ttl": "1h"}},
            ],
        },
        "must not come after",
    ),
    "temperature": ({**GOOD, "temperature": 1.5}, "temperature: range: 0.0..1.0"),
    "system blocks": ({**GOOD, "system": [{"type": "image", "source": {}}]}, "system.0: Input should be a text block"),
    "empty text": ({**GOOD, "messages": [{"role": "user", "content": ""}]}, "text content blocks must be non-empty"),
    "unknown field": ({**GOOD, "max_tokens_to_sample": 5}, "max_tokens_to_sample: Extra inputs are not permitted"),
}


@pytest.fixture(scope="module")
def referee() -> Iterator[AnthropicStandIn]:
    """One stand-in for the table below: a refused request never reaches its (empty) script."""
    with AnthropicStandIn() as api:
        yield api


@pytest.mark.parametrize("body, expected", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_malformed_request_is_answered_400_and_recorded(
    referee: AnthropicStandIn, body: dict[str, Any], expected: str
) -> None:
    referee.take_violations()
    answer = post(referee, body)
    assert answer.status_code == 400 and answer.headers["request-id"]
    assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "invalid_request_error"
    violations = referee.take_violations()
    assert any(expected in v for v in violations), violations
    assert referee.requests[-1].reply is None  # "the model" never saw it


def test_a_well_formed_request_passes_every_check() -> None:
    body = {
        **GOOD,
        "temperature": 0.0,
        "tools": [{**EDIT_TOOL, "cache_control": {**MARK, "ttl": "1h"}}],
        "system": [{"type": "text", "text": "s", "cache_control": MARK}],
        "cache_control": MARK,
        "tool_choice": {"type": "tool", "name": "propose_edit"},
    }
    with AnthropicStandIn([Reply.text("fine")]) as api:
        assert post(api, body).status_code == 200
        assert api.violations == []


def test_the_anthropic_version_header_is_required() -> None:
    with AnthropicStandIn([Reply.text("never")]) as api:
        answer = post(api, GOOD, **{"anthropic-version": ""})
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == "anthropic-version: header is required"
        assert len(api.take_violations()) == 1


def test_a_reply_longer_than_max_tokens_is_flagged() -> None:
    with AnthropicStandIn([Reply.text("x" * 400)]) as api:  # 100 tokens
        client(api).messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Go."}])
        [violation] = api.take_violations()
        assert "max_tokens=50" in violation
