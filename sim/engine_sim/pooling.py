"""vLLM's pooling endpoints: /v1/embeddings, /pooling, /classify, /score (+ /v1/score) and
/rerank (+ /v1/rerank, /v2/rerank), with vLLM's field names, ids and error messages.

A pooled vector is made from the input's tokens (the simulator's tokenizer, real or bytes) by
feature hashing: each token adds +-1 to a few coordinates chosen by its hash, the sum is
L2-normalised. It is deterministic, of a fixed dimension, and texts that share tokens point the
same way, so a score (the cosine, mapped to [0, 1] as a cross-encoder's sigmoid would be) and a
rerank order mean something. Nothing here touches the engine's batch or KV cache: vLLM serves
pooling with a pooling model, not the generative one this simulates.
"""

from __future__ import annotations

import base64
import math
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any

import xxhash
from aiohttp import web

from .server import CONF, BadRequest, _body, _check_model, _flag, prompt_of
from .tokenizer import VOCAB_SIZE, tokenize, tokenize_bytes

# Coordinates each token touches: enough that two different tokens rarely cancel out.
_TOUCHES = 4
LABELS = ("LABEL_0", "LABEL_1")


# -- vectors (pure) -------------------------------------------------------------------------
def pooled(
    ids: list[int], model_dim: int, dim: int | None = None, normalize: bool = True
) -> list[float]:
    """The first `dim` coordinates of the input's vector of `model_dim` (a matryoshka prefix
    when `dim` is smaller), L2-normalised, or the mean over tokens without `normalize`."""
    full = model_dim
    dim = model_dim if dim is None else dim
    v = [0.0] * dim
    for t in ids:
        h = xxhash.xxh64_intdigest(t.to_bytes(4, "little"))
        for k in range(_TOUCHES):
            bits = h >> (16 * k)
            i = (bits >> 1) % full
            if i < dim:
                v[i] += 1.0 if bits & 1 else -1.0
    if not normalize:
        return [x / len(ids) for x in v] if ids else v
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v] if norm else v


def cosine(a: list[float], b: list[float]) -> float:
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb) if na and nb else 0.0


def relevance(a: list[float], b: list[float], activation: bool = True) -> float:
    c = cosine(a, b)
    return (1.0 + c) / 2.0 if activation else c


def class_probs(v: list[float], activation: bool = True) -> list[float]:
    logits = [sum(v[0::2]), sum(v[1::2])]
    if not activation:
        return logits
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    return [e / sum(exps) for e in exps]


def encode_vector(v: list[float], fmt: str) -> list[float] | str:
    """float: a JSON list; base64: float32 in this machine's byte order (vLLM's default,
    what the openai client decodes)."""
    if fmt == "float":
        return v
    return base64.b64encode(array("f", v).tobytes()).decode()


# -- requests -------------------------------------------------------------------------------
def _vocab(app: web.Application) -> int:
    tok = app[CONF]["tokenizer"]
    return VOCAB_SIZE if tok is None else tok.vocab_size


