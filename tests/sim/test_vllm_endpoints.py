"""vLLM's own endpoints on a real simulator process: rerank, score, pooling, classify, tokenize,
detokenize, version (plain aiohttp), and speech-to-text as multipart uploads (`curl -F` and the
openai client)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from bench.harness.fleet import Fleet, Proc, free_port


async def start_sim(fleet: Fleet, extra: list[str] | None = None) -> Proc:
    port = free_port()
    args = [
        sys.executable, "-m", "engine_sim", "--host", "127.0.0.1", "--port", str(port),
        "--model", "m", "--kv-capacity-tokens", "50000", "--profile", "fast", *(extra or []),
    ]  # fmt: skip
    return await fleet.start("sim0", args, port, "/health")


async def post(sim: Proc, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(sim.url + path, json=body) as r:
        return r.status, await r.json()


def is_error(body: Any, code: int) -> bool:
    # vLLM's ErrorResponse
    e = body["error"]
    return set(e) == {"message", "type", "param", "code"} and e["code"] == code


DOCS = ["a cat sat on the mat", "stock prices fell today", "the cat sat on a warm mat"]


async def test_rerank_score_pooling_classify_at_vllms_paths(fleet: Fleet) -> None:
    sim = await start_sim(fleet)
    query = "where the cat sat on the mat"
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, body = await post(sim, path, {"model": "m", "query": query, "documents": DOCS})
        assert status == 200 and body["id"].startswith("rerank-") and body["model"] == "m"
        order = [r["index"] for r in body["results"]]
        scores = [r["relevance_score"] for r in body["results"]]
        assert scores == sorted(scores, reverse=True) and order[-1] == 1  # the stock news
        assert body["results"][0]["document"]["text"] == DOCS[order[0]]
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
    _, top = await post(sim, "/rerank", {"model": "m", "query": query, "documents": DOCS,
                                          "top_n": 1})  # fmt: skip
    assert [r["index"] for r in top["results"]] == [order[0]]

    for path in ("/score", "/v1/score"):
        status, body = await post(sim, path, {"model": "m", "text_1": query, "text_2": DOCS})
        assert status == 200 and body["object"] == "list"
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        assert [d["object"] for d in body["data"]] == ["score"] * 3
        assert all(0.0 <= d["score"] <= 1.0 for d in body["data"])
    _, n_to_n = await post(sim, "/score", {"model": "m", "text_1": DOCS, "text_2": DOCS})
    assert [round(d["score"], 6) for d in n_to_n["data"]] == [1.0] * 3  # each with itself
    status, body = await post(sim, "/score", {"model": "m", "text_1": DOCS[:2], "text_2": DOCS})
    assert status == 400 and is_error(body, 400)
    assert body["error"]["message"] == "Input lengths must be either 1:1, 1:N or N:N"

    status, body = await post(sim, "/pooling", {"model": "m", "input": ["one", "two"]})
    assert status == 200 and body["id"].startswith("pool-")
    assert [d["object"] for d in body["data"]] == ["pooling"] * 2
    assert len(body["data"][0]["data"]) == 256
    status, body = await post(sim, "/classify", {"model": "m", "input": "one"})
    assert status == 200 and body["id"].startswith("classify-")
    (d,) = body["data"]
    assert d["num_classes"] == 2 and d["label"] in ("LABEL_0", "LABEL_1")
    assert sum(d["probs"]) == pytest.approx(1.0)

    status, body = await post(sim, "/v1/embeddings", {"model": "nope", "input": "x"})
    assert status == 404 and is_error(body, 404) and body["error"]["param"] == "model"
    status, body = await post(sim, "/v1/embeddings", {"model": "m", "input": 5})
    assert status == 400 and is_error(body, 400)
    status, body = await post(sim, "/v1/embeddings", {"model": "m", "input": "x" * 200_000})
    assert status == 400 and "maximum context length" in body["error"]["message"]


async def test_tokenize_detokenize_version(fleet: Fleet) -> None:
    sim = await start_sim(fleet, ["--tokenizer", "tiny"])
    status, tok = await post(sim, "/tokenize", {"model": "m", "prompt": "hello world"})
    assert status == 200 and set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
    status, text = await post(sim, "/detokenize", {"model": "m", "tokens": tok["tokens"]})
    assert status == 200 and text["prompt"].strip() == "hello world"
    status, body = await post(sim, "/detokenize", {"model": "m", "tokens": [-1]})
    assert status == 400 and is_error(body, 400)
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/version") as r:
        assert r.status == 200 and isinstance((await r.json())["version"], str)


async def test_detokenize_answers_with_the_byte_tokenizer_too(fleet: Fleet) -> None:
    sim = await start_sim(fleet)
    status, body = await post(sim, "/detokenize", {"model": "m", "tokens": [104, 105]})
    assert status == 200 and isinstance(body["prompt"], str)


async def curl(*args: str) -> tuple[int, bytes]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-w", "\n%{http_code}", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    body, _, code = out.rpartition(b"\n")
    return int(code), body


async def test_speech_to_text_takes_multipart_uploads(fleet: Fleet, tmp_path: Path) -> None:
    sim = await start_sim(fleet, ["--max-audio-filesize-mb", "1"])
    audio = tmp_path / "clip.wav"
    audio.write_bytes(bytes(range(256)) * 500)  # 128,000 bytes: 4 s at 16 kHz 16-bit
    url = sim.url + "/v1/audio/transcriptions"
    code, body = await curl(url, "-F", f"file=@{audio}", "-F", "model=m")
    assert code == 200
    first = json.loads(body)
    assert first["text"] and first["usage"] == {"type": "duration", "seconds": 4}
    code, body = await curl(url, "-F", f"file=@{audio}", "-F", "model=m")
    assert json.loads(body)["text"] == first["text"]  # the same audio, the same words
    other = tmp_path / "other.wav"
    other.write_bytes(bytes(range(255, -1, -1)) * 500)
    code, body = await curl(url, "-F", f"file=@{other}", "-F", "model=m")
    assert json.loads(body)["text"] != first["text"]

    code, body = await curl(url, "-F", f"file=@{audio}", "-F", "response_format=text")
    assert code == 200 and body.decode() == first["text"]
    code, body = await curl(
        sim.url + "/v1/audio/translations", "-F", f"file=@{audio}", "-F", "model=m"
    )
    assert code == 200 and set(json.loads(body)) == {"text"}
    code, body = await curl(url, "-F", f"file=@{audio}", "-F", "stream=true")
    lines = [ln[6:] for ln in body.decode().split("\n") if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert {c["object"] for c in chunks} == {"transcription.chunk"}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == first["text"]

    big = tmp_path / "big.wav"
    big.write_bytes(b"\0" * (2 * 1024 * 1024))
    code, body = await curl(url, "-F", f"file=@{big}", "-F", "model=m")
    err = json.loads(body)["error"]
    assert code == 400 and err["message"] == "Maximum file size exceeded"
    code, body = await curl(url, "-F", "model=m")
    assert code == 400 and json.loads(body)["error"]["param"] == "file"
    code, body = await curl(url, "-F", f"file=@{audio}", "-F", "model=nope")
    assert code == 404

    def with_client() -> str:
        c = openai.OpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0)
        with audio.open("rb") as f:
            return c.audio.transcriptions.create(model="m", file=f).text

    assert await asyncio.to_thread(with_client) == first["text"]


async def test_metrics_show_a_restart_and_a_cache_reset(fleet: Fleet) -> None:
    """What a router reads to tell an engine emptied behind the same address (restarts.py):
    the process start time changes across a restart, the reset counter grows on a reset."""
    from prefix_router.restarts import read_vitals

    sim = await start_sim(fleet)

    async def vitals():
        async with aiohttp.ClientSession() as s, s.get(sim.url + "/metrics") as r:
            return read_vitals(await r.read())

    before = await vitals()
    assert before.started is not None and before.resets == 0
    status, _ = await post(sim, "/reset_prefix_cache", {})
    assert status == 200
    reset = await vitals()
    assert reset.resets == 1 and reset.started == before.started
    await fleet.restart(sim)
    after = await vitals()
    assert after.started is not None and after.started > before.started


async def test_sleep_discards_the_cache_and_shows_in_the_sleep_state(fleet: Fleet) -> None:
    from prefix_router.restarts import read_vitals

    sim = await start_sim(fleet)
    async with aiohttp.ClientSession() as s:

        async def vitals():
            async with s.get(sim.url + "/metrics") as r:
                return read_vitals(await r.read())

        async def sleeping() -> bool:
            async with s.get(sim.url + "/is_sleeping") as r:
                return (await r.json())["is_sleeping"]

        assert (await vitals()).awake == 1 and not await sleeping()
        async with s.post(sim.url + "/sleep?level=1") as r:
            assert r.status == 200
        v = await vitals()
        assert (v.awake, v.resets) == (0, 1) and await sleeping()
        async with s.post(sim.url + "/sleep?level=3") as r:
            assert r.status == 400
        async with s.post(sim.url + "/wake_up") as r:
            assert r.status == 200
        assert (await vitals()).awake == 1 and not await sleeping()
