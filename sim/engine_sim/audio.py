"""vLLM's speech-to-text endpoints: /v1/audio/transcriptions and /v1/audio/translations.

The body is multipart/form-data with a `file` part and form fields, as the openai client and
`curl -F` send it. The upload is read part by part and the file in chunks (never the whole body
at once), hashed as it comes, and refused past vLLM's size limit (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB,
25 MB by default). The "transcript" is a deterministic text made from the file's hash and
length, so the same audio always gives the same words. Duration is the file's length at 16 kHz
16-bit mono (32,000 bytes a second).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

import xxhash
from aiohttp import BodyPartReader, web

from .server import CONF, BadRequest, _check_model

BYTES_PER_SECOND = 32_000
_CHUNK = 64 * 1024
_WORDS = (
    "the",
    "engine",
    "simulates",
    "a",
    "voice",
    "that",
    "reads",
    "tokens",
    "from",
    "audio",
    "cache",
    "prefix",
    "router",
    "kernel",
    "block",
    "stream",
    "answer",
    "quiet",
    "signal",
    "model",
)
_FORMATS = ("json", "text", "verbose_json")


def transcript(digest: int, size: int) -> str:
    """A few words a second of audio (at least three), picked by the file's hash."""
    n = max(3, min(200, math.ceil(size / BYTES_PER_SECOND) * 2))
    words = []
    h = digest
    for i in range(n):
        if i % 16 == 0:
            h = xxhash.xxh64_intdigest(i.to_bytes(4, "little"), seed=digest)
        words.append(_WORDS[h % len(_WORDS)])
        h //= len(_WORDS)
    return " ".join(words).capitalize() + "."


async def _read_form(request: web.Request, max_bytes: int) -> tuple[dict[str, str], int, int]:
    """The form's fields, and the file's hash and size, read a chunk at a time."""
    if not request.content_type.startswith("multipart/form-data"):
        raise BadRequest("the body must be multipart/form-data with a file part", param="file")
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError) as e:
        raise BadRequest(f"the multipart body cannot be read: {e}", param="file") from None
    fields: dict[str, str] = {}
    digest = size = None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise BadRequest("nested multipart bodies are not supported", param="file")
        if part.name == "file" and part.filename is not None:
            h = xxhash.xxh64()
            size = 0
            while chunk := await part.read_chunk(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise BadRequest("Maximum file size exceeded", param="audio_filesize_mb")
                h.update(chunk)
            digest = h.intdigest()
        elif part.name == "file":
            # vLLM (a 422 there): a form field named file is text, not an upload
            raise BadRequest("Expected 'file' to be a file-like object, not 'str'.", 422, "file")
        elif part.name:
            fields[part.name] = await part.text()
    if digest is None or size is None:
        raise BadRequest("file is required (a multipart part named file)", param="file")
    return fields, digest, size


def _bool(fields: dict[str, str], name: str) -> bool:
    value = fields.get(name, "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise BadRequest(f"{name} must be a boolean", param=name)
    return value in ("true", "1")


async def _speech_to_text(request: web.Request, kind: str) -> web.StreamResponse:
    conf = request.app[CONF]
    fields, digest, size = await _read_form(request, conf["max_audio_bytes"])
    model = _check_model(request, dict(fields))
    fmt = fields.get("response_format", "json")
    if fmt not in _FORMATS:
        raise BadRequest(
            "Currently only support response_format `text`, `json` or `verbose_json`",
            param="response_format",
        )
    stream = _bool(fields, "stream")
    for opt in ("stream_include_usage", "stream_continuous_usage_stats"):
        if _bool(fields, opt) and not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.", param=opt)
    text = transcript(digest, size)
    seconds = math.ceil(size / BYTES_PER_SECOND)
    if stream:
        return await _stream(request, kind, model, text, _bool(fields, "stream_include_usage"))
    if fmt == "text":
        return web.Response(text=text, content_type="text/plain")
    if fmt == "verbose_json":
        return web.json_response(
            {
                "duration": str(float(seconds)),
                "language": fields.get("language") or "en",
                "text": text,
                "segments": [
                    {
                        "id": 0,
                        "avg_logprob": 0.0,
                        "compression_ratio": 1.0,
                        "end": float(seconds),
                        "no_speech_prob": None,
                        "seek": 0,
                        "start": 0.0,
                        "temperature": 0.0,
                        "text": text,
                        "tokens": [],
                    }
                ],
                "words": None,
            }
        )
    if kind == "translation":
        return web.json_response({"text": text})
    return web.json_response({"text": text, "usage": {"type": "duration", "seconds": seconds}})


async def _stream(
    request: web.Request, kind: str, model: str, text: str, include_usage: bool
) -> web.StreamResponse:
    """vLLM's streamed transcription: chat-like chunks, one a word, then [DONE]."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    head = {
        "id": ("trsc-" if kind == "transcription" else "trsl-") + uuid.uuid4().hex,
        "object": f"{kind}.chunk",
        "created": int(time.time()),
        "model": model,
    }
    words = text.split(" ")
    for i, word in enumerate(words):
        last = i == len(words) - 1
        delta = {"content": word if i == 0 else " " + word}
        choice: dict[str, Any] = {
            "delta": delta,
            "finish_reason": "stop" if last else None,
            "stop_reason": None,
        }
        await resp.write(b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n")
    if include_usage:
        # vLLM counts the prompt (the audio's encoder tokens) and the words it generated
        usage = {"prompt_tokens": 0, "completion_tokens": len(words), "total_tokens": len(words)}
        chunk = {**head, "choices": [], "usage": usage}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _speech_to_text(request, "transcription")


async def translations(request: web.Request) -> web.StreamResponse:
    return await _speech_to_text(request, "translation")


def add_routes(app: web.Application, *, max_audio_bytes: int) -> None:
    app[CONF]["max_audio_bytes"] = max_audio_bytes
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
