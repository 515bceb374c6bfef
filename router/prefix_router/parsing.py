"""Parse an OpenAI request body and turn its prompt into canonical bytes.

Canonical bytes are what the prefix key is computed over. They are built so that whatever an
engine's chat template does, two requests whose rendered prompts share a prefix also share a
canonical-byte prefix: tools first (a template puts them in the system preamble), then each
message as a self-delimited record in order. A conversation's history is therefore a byte
prefix of its next turn.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .conversation import PromptError, media_of
from .errors import RequestError
from .prefix import Media
from .responses_chat import responses_chat

Kind = Literal["completions", "chat", "responses"]

# Strict JSON (no NaN), about twice as fast as the standard library's on a large body: the
# parse is most of the router's work on a long prompt.
_JSON = msgspec.json.Decoder()

# Record separators that cannot occur in UTF-8 text (0xff/0xfe are never valid UTF-8 bytes),
# so a crafted message cannot forge a record boundary.
_TOOLS = b"\xff\x01"
_MSG = b"\xff\x02"
_PART = b"\xff\x03"
_FIELD = b"\xfe"
_TOKENS = b"\xff\x04"
# Text parts under their three names key alike, so a conversation that moves between the
# chat and Responses APIs keeps its key.
_TEXT_PARTS = frozenset(("text", "input_text", "output_text"))

# The deepest a request body may nest (the body itself is level 1). Deep enough for any real
# tool schema (a JSON Schema nests two levels per object property; OpenAI's strict schemas
# allow ten objects deep), and far from Python's recursion limit, which the canonical bytes
# (json.dumps of tools, content parts, tool_calls) and the forwarded body would otherwise hit.
MAX_DEPTH = 64


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    model: str
    stream: bool
    body: dict[str, Any]
    canonical: bytes
    cache_salt: str | None
    include_usage: bool
    # a Responses API request (its prompt keyed as the chat it is, `kind` "chat"):
    # previous_response_id, store, background as the client gave them
    responses: dict[str, Any] | None = None
    media: tuple[Media, ...] = ()  # the media parts' spans in `canonical` (chat)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _content_bytes(content: Any, where: str, at: int, media: list[Media]) -> bytes:
    """`at`: where these bytes start in the canonical prompt; each media part's span is added
    to `media`."""
    if content is None:
        return b""
    if isinstance(content, str):
        return content.encode()
    if isinstance(content, list):
        out = bytearray()
        for i, part in enumerate(content):
            if isinstance(part, str):
                out += _PART + part.encode()
            elif isinstance(part, dict):
                ptype = part.get("type")
                if ptype in _TEXT_PARTS and isinstance(part.get("text"), str):
                    out += _PART + b"text" + _FIELD + part["text"].encode()
                elif (item := media_of(part)) is not None:
                    # an image (audio, video) is its identity, not its base64 text: the blocks
                    # over its span are keyed with it (prefix.py), as vLLM keys them
                    start = at + len(out)
                    out += _PART + item[0].encode() + _FIELD + item[1].encode()
                    media.append(Media(start, at + len(out), item[1]))
                else:
                    # other parts (files, ...): their serialised form is what identifies them
                    out += _PART + _dumps(part)
            else:
                raise RequestError(400, f"{where}.content[{i}] must be a string or an object")
        return bytes(out)
    raise RequestError(400, f"{where}.content must be a string or a list of content parts")


def canonical_chat(messages: list[Any], tools: Any = None,
                   media: list[Media] | None = None) -> bytes:
    """`media`: where the media parts' spans go (see prefix.py), in order."""
    spans: list[Media] = [] if media is None else media
    out = bytearray()
    if tools:
        out += _TOOLS + _dumps(tools)
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(400, f"{where} must be an object", param="messages")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise RequestError(400, f"{where}.role is required", param="messages")
        out += _MSG + role.encode() + _FIELD
        out += _content_bytes(msg.get("content"), where, len(out), spans)
        for extra in ("name", "tool_calls", "tool_call_id"):
            if extra in msg and msg[extra] is not None:
                out += _FIELD + extra.encode() + _FIELD + _dumps(msg[extra])
    return bytes(out)


def canonical_prompt(prompt: Any) -> bytes:
    if isinstance(prompt, str):
        return prompt.encode()
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            # A batch of prompts: route by the first (they go to one backend together).
            return first.encode()
        if isinstance(first, int) and not isinstance(first, bool):
            if not all(isinstance(t, int) and 0 <= t < 2**32 for t in prompt):
                raise RequestError(
                    400, "prompt token ids must be non-negative integers", param="prompt"
                )
            return _TOKENS + array("I", prompt).tobytes()
        if isinstance(first, list):
            return canonical_prompt(first)
    raise RequestError(
        400, "prompt must be a string, a list of strings or a list of token ids", param="prompt"
    )


