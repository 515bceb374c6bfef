"""The chat template: messages (and tools) rendered to one prompt string.

Layout, every chunk padded to a multiple of 4 bytes (one token is 4 bytes, see tokenizer):

    <|start|>tools\\n{json of the tools}<|end|>\\n          (only when tools are given)
    <|start|>{role}\\n{content}[<|tool_calls|>{json}]<|end|>\\n   per message, in order
    <|start|>assistant\\n                                     the generation prompt

Padding (spaces after the role name and before `<|end|>`) keeps each chunk on the token grid,
so a chunk tokenizes the same wherever it sits. That gives the two properties prefix caching
relies on: a shared system prompt is a shared token prefix, and the previous turn's prompt
followed by the generated answer (whose pieces are 4 bytes each) is, token for token, a prefix
of the next turn's prompt, as it is with a real engine that caches its generated tokens.
"""

from __future__ import annotations

import json
from typing import Any

from .tokenizer import BYTES_PER_TOKEN

_START = "<|start|>"
_END = "<|end|>\n"
_TOOL_CALLS = "<|tool_calls|>"


def _dumps(value: Any) -> str:
    # Sorted keys and fixed separators: the same request always renders the same bytes.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _pad(text: str) -> str:
    """Spaces that bring len(text.encode()) up to a multiple of 4."""
    return " " * (-len(text.encode()) % BYTES_PER_TOKEN)


def _header(role: str) -> str:
    head = _START + role
    return head + _pad(head + "\n") + "\n"


def generation_prompt() -> str:
    """What ends every rendered prompt; also how an assistant message starts."""
    return _header("assistant")


def content_text(content: Any) -> str:
    """A message's content as text: strings as is, text parts joined, other parts as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text", "")))
            else:
                out.append(_dumps(part))
        return "".join(out)
    return _dumps(content)


def _chunk(role: str, body: str) -> str:
    head = _header(role)
    return head + body + _pad(head + body + _END) + _END


def render_message(message: dict[str, Any]) -> str:
    role = str(message.get("role", "user"))
    body = content_text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        body += _TOOL_CALLS + _dumps(calls)
    if role == "tool" and message.get("tool_call_id") is not None:
        body = f"[{message['tool_call_id']}]" + body
    return _chunk(role, body)


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    """The prompt for `messages`, tools first, ending with the assistant generation prompt."""
    parts = [_chunk("tools", _dumps(tools))] if tools else []
    parts.extend(render_message(m) for m in messages)
    parts.append(generation_prompt())
    return "".join(parts)


def validate_messages(messages: Any) -> str | None:
    """Why `messages` is not a usable chat, or None when it is."""
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}] must be an object"
        role = m.get("role")
        if not isinstance(role, str) or not role:
            return f"messages[{i}].role must be a string"
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"messages[{i}].content must be a string or a list of content parts"
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            return f"messages[{i}].content parts must be objects"
        if content is None and not m.get("tool_calls") and role != "assistant":
            return f"messages[{i}].content is required"
    return None
