"""The checks the Messages API makes before a request reaches the model, as far as the bot can get
them wrong. Each problem reads like the API's own 400 message, prefixed by where it is
("messages.2.content.0: ..."); the stand-in answers the first and records them all.

The field lists come from the installed SDK's request types, so an SDK upgrade that adds a
parameter does not make the stand-in reject it.
"""

from __future__ import annotations

import re
from typing import Any

from anthropic.types import (
    MessageCountTokensParams,
    ToolParam,
    ToolTextEditor20250124Param,
    ToolTextEditor20250429Param,
    ToolTextEditor20250728Param,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

try:  # a dev dependency; without it input_schema is only checked for "type": "object"
    from jsonschema import SchemaError, validators
except ImportError:  # pragma: no cover
    validators = None


def _keys(typed_dict: Any) -> frozenset[str]:
    return frozenset(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


# sampling parameters the API still takes although this SDK version no longer lists them
SAMPLING = frozenset({"temperature", "top_p", "top_k"})
CREATE_FIELDS = _keys(MessageCreateParamsNonStreaming) | SAMPLING
COUNT_FIELDS = _keys(MessageCountTokensParams)
CUSTOM_TOOL_FIELDS = _keys(ToolParam)
BUILTIN_TOOLS = {  # type -> (the name it must have, its fields)
    "text_editor_20250728": ("str_replace_based_edit_tool", _keys(ToolTextEditor20250728Param)),
    "text_editor_20250429": ("str_replace_based_edit_tool", _keys(ToolTextEditor20250429Param)),
    "text_editor_20250124": ("str_replace_editor", _keys(ToolTextEditor20250124Param)),
}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_BREAKPOINTS = 4
TTLS = ("5m", "1h")


def check_create(body: Any) -> list[str]:
    """Problems with a POST /v1/messages body (streaming is refused before this)."""
    if not isinstance(body, dict):
        return ["body: Input should be a JSON object"]
    problems = _unknown(body, CREATE_FIELDS, "")
    max_tokens = body.get("max_tokens")
    if "max_tokens" not in body:
        problems.append("max_tokens: Field required")
    elif not _is_int(max_tokens) or max_tokens < 1:
        problems.append(f"max_tokens: Input should be an integer of at least 1, not {max_tokens!r}")
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None and (not _is_number(value) or not low <= value <= high):
            problems.append(f"{name}: range: {low}..{high}, got {value!r}")
    if body.get("top_k") is not None and (not _is_int(body["top_k"]) or body["top_k"] < 0):
        problems.append(f"top_k: Input should be a non-negative integer, not {body['top_k']!r}")
    stops = body.get("stop_sequences")
    if stops is not None and (not isinstance(stops, list) or not all(isinstance(s, str) and s.strip() for s in stops)):
        problems.append("stop_sequences: each stop sequence must be a string with non-whitespace characters")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not _is_int(budget) or budget < 1024:
            problems.append("thinking.budget_tokens: Input should be greater than or equal to 1024")
        elif _is_int(max_tokens) and budget >= max_tokens:
            problems.append("max_tokens: `max_tokens` must be greater than `thinking.budget_tokens`")
    return problems + _check_prompt(body)


def check_count_tokens(body: Any) -> list[str]:
    if not isinstance(body, dict):
        return ["body: Input should be a JSON object"]
    return _unknown(body, COUNT_FIELDS, "") + _check_prompt(body)


def _check_prompt(body: dict[str, Any]) -> list[str]:
    """What a create and a count_tokens request share: model, system, tools, messages, caching."""
    problems: list[str] = []
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append("model: Field required")
    problems += _check_system(body.get("system"))
    tool_names = _check_tools(body.get("tools"), problems)
    _check_tool_choice(body.get("tool_choice"), tool_names, problems)
    _check_messages(body.get("messages"), tool_names, problems)
    problems += _check_cache_control(body)
    return problems


def _check_system(system: Any) -> list[str]:
    if system is None or isinstance(system, str):
        return []
    if not isinstance(system, list):
        return ["system: Input should be a string or a list of text blocks"]
    problems = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            problems.append(f'system.{i}: Input should be a text block {{"type": "text", "text": ...}}')
        elif not block["text"]:
            problems.append(f"system.{i}.text: text content blocks must be non-empty")
    return problems


def _check_tools(tools: Any, problems: list[str]) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        problems.append("tools: Input should be a valid list")
        return set()
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            problems.append(f"{where}: Input should be an object")
            continue
        kind, name = tool.get("type"), tool.get("name")
        if kind in BUILTIN_TOOLS:
            expected, fields = BUILTIN_TOOLS[kind]
            if name != expected:
                problems.append(f"{where}.name: the {kind} tool must be named {expected!r}, not {name!r}")
            problems += _unknown(tool, fields, where + ".")
        elif kind in (None, "custom"):
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                problems.append(f"{where}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
            problems += _unknown(tool, CUSTOM_TOOL_FIELDS, where + ".custom.")
            problems += _check_input_schema(tool.get("input_schema"), f"{where}.custom.input_schema")
        else:
            known = ", ".join(sorted(BUILTIN_TOOLS))
            problems.append(f"{where}.type: unknown tool type {kind!r}; the stand-in knows custom tools and {known}")
        if isinstance(name, str):
            if name in names:
                problems.append(f"tools: Tool names must be unique; {name!r} appears twice")
            names.add(name)
    return names


def _check_input_schema(schema: Any, where: str) -> list[str]:
    if schema is None:
        return [f"{where}: Field required"]
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return [f"{where}.type: Input should be 'object'"]
    if validators is not None:
        try:
            validators.validator_for(schema).check_schema(schema)
        except SchemaError as err:
            return [f"{where}: JSON schema is invalid: {err.message}"]
    return []


def _check_tool_choice(choice: Any, tool_names: set[str], problems: list[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        problems.append("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
        return
    if choice["type"] in ("any", "tool") and not tool_names:
        problems.append("tool_choice: tool_choice may only be specified while providing tools.")
    if choice["type"] == "tool" and choice.get("name") not in tool_names:
        problems.append(f"tool_choice.name: no tool named {choice.get('name')!r} in tools")


def _check_messages(messages: Any, tool_names: set[str], problems: list[str]) -> None:
    if not isinstance(messages, list) or not messages:
        problems.append("messages: Field required: at least one message")
        return
    previous_uses: list[str] = []  # tool_use ids of the message before, awaiting their results
    uses_tools = False
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            problems.append(f"{where}.role: Input should be 'user' or 'assistant'")
            return
        role, content = message["role"], message.get("content")
        if i == 0 and role != "user":
            problems.append('messages: first message must use the "user" role')
        if i > 0 and role == messages[i - 1].get("role"):
            problems.append(
                f'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row (messages.{i - 1} and messages.{i})'
            )
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            problems.append(f"{where}.content: Input should be a string or a list of content blocks")
            previous_uses = []
            continue
        if not blocks and not (role == "assistant" and i == len(messages) - 1):
            problems.append(f"{where}.content: messages must have non-empty content")
        answered: list[str] = []
        uses: list[str] = []
        seen_other = False
        for j, block in enumerate(blocks):
            at = f"{where}.content.{j}" if isinstance(content, list) else f"{where}.content"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind is None:
                problems.append(f'{at}: Input should be a content block with a "type"')
                continue
            if kind == "text":
                text = block.get("text")
                if not isinstance(text, str) or not text:
                    problems.append(f"{at}.text: text content blocks must be non-empty")
                elif role == "assistant" and i == len(messages) - 1 and j == len(blocks) - 1 and text != text.rstrip():
                    problems.append(f"{at}: final assistant content cannot end with trailing whitespace")
            if kind == "tool_use":
                uses_tools = True
                if role != "assistant":
                    problems.append(f"{at}: tool_use blocks can only be in assistant messages")
                if not isinstance(block.get("id"), str) or not TOOL_USE_ID.match(block["id"]):
                    problems.append(f"{at}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
                else:
                    uses.append(block["id"])
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                    problems.append(f"{at}: a tool_use block needs a name and an input object")
            elif kind == "tool_result":
                uses_tools = True
                if role != "user":
                    problems.append(f"{at}: tool_result blocks can only be in user messages")
                elif seen_other:
                    problems.append(
                        f"{at}: tool_result blocks must come first in the user message's content, "
                        "before any other block"
                    )
                if block.get("tool_use_id") not in previous_uses:
                    problems.append(
                        f"{at}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
                elif block["tool_use_id"] in answered:
                    problems.append(f"{at}: tool_use_id {block['tool_use_id']} is answered twice")
                else:
                    answered.append(block["tool_use_id"])
            else:
                seen_other = True
        missing = [u for u in previous_uses if u not in answered]
        if missing:
            problems.append(
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks immediately "
                f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                f"`tool_result` block in the next message."
            )
        previous_uses = uses
    if uses_tools and not tool_names:
        problems.append("messages: Requests which include `tool_use` or `tool_result` blocks must define tools.")


def _check_cache_control(body: dict[str, Any]) -> list[str]:
    """At most four breakpoints over tools, system and messages (the top-level one included),
    each {"type": "ephemeral"} with an optional ttl, and no 1h entry after a 5m one."""
    markers: list[tuple[str, Any]] = []  # in the order the API reads them
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict) and tool.get("cache_control") is not None:
            markers.append((f"tools.{i}.cache_control", tool["cache_control"]))
    if isinstance(body.get("system"), list):
        for i, block in enumerate(body["system"]):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                markers.append((f"system.{i}.cache_control", block["cache_control"]))
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            if block.get("cache_control") is not None:
                markers.append((f"messages.{i}.content.{j}.cache_control", block["cache_control"]))
            nested = block.get("content") if block.get("type") == "tool_result" else None
            for k, inner in enumerate(nested if isinstance(nested, list) else []):
                if isinstance(inner, dict) and inner.get("cache_control") is not None:
                    markers.append((f"messages.{i}.content.{j}.content.{k}.cache_control", inner["cache_control"]))
    if body.get("cache_control") is not None:  # marks the last block
        markers.append(("cache_control", body["cache_control"]))
    problems = []
    for where, marker in markers:
        if not isinstance(marker, dict) or marker.get("type") != "ephemeral":
            problems.append(f"{where}.type: Input should be 'ephemeral'")
        elif marker.get("ttl", "5m") not in TTLS:
            problems.append(f"{where}.ttl: Input should be '5m' or '1h'")
        elif set(marker) - {"type", "ttl"}:
            problems.append(f"{where}.{min(set(marker) - {'type', 'ttl'})}: Extra inputs are not permitted")
    if len(markers) > MAX_BREAKPOINTS:
        problems.append(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(markers)}."
        )
    # a longer TTL may not follow a shorter one
    ttls = [m.get("ttl", "5m") for _, m in markers if isinstance(m, dict)]
    if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
        problems.append(
            "cache_control: a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
        )
    return problems


def _unknown(obj: dict[str, Any], allowed: frozenset[str], prefix: str) -> list[str]:
    return [f"{prefix}{key}: Extra inputs are not permitted" for key in obj if key not in allowed]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
