"""A request's messages as vLLM hands them to the chat template: its preprocessing, as data.

vLLM does not give the template the request's messages as they came. It rebuilds each one
(vllm 0.34.0, vllm/renderers/chat_utils/chat_message.py):
- content: a string is one text part, none is no part (l. 631-634); text parts ("text",
  "input_text", "output_text", "refusal", "thinking"; a bare string too) are joined with "\\n"
  (l. 419); a text or refusal part without its text is skipped (l. 467-473);
- media (image_url, input_image; audio_url, input_audio; video_url): the model's placeholder,
  one a part, all of a message's in front of its text, each on its own line (l. 142-196:
  `get_full_multimodal_text_prompt`, interleaving off by default); with a template that loops
  over the content ("openai" format, vllm/renderers/hf.py l. 500-604) the parts stay a list of
  `{"type": "text", "text"}` and `{"type": <modality>}` instead (l. 476-480, 561-565);
- only role and content are kept, plus: an assistant's `tool_calls` (when not null) and
  `reasoning` (also as `reasoning_content`), a tool message's `tool_call_id` (its text parts
  joined into one string), `name` and `task` when strings, a developer's `tools`
  (l. 646-696); a system message loses a leading Claude Code billing-header line (l. 578-606);
- tool calls (l. 699-771): an empty list is dropped; each call must be an object of type
  function with a `function` object; its `arguments` become an object: a JSON string is
  parsed, anything that is not an object (invalid JSON, a list, a number, null, "") becomes {};
- a developer message, with a template that never names the role, becomes a system message,
  and all system messages are then merged into the first (vllm/renderers/hf.py l. 607-679,
  898-905).
Tools reach the template as vLLM's request model dumps them (`ChatCompletionToolsParam`:
`{"type", "function": {"name", "description", "parameters"}}`, extra keys after). A Responses
API request becomes the equivalent chat first (responses_chat.py).

Pure: no template, no tokenizer. A request the engine would refuse raises `PromptError`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text",
               "refusal": "refusal", "thinking": "thinking"}  # fmt: skip
_SKIP_WITHOUT_TEXT = ("text", "refusal")
# part type -> modality; the url (or data) is read by _media_url. Embeddings need an engine
# started to take them: the router does not refuse what such an engine serves.
_MEDIA_PARTS = {"image_url": "image", "input_image": "image", "audio_url": "audio",
                "input_audio": "audio", "video_url": "video", "image_embeds": "image",
                "image_pil": "image", "audio_embeds": "audio", "video_embeds": "video"}
_BILLING_HEADER = "x-anthropic-billing-header"


class PromptError(ValueError):
    """A request the engine refuses (400), with the field it is about."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class MediaItem:
    """A multimodal part as vLLM tracks it: its modality, its placeholder in the text and
    what identifies its content (the part's `uuid` where given, as vLLM's mm uuids are, else
    a sha256 of its URL or data: the pixels behind a URL are not fetched here)."""

    modality: str
    placeholder: str
    hash: str


def _media_url(part: Mapping[str, Any], ptype: str) -> Any:
    """What identifies the item: its URL ({"url": ...}; input_image's is the string itself),
    else its data (input_audio, embeddings)."""
    value = part.get("image_url" if ptype == "input_image" else ptype)
    if ptype.endswith("_url") and isinstance(value, Mapping):
        return value.get("url")
    return value


