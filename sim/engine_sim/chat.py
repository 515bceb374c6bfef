"""A chat template: how messages become one prompt, as an engine's template would do it.

Tools first (templates put them in the system preamble), then every message as a role-tagged
record in order, then the generation prompt. So a shared system prompt is a shared prompt
prefix, and prompt + answer is a prefix of the next turn's prompt.
"""

from __future__ import annotations

import json
from typing import Any

GENERATION_PROMPT = "<|start|>assistant\n"
# The Responses API's names of a text part render as the chat's does (vLLM's preprocessing
# reads all three as text).
_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif not isinstance(part, dict):
                raise ValueError("each content part must be an object with a type")
            elif part.get("type") in _TEXT_PARTS:
                out.append(str(part.get("text", "")))
            else:
                out.append(json.dumps(part, sort_keys=True, separators=(",", ":")))
        return "".join(out)
    raise ValueError("content must be a string or a list of content parts")


def render_message(msg: dict[str, Any]) -> str:
    text = _content(msg.get("content"))
    if msg.get("tool_calls"):
        text += json.dumps(msg["tool_calls"], sort_keys=True, separators=(",", ":"))
    return f"<|start|>{msg['role']}\n{text}<|end|>\n"


def render_chat(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    parts = []
    if tools:
        parts.append(
            "<|tools|>" + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "<|end|>\n"
        )
    parts.extend(render_message(m) for m in messages)
    parts.append(GENERATION_PROMPT)
    return "".join(parts)
