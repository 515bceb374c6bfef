"""A Responses API request as the chat it becomes, the way vLLM builds it (no I/O). The router
keys it by this chat and the simulator renders it: one conversion for both, so a
conversation moving between the Responses and chat APIs keeps its key.

vLLM (serving_responses / responses.utils) turns `instructions` + `input` into chat messages and
then runs the chat path, so the prompt is the one of the equivalent chat request:
- `instructions` -> a system message first;
- with `previous_response_id`: the stored messages of that response (everything it was asked,
  its own instructions included), then its output messages as assistant messages;
- `input` as a string -> one user message; as items: a message item is the chat message it
  already is (content parts `input_text`/`output_text` are text parts, `input_image` an
  `image_url` part), `function_call` an assistant message with one tool call,
  `function_call_output` a tool message, `reasoning` an assistant message with reasoning.
Tools are flat in the Responses API; vLLM nests each under `function` (the whole tool dumped)
and drops them all with `tool_choice: "none"`.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]

# The fields of the openai package's FunctionTool, in its order (vLLM dumps the model, so a
# chat template sees every one of them, unset ones as null).
_FUNCTION_TOOL_FIELDS = ("name", "parameters", "strict", "type", "description")


def _part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise ValueError(f"{where}: each content part must be an object with a type")
    kind = part["type"]
    if kind in ("input_text", "output_text", "text"):
        text = part.get("text")
        if not isinstance(text, str):
            raise ValueError(f"{where}: a {kind} part needs a text")
        return {"type": "text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise ValueError(f"{where}: the simulator takes input_image parts by image_url")
        image: dict[str, Any] = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise ValueError(f"{where}: content parts of type {kind!r} are not supported")


def _message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if not isinstance(role, str):
        raise ValueError(f"{where}: a message item needs a role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if isinstance(content, list):
        return {"role": role, "content": [_part(p, where) for p in content]}
    raise ValueError(f"{where}: content must be a string or a list of content parts")


def _item(item: Any, i: int) -> Message:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        return _message(item, where)
    if kind == "function_call":
        name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
        if not all(isinstance(v, str) for v in (name, arguments, call_id)):
            raise ValueError(f"{where}: a function_call needs name, arguments and call_id")
        call = {"id": call_id, "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "tool_calls": [{**call, "type": "function"}]}
    if kind == "function_call_output":
        output, call_id = item.get("output"), item.get("call_id")
        if not isinstance(output, str) or not isinstance(call_id, str):
            raise ValueError(f"{where}: a function_call_output needs output and call_id")
        return {"role": "tool", "content": output, "tool_call_id": call_id}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise ValueError("Encrypted content is not supported.")
        texts = item.get("summary") or item.get("content") or []
        text = texts[0].get("text", "") if len(texts) == 1 and isinstance(texts[0], dict) else ""
        return {"role": "assistant", "reasoning": text}
    raise ValueError(f"{where}: items of type {kind!r} are not supported")


def output_messages(output: list[dict[str, Any]]) -> list[Message]:
    """A stored response's output as the assistant messages the next turn sees (reasoning
    skipped, one message a content part, as vLLM does)."""
    out: list[Message] = []
    for item in output:
        if item.get("type") == "message":
            out.extend({"role": "assistant", "content": c.get("text", "")} for c in item["content"])
    return out


def input_messages(
    instructions: Any,
    request_input: Any,
    previous: tuple[list[Message], list[dict[str, Any]]] | None = None,
) -> list[Message]:
    """The chat messages of a Responses request; `previous`: the stored messages and output
    of the response named by previous_response_id."""
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("instructions must be a string")
    messages: list[Message] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if previous is not None:
        prev_messages, prev_output = previous
        messages.extend(prev_messages)
        messages.extend(output_messages(prev_output))
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
    elif isinstance(request_input, list):
        messages.extend(_item(item, i) for i, item in enumerate(request_input))
    else:
        raise ValueError("input must be a string or a list of items")
    if not messages:
        raise ValueError("input must not be empty")
    return messages


def chat_tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """Responses tools as the chat tools vLLM hands the template: each whole function tool
    under `function`; none at all with tool_choice "none"."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    if tool_choice == "none":
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ValueError(f"tools[{i}]: the simulator takes function tools only")
        if not isinstance(tool.get("name"), str):
            raise ValueError(f"tools[{i}]: a function tool needs a name")
        dumped = {k: tool.get(k) for k in _FUNCTION_TOOL_FIELDS}
        dumped.update((k, v) for k, v in tool.items() if k not in dumped)
        out.append({"type": "function", "function": dumped})
    return out or None


def as_chat(body: dict[str, Any]) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """(messages, tools) of the chat a Responses request body is, without the history a
    previous_response_id brings (only its engine holds that)."""
    return (
        input_messages(body.get("instructions"), body.get("input")),
        chat_tools(body.get("tools"), body.get("tool_choice")),
    )