@dataclass
class Prompt:
    """One input: its token ids (what usage counts and truncation cuts) and the features its
    vector is made of: the ids themselves, except with the byte tokenizer, whose 4-byte
    tokens depend on where a word falls; there every 4-byte window of the text is one, so two
    texts that share words share features wherever the words are."""

    ids: list[int]
    features: list[int]

    def last(self, n: int) -> Prompt:
        if n >= len(self.ids):
            return self
        per_token = max(1, len(self.features) // max(1, len(self.ids)))
        return Prompt(self.ids[-n:] if n else [], self.features[-n * per_token :] if n else [])


def _windows(data: bytes) -> list[int]:
    h = xxhash.xxh32_intdigest
    return [h(data[i : i + 4]) for i in range(max(0, len(data) - 3))] or tokenize_bytes(data)


def _text(app: web.Application, text: str, add_special_tokens: bool) -> Prompt:
    tok = app[CONF]["tokenizer"]
    if tok is None:
        return Prompt(tokenize(text), _windows(text.encode()))
    ids = tok.encode(text, add_special_tokens)
    return Prompt(ids, ids)


def _is_ids(x: Any) -> bool:
    return (
        isinstance(x, list)
        and bool(x)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
    )


def _inputs(app: web.Application, body: dict[str, Any]) -> list[Prompt]:
    """Each prompt of a pooling request: `input` (a string, strings, token ids or lists of
    them) or `messages` (one chat, rendered without the generation prompt)."""
    if "messages" in body:
        chat = {**body, "add_generation_prompt": body.get("add_generation_prompt", False)}
        prompt, ids, _, _ = prompt_of(app, chat, chat=True)
        if ids is not None:
            return [Prompt(ids, ids)]
        return [Prompt(tokenize_bytes(prompt), _windows(prompt))]
    x = body.get("input")
    special = _flag(body, "add_special_tokens", True)
    if isinstance(x, str):
        return [_text(app, x, special)]
    if _is_ids(x):
        x = [x]
    if isinstance(x, list) and x and all(isinstance(p, str) for p in x):
        return [_text(app, p, special) for p in x]
    if isinstance(x, list) and x and all(_is_ids(p) for p in x):
        vocab = _vocab(app)
        for p in x:
            for t in p:
                if not 0 <= t < vocab:
                    raise BadRequest(f"Token id {t} is out of vocabulary", param="input")
        return [Prompt(list(p), list(p)) for p in x]
    raise BadRequest(
        "input must be a string, a list of strings, a list of token ids or a list of them",
        param="input",
    )


def _checked(
    app: web.Application, body: dict[str, Any], prompts: list[Prompt], op: str
) -> list[Prompt]:
    """vLLM's truncation (keep the last n tokens) and context-length check."""
    limit = app[CONF]["max_model_len"]
    n = body.get("truncate_prompt_tokens")
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < -1:
            raise BadRequest("truncate_prompt_tokens must be an integer >= -1")
        if n > limit:
            raise BadRequest(
                "truncate_prompt_tokens value is greater than max_model_len. "
                "Please, select a smaller truncation size."
            )
        prompts = [p.last(limit if n == -1 else n) for p in prompts]
    for p in prompts:
        if len(p.ids) > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {len(p.ids)} tokens in the input for {op}. Please reduce the length "
                "of the input.",
                param="input_tokens",
            )
    return prompts


def _tokens(prompts: list[Prompt]) -> int:
    return sum(len(p.ids) for p in prompts)


