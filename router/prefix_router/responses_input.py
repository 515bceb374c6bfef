"""The Responses API's request as the chat it is: `instructions` and `input` items -> chat
messages and tools, so a conversation keyed through either API gets the same prefix key (and,
with a tokenizer, the same rendered prompt). Pure.

Items, as OpenAI's Responses API names them: a message (`role`, `content` as a string or parts
`input_text` / `output_text` / `input_image`), a `function_call` (`call_id`, `name`,
`arguments`) and its `function_call_output` (`call_id`, `output`). A function tool is
`{"type": "function", "name", "description", "parameters"}` here and nested under `function`
in chat.
"""

from __future__ import annotations

from typing import Any

from .errors import RequestError

_TEXT_PARTS = {"input_text": "text", "output_text": "text"}


def _part(part: Any, where: str) -> Any:
    if not isinstance(part, dict):
        raise RequestError(400, f"{where} must be an object", param="input")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image":
        url = part.get("image_url") or part.get("file_id")
        return {"type": "image_url", "image_url": {"url": url}}
    return part  # audio, files: passed as they are, their bytes identify them


def _content(content: Any, where: str) -> Any:
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, list):
        return [_part(p, f"{where}[{i}]") for i, p in enumerate(content)]
    raise RequestError(400, f"{where} must be a string or a list of parts", param="input")


def as_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """(messages, tools) of the chat request this Responses request is."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError(400, "'instructions' must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                raise RequestError(400, f"{where} must be an object", param="input")
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if not isinstance(role, str) or not role:
                    raise RequestError(400, f"{where}.role is required", param="input")
                messages.append({"role": role, "content": _content(item.get("content"), where)})
            elif kind == "function_call":
                call = {"id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name"),
                                     "arguments": item.get("arguments")}}  # fmt: skip
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)  # parallel calls: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": item.get("output")})  # fmt: skip
            else:
                messages.append({"role": "user", "content": [_part(item, where)]})
    else:
        raise RequestError(400, "'input' is required: a string or a list of items", param="input")
    tools = body.get("tools")
    if tools is None:
        return messages, None
    if not isinstance(tools, list):
        raise RequestError(400, "'tools' must be a list", param="tools")
    chat_tools = []
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "function" and "function" not in t:
            fn = {k: v for k, v in t.items() if k != "type"}
            chat_tools.append({"type": "function", "function": fn})
        else:
            chat_tools.append(t)
    return messages, chat_tools
