"""A Responses API request as the chat request vLLM runs for it (no I/O).

vLLM serves `/v1/responses` by turning `instructions` + `input` into chat messages and running
the chat path (vllm 0.34.0, vllm/entrypoints/openai/responses/utils.py): the router keys the
request by that chat, and the simulator renders it, through this one conversion.
- `instructions` -> a system message first (l. 316-322);
- with `previous_response_id`: the stored messages of that response without their system
  messages (instructions do not carry over), then each content part of its output messages as
  an assistant message, reasoning skipped (l. 324-340);
- `input` as a string -> one user message; as items (l. 352-537): a message item passes as it
  is (the chat preprocessing reads `input_text`/`input_image` parts); an assistant message,
  a `function_call` or a `reasoning` item fills the field still empty on the assistant message
  just before it (so a reasoning item and the calls after it are one message) or opens a new
  one; `function_call_output` -> a tool message;
- the request continues its last message (`continue_final_message`) when that is a message or
  reasoning item still `in_progress` or `incomplete` (l. 284-304);
- tools are flat in the Responses API; each function tool becomes the chat form
  (l. 574-599), kept with `tool_choice: "none"` as vLLM does by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .conversation import PromptError, tool_dicts

Message = dict[str, Any]


def responses_tools(tools: Any) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    if not isinstance(tools, list):
        raise PromptError("'tools' must be a list", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("type"), str):
            raise PromptError(f"tools[{i}] must be an object with a type", "tools")
    flat = [t for t in tools if t.get("type") == "function"]
    return tool_dicts([{"type": "function",
                        "function": {k: v for k, v in t.items() if k != "type"}}
                       for t in flat])  # fmt: skip


def _first_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        first = content[0]
        return first.get("text", "") if isinstance(first, Mapping) else str(first)
    return ""


def _strings(item: Mapping[str, Any], where: str, *fields: str) -> None:
    for field in fields:
        if not isinstance(item.get(field), str):
            raise PromptError(f"{where}: a {item.get('type')} item needs '{field}' as a string",
                              "input")  # fmt: skip


def _fill(messages: list[Message], field: str, value: Any) -> None:
    """Set `field` on the assistant message just before, if it has none yet, else open one."""
    prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if prev is not None and prev.get(field) is None:
        prev[field] = value
    else:
        messages.append({"role": "assistant", field: value})


def _item(messages: list[Message], item: Any, where: str) -> None:
    if not isinstance(item, Mapping):
        raise PromptError(f"{where} must be an object", "input")
    kind = item.get("type", "message")
    if kind == "function_call":
        _strings(item, where, "call_id", "name", "arguments")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        if prev is not None and isinstance(prev.get("tool_calls"), list):
            prev["tool_calls"].append(call)
        else:
            _fill(messages, "tool_calls", [call])
    elif kind == "function_call_output":
        _strings(item, where, "call_id", "output")
        messages.append({"role": "tool", "content": item["output"],
                         "tool_call_id": item["call_id"]})  # fmt: skip
    elif kind == "reasoning":
        if item.get("encrypted_content"):
            raise PromptError("Encrypted content is not supported.", "input")
        _fill(messages, "reasoning", _first_text(list(item.get("content") or [])
                                                 or list(item.get("summary") or [])))
    elif kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or not role:
            raise PromptError(f"{where}: a message item needs a role", "input")
        if role == "assistant":
            _fill(messages, "content", _first_text(item.get("content")))
        else:
            messages.append({k: v for k, v in item.items() if k not in ("type", "id", "status")})
    else:
        raise PromptError(f"{where}: items of type {kind!r} are not supported", "input")


def output_messages(output: list[Mapping[str, Any]]) -> list[Message]:
    """A stored response's output as the assistant messages the next turn sees."""
    return [{"role": "assistant", "content": part.get("text", "")}
            for item in output if item.get("type") == "message"
            for part in item.get("content") or ()]  # fmt: skip


def responses_messages(
    instructions: Any,
    items: Any,
    previous: tuple[list[Message], list[Mapping[str, Any]]] | None = None,
) -> tuple[list[Message], bool]:
    """The chat messages of a Responses request, and whether its last message is continued.
    `previous`: the stored messages and output of the response previous_response_id names."""
    messages: list[Message] = []
    if instructions:
        if not isinstance(instructions, str):
            raise PromptError("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    if previous is not None:
        stored, output = previous
        messages.extend(m for m in stored if m.get("role") != "system")
        messages.extend(output_messages(output))
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages, False
    if not isinstance(items, list) or not items:
        raise PromptError("'input' must be a string or a non-empty list", "input")
    for i, item in enumerate(items):
        _item(messages, item, f"input[{i}]")
    last = items[-1]
    cont = (last.get("type", "message") in ("message", "reasoning")
            and last.get("status") in ("in_progress", "incomplete"))  # fmt: skip
    return messages, cont


def responses_chat(
    body: Mapping[str, Any],
    previous: tuple[list[Message], list[Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The chat request body vLLM runs for a Responses request body."""
    messages, cont = responses_messages(body.get("instructions"), body.get("input"), previous)
    chat: dict[str, Any] = {
        "messages": messages,
        "tools": responses_tools(body.get("tools")),
        "add_generation_prompt": not cont,
        "continue_final_message": cont,
    }
    if body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    return chat