def parse_request(
    raw: bytes, kind: Kind, salt_from_header: str | None = None, header_wins: bool = True
) -> ParsedRequest:
    """`salt_from_header`: the tenant's salt as a trusted gateway set it; with `header_wins`
    it replaces any `cache_salt` in the body (a client must not pick another tenant's)."""
    try:
        body = _JSON.decode(raw)
    except msgspec.ValidationError as exc:  # a number out of range, say
        raise RequestError(400, f"the request body holds a value JSON cannot carry: {exc}"
                           ) from None  # fmt: skip
    except msgspec.DecodeError as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # deeper than the decoder's own stack allows
        raise _too_deep() from None
    if isinstance(body, dict | list) and not _shallow(body, MAX_DEPTH):
        raise _too_deep()
    try:
        return _parse_body(body, kind, salt_from_header, header_wins)
    except UnicodeEncodeError as exc:
        # JSON may escape a lone UTF-16 surrogate ("\ud800"); that is no Unicode text, and
        # no tokenizer takes it.
        raise RequestError(
            400, f"the request holds a lone surrogate ({exc.object[exc.start]!r}), which is "
            "not valid Unicode text",
        ) from None


def _too_deep() -> RequestError:
    return RequestError(400, f"the request body nests deeper than {MAX_DEPTH} levels")


def _shallow(value: dict | list, limit: int) -> bool:
    """Whether `value` nests at most `limit` levels of arrays and objects: level by level,
    never recursing, so no depth a client sends can exhaust the stack here."""
    level: list[dict | list] = [value]
    for _ in range(limit):
        below: list[dict | list] = []
        for node in level:
            items = node.values() if type(node) is dict else node
            # a long array of scalars (token ids) is looked over in C
            if len(items) > 16 and not _CONTAINERS & set(map(type, items)):
                continue
            below += [c for c in items if type(c) is dict or type(c) is list]
        if not below:
            return True
        level = below
    return False


_CONTAINERS = frozenset((dict, list))


def parse_for_routing(
    raw: bytes, kind: Kind, salt_from_header: str | None, header_wins: bool, slim: bool
) -> tuple[ParsedRequest, bytes]:
    """The parsed request and the body to forward: with the gateway's salt in it where that
    wins over the body's (the engine isolates its cache by the body's salt). `slim`: the
    prompt's parts leave the parsed body (nothing after the canonical bytes reads them), so
    little crosses back when this runs in another process (offload.py)."""
    parsed = parse_request(raw, kind, salt_from_header, header_wins)
    body = parsed.body
    sent = parsed.responses.pop("body") if parsed.responses else body  # the body as sent
    if salt_from_header is not None and header_wins and sent.get("cache_salt") != salt_from_header:
        sent["cache_salt"] = body["cache_salt"] = salt_from_header
        raw = json.dumps(sent).encode()
    if slim:
        parsed.body = {k: v for k, v in body.items() if k not in _PROMPT_FIELDS}
    return parsed, raw


_PROMPT_FIELDS = frozenset(("messages", "prompt", "tools", "input", "instructions"))


def _parse_body(
    body: Any, kind: Kind, salt_from_header: str | None, header_wins: bool
) -> ParsedRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a string", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    responses = None
    media: list[Media] = []
    if kind == "responses":
        try:
            chat = responses_chat(body)
        except PromptError as exc:
            raise RequestError(400, str(exc), param=exc.param) from None
        prev = body.get("previous_response_id")
        if prev is not None and not isinstance(prev, str):
            raise RequestError(400, "'previous_response_id' must be a string",
                               param="previous_response_id")  # fmt: skip
        responses = {"previous_response_id": prev, "store": body.get("store", True) is not False,
                     "background": body.get("background") is True, "body": body}  # fmt: skip
        # the tokenizer renders the chat this request is; the engine gets the body as sent
        body = {**body, **chat}
        canonical = canonical_chat(chat["messages"], chat["tools"], media)
        kind = "chat"
    elif kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(
                400, "'messages' is required and must be a non-empty list", param="messages"
            )
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RequestError(400, "'tools' must be a list", param="tools")
        canonical = canonical_chat(messages, tools, media)
    else:
        if "prompt" not in body or body["prompt"] in (None, "", []):
            raise RequestError(400, "'prompt' is required", param="prompt")
        canonical = canonical_prompt(body["prompt"])
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise RequestError(400, "'cache_salt' must be a string", param="cache_salt")
    if salt_from_header is not None and (salt is None or header_wins):
        salt = salt_from_header
    if salt is not None:
        salt.encode()  # the key's seed is made of it: refuse what cannot be encoded, here
    opts = body.get("stream_options")
    include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return ParsedRequest(
        kind=kind,
        model=model,
        stream=stream,
        body=body,
        canonical=canonical,
        cache_salt=salt,
        include_usage=include_usage,
        responses=responses,
        media=tuple(media),
    )


def next_turn_canonical(parsed: ParsedRequest, answer: str) -> bytes:
    """Canonical bytes the next turn of this conversation will start with."""
    if parsed.kind == "chat":
        return parsed.canonical + canonical_chat([{"role": "assistant", "content": answer}])
    return parsed.canonical + answer.encode()
