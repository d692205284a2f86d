"""An Anthropic Messages API stand-in for tests that drive the real `anthropic` SDK: scripted
replies and faults, the API's request checks, and usage with prompt caching simulated
deterministically. See server.py for the public surface, tokens.py for the counting rules."""

from .app import RequestRecord
from .script import Reply, edit_then_submit, text_block, tool_use_block
from .server import AnthropicStandIn, FakeClock

__all__ = [
    "AnthropicStandIn",
    "FakeClock",
    "Reply",
    "RequestRecord",
    "edit_then_submit",
    "text_block",
    "tool_use_block",
]
