"""Token counts and prompt caching, simulated deterministically.

Counting rule. A request's prompt is a list of segments in the order the API caches it: each tool
definition, then each system block (a system string is one block), then each content block of each
message (a string content is one text block). A segment costs ceil(chars / 4) tokens, where chars is
  - the text, for a text block or a system string (a thinking block: its thinking),
  - len(name) + len(compact JSON of input), for a tool_use block,
  - the chars of its content (a string, or the sum over its blocks), for a tool_result block,
  - len(compact JSON with sorted keys, cache_control and null fields left out), for anything else
    (tool definitions, images, documents).
`input_tokens + cache_creation_input_tokens + cache_read_input_tokens` is the sum over segments;
output tokens are counted the same way over the reply's content blocks, at least 1.

Caching rule (after https://docs.claude.com/en/docs/build-with-claude/prompt-caching). A segment
carrying `cache_control` is a breakpoint; the top-level `cache_control` marks the last segment. A
prefix's key hashes the model and every segment up to it (cache_control and null fields left
out, the message role included). For each breakpoint the cache is searched at that boundary and up
to 20 segment boundaries before it; the longest prefix found unexpired is read
(`cache_read_input_tokens`). Every breakpoint whose prefix reaches `min_tokens` is then written,
or refreshed, with its TTL (5 minutes, or 1 hour for ttl "1h"); what the longest such prefix adds
beyond the read part is `cache_creation_input_tokens`, split in `cache_creation` by the TTL of the
breakpoint that covers it. Everything else is `input_tokens`. Prefixes under `min_tokens` (1024 for
Sonnet- and Opus-class models) are neither written nor read, as the API does.
Simplifications: the key ignores tool_choice, images and thinking settings (which also invalidate
parts of the real cache), and the cache is shared by all API keys.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


def compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def strip(value: Any) -> Any:
    """The value as the cache sees it: no cache_control anywhere, no null fields."""
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k != "cache_control" and v is not None}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def chars(block: Any) -> int:
    if isinstance(block, str):
        return len(block)
    if not isinstance(block, dict):
        return len(compact(block))
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return len(block["text"])
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        return len(block["thinking"])
    if kind == "tool_use":
        return len(str(block.get("name", ""))) + len(compact(block.get("input", {})))
    if kind == "tool_result":
        content = block.get("content", "")
        return len(content) if isinstance(content, str) else sum(chars(b) for b in content or [])
    return len(compact(strip(block)))


def tokens(block: Any) -> int:
    return -(-chars(block) // 4)


def output_tokens(blocks: list[dict[str, Any]]) -> int:
    return max(1, sum(tokens(b) for b in blocks))


@dataclass
class Segment:
    where: str  # "tools.0", "system.1", "messages.2.content.0"
    key: Any  # what the cache hashes
    tokens: int
    ttl: str | None  # the cache_control TTL when this segment is a breakpoint


def segments(body: dict[str, Any]) -> list[Segment]:
    """The prompt in cache order (tools, system, messages); assumes a validated body."""
    out: list[Segment] = []
    for i, tool in enumerate(body.get("tools") or []):
        out.append(Segment(f"tools.{i}", ["tool", strip(tool)], tokens(strip(tool)), _ttl(tool)))
    system = body.get("system")
    if isinstance(system, str) and system:
        out.append(Segment("system", ["system", system], tokens(system), None))
    for i, block in enumerate(system if isinstance(system, list) else []):
        out.append(Segment(f"system.{i}", ["system", strip(block)], tokens(block), _ttl(block)))
    for i, message in enumerate(body.get("messages") or []):
        role, content = message.get("role"), message.get("content")
        if isinstance(content, str):
            out.append(Segment(f"messages.{i}.content", [role, content], tokens(content), None))
            continue
        for j, block in enumerate(content or []):
            out.append(Segment(f"messages.{i}.content.{j}", [role, strip(block)], tokens(block), _ttl(block)))
    top = body.get("cache_control")
    if isinstance(top, dict) and out:
        out[-1].ttl = _longer(out[-1].ttl, top.get("ttl", "5m"))
    return out


def _ttl(block: Any) -> str | None:
    """The TTL of a block's breakpoint: its own cache_control, or one on a block nested in it."""
    if not isinstance(block, dict):
        return None
    ttl = None
    marker = block.get("cache_control")
    if isinstance(marker, dict):
        ttl = marker.get("ttl", "5m")
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        for inner in block["content"]:
            ttl = _longer(ttl, _ttl(inner))
    return ttl


def _longer(a: str | None, b: str | None) -> str | None:
    if a is None or b is None:
        return a or b
    return a if TTL_SECONDS.get(a, 0) >= TTL_SECONDS.get(b, 0) else b


def input_tokens(body: dict[str, Any]) -> int:
    return sum(s.tokens for s in segments(body))


class PromptCache:
    """Prefix hashes and when they expire, on the stand-in's clock."""

    def __init__(self, clock: Callable[[], float], min_tokens: int = 1024) -> None:
        self.clock = clock
        self.min_tokens = min_tokens
        self._entries: dict[str, tuple[float, float]] = {}  # prefix hash -> (expires at, its TTL)
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The input side of `usage` for a request that is answered, updating the cache."""
        segs = segments(body)
        digests, ends = _prefixes(str(body.get("model", "")), segs)
        total = ends[-1] if ends else 0
        breakpoints = [i for i, s in enumerate(segs) if s.ttl is not None and ends[i] >= self.min_tokens]
        now = self.clock()
        with self._lock:
            read, hit = 0, None
            for bp in breakpoints:
                for i in range(bp, max(-1, bp - LOOKBACK_BLOCKS - 1), -1):
                    entry = self._entries.get(digests[i])
                    if entry is not None and entry[0] > now:
                        if ends[i] > read:
                            read, hit = ends[i], digests[i]
                        break
            if hit is not None:  # a read refreshes the entry's TTL
                self._entries[hit] = (now + self._entries[hit][1], self._entries[hit][1])
            created = {"5m": 0, "1h": 0}
            covered = read
            for bp in breakpoints:
                ttl = segs[bp].ttl or "5m"
                if ends[bp] > covered:
                    created[ttl] += ends[bp] - covered
                    covered = ends[bp]
                expires, length = self._entries.get(digests[bp], (-1.0, 0.0))
                self._entries[digests[bp]] = (max(expires, now + TTL_SECONDS[ttl]), max(length, TTL_SECONDS[ttl]))
        creation = created["5m"] + created["1h"]
        return {
            "input_tokens": total - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": created["5m"], "ephemeral_1h_input_tokens": created["1h"]},
        }


def _prefixes(model: str, segs: list[Segment]) -> tuple[list[str], list[int]]:
    """For each segment, the hash of the prompt up to and including it, and its token count."""
    running = hashlib.sha256(compact(["model", model]).encode())
    digests, ends, total = [], [], 0
    for seg in segs:
        running.update(compact(seg.key).encode())
        digests.append(running.copy().hexdigest())
        total += seg.tokens
        ends.append(total)
    return digests, ends
