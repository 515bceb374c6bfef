"""The OpenAI-compatible wire format: request validation and response bodies, no I/O.

Errors follow vLLM's current shape: {"error": {"message", "type", "param", "code"}} with the
HTTP status as `code` and `type` BadRequestError (400) or NotFoundError (404). Older vLLM
releases used a flat {"object": "error", ...} body; clients read both through "message".
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .chat import render_chat, validate_messages
from .tokenizer import tokenize

DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        names = {400: "BadRequestError", 404: "NotFoundError"}
        return names.get(self.status, "InternalServerError")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


@dataclass(frozen=True)
class GenerateRequest:
    kind: str  # "completion" or "chat"
    model: str
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    seed: int | None


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"Invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_token_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(t) and t >= 0 for t in v)


def check_model(body: dict[str, Any], served: list[str]) -> str:
    """The model name to answer with; vLLM serves the default model when none is named."""
    model = body.get("model")
    if model is None:
        return served[0]
    if not isinstance(model, str):
        raise bad("model must be a string", "model")
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    return served[0]


def completion_prompt(body: dict[str, Any]) -> list[int]:
    if "prompt" not in body or body["prompt"] is None:
        raise bad("Either prompt or prompt_embeds must be provided.", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenize(prompt)
    if _is_token_list(prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise bad("engine-sim serves one prompt a request; send a batch as separate requests.")
    raise bad("prompt must be a string, a list of one string, or a list of token ids", "prompt")


def chat_prompt(body: dict[str, Any]) -> list[int]:
    messages = body.get("messages")
    if messages is None:
        raise bad("messages is required", "messages")
    why = validate_messages(messages)
    if why:
        raise bad(why, "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools must be a list", "tools")
    return tokenize(render_chat(messages, tools or None))


def _max_tokens(body: dict[str, Any], kind: str) -> int:
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v):
            raise bad(f"{name} must be an integer", name)
        if v < 1:
            raise bad(f"{name} must be at least 1, got {v}.", name)
        return v
    return DEFAULT_MAX_TOKENS


def parse_generate(
    body: dict[str, Any], kind: str, served: list[str], max_model_len: int
) -> GenerateRequest:
    model = check_model(body, served)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream must be a boolean", "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    if opts and not stream:
        raise bad("Stream options can only be defined when `stream=True`.", "stream_options")
    include_usage = bool(opts and opts.get("include_usage"))
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise bad("engine-sim supports n=1 only", "n")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad("seed must be an integer", "seed")
    max_tokens = _max_tokens(body, kind)
    prompt_ids = completion_prompt(body) if kind == "completion" else chat_prompt(body)
    if not prompt_ids:
        raise bad("The decoder prompt cannot be empty", "prompt")
    if len(prompt_ids) + max_tokens > max_model_len:
        where = "messages" if kind == "chat" else "prompt"
        raise bad(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the "
            f"{where}, {max_tokens} in the completion). Please reduce the length of the "
            f"{where} or completion.",
            where,
        )
    return GenerateRequest(kind, model, prompt_ids, max_tokens, stream, include_usage, seed)


def parse_tokenize(body: dict[str, Any], served: list[str]) -> list[int]:
    check_model(body, served)
    if "messages" in body:
        messages = body["messages"]
        why = validate_messages(messages)
        if why:
            raise bad(why, "messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise bad("tools must be a list", "tools")
        return tokenize(render_chat(messages, tools or None))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad("prompt (a string) or messages is required", "prompt")
    return tokenize(prompt)


# ---- responses ------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def full_response(
    req: GenerateRequest, rid: str, text: str, prompt: int, completion: int, cached: int
) -> dict[str, Any]:
    created = int(time.time())
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(prompt, completion, cached),
    }


class ChunkWriter:
    """SSE chunks of one streamed response, in vLLM's layout."""

    def __init__(self, req: GenerateRequest, rid: str) -> None:
        self.req = req
        self.rid = rid
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"

    def _event(self, choices: list[dict[str, Any]], usage_: dict[str, Any] | None = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.rid,
            "object": self.obj,
            "created": self.created,
            "model": self.req.model,
            "choices": choices,
        }
        if self.req.include_usage:
            chunk["usage"] = usage_
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        """Chat streams open with the assistant role, as vLLM's do."""
        delta = {"role": "assistant", "content": ""}
        return self._event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def piece(self, text: str, last: bool) -> bytes:
        finish = "length" if last else None
        if self.req.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if last:
            choice["stop_reason"] = None
        return self._event([choice])

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        return self._event([], usage(prompt, completion, cached))

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