def _identity(part: Mapping[str, Any], url: Any) -> str:
    uuid = part.get("uuid")
    if uuid is not None:
        return str(uuid)
    data = url if isinstance(url, str) else json.dumps(url, sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()


def media_of(part: Any) -> tuple[str, str] | None:
    """(modality, identity) of a content part vLLM takes as a media item, as the chat's
    rendering names it; None for any other part (text, or what the engine refuses)."""
    try:
        kind, url, raw = _part(part, "content")
    except PromptError:
        return None
    if kind not in _MODALITIES:
        return None
    return kind, _identity(raw, url)


_MODALITIES = frozenset(_MEDIA_PARTS.values())


class _Media:
    """The request's media items in order and each modality's placeholder."""

    def __init__(self, placeholders: Mapping[str, str]) -> None:
        self.placeholders = placeholders
        self.items: list[MediaItem] = []
        self._counts: Counter[str] = Counter()

    def add(self, modality: str, part: Mapping[str, Any], url: Any) -> str:
        # a modality whose placeholder is not known here: vLLM's own marker for it (the key
        # then differs from the engine's there, but the router routes what the engine takes)
        template = self.placeholders.get(modality) or f"<##{modality.upper()}##>"
        self._counts[modality] += 1
        # some models number their placeholders (Phi-3-vision's <|image_1|>)
        placeholder = template.replace("{n}", str(self._counts[modality]))
        self.items.append(MediaItem(modality, placeholder, _identity(part, url)))
        return placeholder


def _part(part: Any, where: str) -> tuple[str, Any, Mapping[str, Any]]:
    """(kind, value, part): kind "text" with its string, a modality with its url, "skip"."""
    if isinstance(part, str):
        return "text", part, {}
    if not isinstance(part, Mapping):
        raise PromptError(f"{where} must be a string or an object")
    ptype = part.get("type")
    if ptype is None or part.get("uuid") is not None:
        # a part named by its field alone (vLLM accepts {"image_url": ...} without a type)
        for field, kind in _MEDIA_PARTS.items():
            if field in part and field != "input_image":
                return kind, _media_url(part, field), part
        if ptype is None:
            if "tool_reference" in part:
                return "text", part.get("name"), part
            raise PromptError(f"{where}: missing 'type' field in multimodal part.", "type")
    if not isinstance(ptype, str):
        raise PromptError(f"{where}: invalid 'type' field in multimodal part.", "type")
    if ptype in _TEXT_PARTS:
        value = part.get(_TEXT_PARTS[ptype])
        if value is None and ptype in _SKIP_WITHOUT_TEXT:
            return "skip", None, part
        if not isinstance(value, str):
            raise PromptError(f"{where}.{_TEXT_PARTS[ptype]} must be a string")
        return "text", value, part
    if ptype in _MEDIA_PARTS:
        if ptype == "image_url" and not isinstance(part.get("image_url"), Mapping):
            raise PromptError(f"{where}.image_url must be an object with a url")
        return _MEDIA_PARTS[ptype], _media_url(part, ptype), part
    if ptype == "tool_reference":
        return "tool_reference", part.get("name"), part
    raise PromptError(f"{where}: unsupported chat content part type: {ptype!r}", "type")


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """A system message's Claude Code attribution line changes on every request: vLLM drops
    it (and we must, or the prefix differs from the engine's at that line)."""
    out = []
    for part in parts:
        text = part if isinstance(part, str) else (
            part.get("text") if isinstance(part, Mapping) and part.get("type") == "text"
            else None)  # fmt: skip
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _join_string(texts: list[str], placeholders: list[str]) -> str:
    """vLLM's string-format content: the placeholders not written in the text by the client,
    in front, then the text, joined with newlines."""
    text = "\n".join(texts)
    counts = Counter(placeholders)
    missing: list[str] = []
    for placeholder in counts:
        left = counts[placeholder] - text.count(placeholder)
        if left < 0:
            raise PromptError(f"Found more '{placeholder}' placeholders in input prompt than "
                              "actual multimodal data items.")  # fmt: skip
        missing += [placeholder] * left
    return "\n".join([*missing, text] if text else missing)


def _content(role: str, content: Any, where: str, fmt: ContentFormat, media: _Media) -> Any:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise PromptError(f"{where}.content must be a string or a list of content parts")
    if role == "system":
        parts = _strip_billing_header(parts)
    texts: list[str] = []
    placeholders: list[str] = []
    kinds: list[str] = []
    wrapped: list[dict[str, Any]] = []
    for i, raw in enumerate(parts):
        kind, value, part = _part(raw, f"{where}.content[{i}]")
        if kind == "skip":
            continue
        if kind == "text":
            texts.append(value)
            wrapped.append({"type": "text", "text": value})
        elif kind == "tool_reference":
            texts.append(value)
            wrapped.append({"type": "tool_reference", "name": value})
        else:
            placeholders.append(media.add(kind, part, value))
            kinds.append(kind)
            wrapped.append({"type": kind})
    if fmt == "openai":
        return wrapped
    if placeholders:
        # vLLM keeps them by modality (its placeholder storage), each modality in first-seen order
        order = {kind: i for i, kind in reversed(list(enumerate(kinds)))}
        by_kind = sorted(zip(kinds, placeholders, strict=True), key=lambda kp: order[kp[0]])
        return _join_string(texts, [p for _, p in by_kind])
    return "\n".join(texts)


def _tool_calls(msg: dict[str, Any]) -> None:
    """vLLM's tool-call rule: arguments become an object, whatever came."""
    calls = msg.get("tool_calls")
    if not isinstance(calls, list):
        return
    if not calls:
        del msg["tool_calls"]
        return
    for call in calls:
        if not isinstance(call, dict):
            raise PromptError("assistant tool_calls entries must be objects.", "tool_calls")
        fn = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(fn, dict):
            raise PromptError("chat completions only support assistant tool_calls of type "
                              "'function'.", "tool_calls")  # fmt: skip
        args = fn.get("arguments")
        if not args:
            fn["arguments"] = {}
            continue
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        fn["arguments"] = args if isinstance(args, dict) else {}


def conversation(
    messages: Any, fmt: ContentFormat = "string", placeholders: Mapping[str, str] | None = None,
    developer_role: bool = True,
) -> tuple[list[dict[str, Any]], tuple[MediaItem, ...]]:
    """The messages as the template sees them, and the media items in order.
    `developer_role`: whether the template names the developer role (else it is a system
    message, as vLLM makes it)."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("'messages' must be a non-empty list")
    media = _Media(placeholders or {})
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise PromptError(f"{where} must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise PromptError(f"{where}.role is required")
        conv: dict[str, Any] = {"role": role,
                                "content": _content(role, msg.get("content"), where, fmt, media)}
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                # copied deep: the arguments are rewritten, the request's body must not be
                conv["tool_calls"] = copy.deepcopy(list(msg["tool_calls"]))
            if msg.get("reasoning") is not None:
                conv["reasoning"] = conv["reasoning_content"] = msg["reasoning"]
        elif role == "tool":
            if "tool_call_id" in msg:
                conv["tool_call_id"] = msg["tool_call_id"]
            parts = conv["content"]
            if isinstance(parts, list) and all(p.get("type") == "text" for p in parts):
                conv["content"] = "\n".join(p.get("text", "") for p in parts)
        if isinstance(msg.get("name"), str):
            conv["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            conv["task"] = msg["task"]
        if role == "developer":
            conv["tools"] = msg.get("tools")
        out.append(conv)
    for conv in out:
        if conv["role"] == "assistant":
            _tool_calls(conv)
    if not developer_role and any(m["role"] == "developer" for m in out):
        out = _merge_systems([{**{k: v for k, v in m.items() if k != "tools"}, "role": "system"}
                              if m["role"] == "developer" else m for m in out])  # fmt: skip
    return out, tuple(media.items)


def _merge_systems(conv: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System messages anywhere but first, or several: one, first, their texts joined by a
    blank line (vLLM does this for templates that know no developer role)."""
    systems: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, m in enumerate(conv):
        if m["role"] != "system":
            rest.append(m)
            continue
        merge = merge or i > 0 or bool(systems)
        content = m.get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] if isinstance(p, dict) and "text" in p else p
                                for p in content if isinstance(p, (dict, str)))  # fmt: skip
        if content:
            systems.append(content)
    if not merge:
        return conv
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest]


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as vLLM's `ChatCompletionToolsParam.model_dump()` gives them to the template
    (vllm 0.34.0, vllm/entrypoints/openai/chat_completion/protocol.py l. 208-225 and
    vllm/entrypoints/generate/base/protocol.py l. 298-313): `{"type", "function": {"name",
    "description", "parameters"}}`, `strict` and `defer_loading` only where set, other keys
    dropped."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise PromptError("'tools' must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
            raise PromptError(f"tools[{i}] must be an object with a function", "tools")
        fn = tool["function"]
        if not isinstance(fn.get("name"), str):
            raise PromptError(f"tools[{i}].function.name must be a string", "tools")
        dumped = {k: fn.get(k) for k in ("name", "description", "parameters")}
        defer = fn.get("defer_loading", tool.get("defer_loading"))
        for key, value in (("strict", fn.get("strict")), ("defer_loading", defer)):
            if value is not None:
                dumped[key] = value
        item: dict[str, Any] = {"type": tool.get("type", "function"), "function": dumped}
        if tool.get("defer_loading") is not None:
            item["defer_loading"] = tool["defer_loading"]
        out.append(item)
    return out
