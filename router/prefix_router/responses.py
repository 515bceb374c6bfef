"""Read what an engine answered: the generated text (for the next-turn prefix) and usage."""

from __future__ import annotations

import json
from typing import Any

from .parsing import Kind


def _choice_text(choice: dict[str, Any], kind: Kind, streamed: bool) -> str:
    if kind == "completions":
        text = choice.get("text")
    else:
        part = choice.get("delta" if streamed else "message") or {}
        text = part.get("content") if isinstance(part, dict) else None
    return text if isinstance(text, str) else ""


def _usage(obj: dict[str, Any]) -> tuple[int, int] | None:
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = usage.get("prompt_tokens")
    if not isinstance(prompt, int):
        return None
    return prompt, cached if isinstance(cached, int) else 0


def read_json(body: bytes, kind: Kind) -> tuple[str | None, tuple[int, int] | None]:
    """(answer of choice 0, (prompt_tokens, cached_tokens)) of a non-streamed response."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    choices = obj.get("choices")
    answer = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        answer = _choice_text(choices[0], kind, streamed=False)
    return answer, _usage(obj)


def read_sse(buf: bytes, kind: Kind) -> tuple[str | None, tuple[int, int] | None]:
    """The same, from a buffered SSE stream (choice index 0 only)."""
    parts: list[str] = []
    usage = None
    complete = False
    for line in buf.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            complete = True
            break
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(obj, dict):
            continue
        u = _usage(obj)
        if u is not None:
            usage = u
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                parts.append(_choice_text(choice, kind, streamed=True))
    # A stream cut short is not a turn the client will continue from.
    return ("".join(parts) if complete else None), usage