def _usage(n: int) -> dict[str, Any]:
    return {
        "prompt_tokens": n,
        "total_tokens": n,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def _format(body: dict[str, Any]) -> str:
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest(
            f"encoding_format {fmt!r} is not supported by the simulator (float, base64)",
            param="encoding_format",
        )
    if body.get("embed_dtype", "float32") != "float32":
        raise BadRequest("the simulator encodes float32 only", param="embed_dtype")
    return fmt


def _dimensions(app: web.Application, body: dict[str, Any], model: str) -> int:
    dim = app[CONF]["embedding_dim"]
    d = body.get("dimensions")
    if d is None:
        return dim
    if not isinstance(d, int) or isinstance(d, bool) or d < 1:
        raise BadRequest("Dimensions must be greater than 0", param="dimensions")
    if d > dim:
        raise BadRequest(
            f'Model "{model}" only supports dimensions up to {dim}.', param="dimensions"
        )
    return d


def _activation(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", param=name)
    return value


def _vectors(
    app: web.Application, prompts: list[Prompt], dim: int, normalize: bool = True
) -> list[list[float]]:
    return [pooled(p.features, app[CONF]["embedding_dim"], dim, normalize) for p in prompts]


def _head(prefix: str, model: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
    }


async def embeddings(request: web.Request) -> web.Response:
    app = request.app
    body = await _body(request)
    model = _check_model(request, body)
    fmt = _format(body)
    dim = _dimensions(app, body, model)
    normalize = _activation(body, "normalize")
    prompts = _checked(app, body, _inputs(app, body), "embedding generation")
    data = [
        {"index": i, "object": "embedding", "embedding": encode_vector(v, fmt)}
        for i, v in enumerate(_vectors(app, prompts, dim, normalize))
    ]
    n = _tokens(prompts)
    return web.json_response({**_head("embd", model), "data": data, "usage": _usage(n)})


async def pooling(request: web.Request) -> web.Response:
    app = request.app
    body = await _body(request)
    model = _check_model(request, body)
    task = body.get("task") or "embed"
    if task not in ("embed", "classify", "token_embed"):
        raise BadRequest(
            f"Task {task} is not supported by the simulator (embed, classify, token_embed)",
            param="task",
        )
    fmt = _format(body)
    dim = _dimensions(app, body, model)
    prompts = _checked(app, body, _inputs(app, body), "embedding generation")
    data: list[dict[str, Any]] = []
    for i, p in enumerate(prompts):
        out: Any
        if task == "embed":
            out = encode_vector(_vectors(app, [p], dim)[0], fmt)
        elif task == "classify":
            v = pooled(p.features, app[CONF]["embedding_dim"])
            out = class_probs(v, _activation(body, "use_activation"))
        else:  # one vector a token
            out = [_vectors(app, [Prompt([t], [t])], dim)[0] for t in p.ids]
        data.append({"index": i, "object": "pooling", "data": out})
    n = _tokens(prompts)
    return web.json_response({**_head("pool", model), "data": data, "usage": _usage(n)})


async def classify(request: web.Request) -> web.Response:
    app = request.app
    body = await _body(request)
    model = _check_model(request, body)
    activation = _activation(body, "use_activation")
    prompts = _checked(app, body, _inputs(app, body), "classification")
    data = []
    for i, p in enumerate(prompts):
        probs = class_probs(pooled(p.features, app[CONF]["embedding_dim"]), activation)
        label = LABELS[max(range(len(probs)), key=probs.__getitem__)]
        data.append({"index": i, "label": label, "probs": probs, "num_classes": len(probs)})
    n = _tokens(prompts)
    return web.json_response({**_head("classify", model), "data": data, "usage": _usage(n)})


def _texts(value: Any, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise BadRequest(
        f"{name} must be a string or a list of strings (the simulator scores text only)",
        param=name,
    )


def _pairs(left: list[str], right: list[str]) -> list[tuple[str, str]]:
    if len(left) > 1 and len(left) != len(right):
        raise BadRequest("Input lengths must be either 1:1, 1:N or N:N")
    if not left:
        raise BadRequest("At least one text element must be given")
    if not right:
        raise BadRequest("At least one text_pair element must be given")
    return list(zip(left * len(right) if len(left) == 1 else left, right, strict=True))


def _scores(app, body, pairs) -> tuple[list[float], int]:
    """Each pair's relevance and the tokens read (both sides of every pair)."""
    dim = app[CONF]["embedding_dim"]
    special = _flag(body, "add_special_tokens", True)
    activation = _activation(body, "use_activation")
    scores, n = [], 0
    for a, b in pairs:
        pa, pb = _checked(app, body, [_text(app, a, special), _text(app, b, special)], "score")
        n += len(pa.ids) + len(pb.ids)
        scores.append(relevance(pooled(pa.features, dim), pooled(pb.features, dim), activation))
    return scores, n


# vLLM's score request shapes: the first field of each pair names the left side.
_SCORE_FIELDS = (
    ("data_1", "data_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("text_1", "text_2"),
)


async def score(request: web.Request) -> web.Response:
    app = request.app
    body = await _body(request)
    model = _check_model(request, body)
    for left, right in _SCORE_FIELDS:
        if left in body and right in body:
            break
    else:
        raise BadRequest("a score request needs text_1 and text_2 (or queries and documents)")
    pairs = _pairs(_texts(body[left], left), _texts(body[right], right))
    scores, n = _scores(app, body, pairs)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    return web.json_response({**_head("score", model), "data": data, "usage": _usage(n)})


async def rerank(request: web.Request) -> web.Response:
    app = request.app
    body = await _body(request)
    model = _check_model(request, body)
    query = body.get("query")
    if not isinstance(query, str):
        raise BadRequest("query must be a string", param="query")
    docs = _texts(body.get("documents"), "documents")
    top_n = body.get("top_n", 0)
    if not isinstance(top_n, int) or isinstance(top_n, bool):
        raise BadRequest("top_n must be an integer", param="top_n")
    scores, n = _scores(app, body, _pairs([query], docs))
    results = [
        {"index": i, "document": {"text": d, "multi_modal": None}, "relevance_score": s}
        for i, (d, s) in enumerate(zip(docs, scores, strict=True))
    ]
    results.sort(key=lambda r: r["relevance_score"], reverse=True)
    if 0 < top_n < len(results):
        results = results[:top_n]
    return web.json_response(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": model,
            "usage": {"prompt_tokens": n, "total_tokens": n},
            "results": results,
        }
    )


def add_routes(app: web.Application, *, embedding_dim: int) -> None:
    app[CONF]["embedding_dim"] = embedding_dim
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/pooling", pooling)
    app.router.add_post("/classify", classify)
    for path in ("/score", "/v1/score"):
        app.router.add_post(path, score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.router.add_post(path, rerank)
