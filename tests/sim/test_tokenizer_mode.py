"""The simulator with a real Hugging Face tokenizer: vLLM's prompt rendering and tokenization,
cached tokens that match what the engine's events say it holds, LoRA and cache salts, and a
process restart that starts the event sequence again."""

from __future__ import annotations

import json
import random
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from kvsub import Subscriber, event_type

from bench.harness.fleet import Fleet, free_port
from engine_sim.engine import Engine
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
from engine_sim.kvcache import TokenBlockHasher
from engine_sim.kvevents import KVEventPublisher, KVEventsConfig
from engine_sim.profiles import PROFILES
from engine_sim.sequences import LoRA, TokenSequences
from engine_sim.server import build_app

B = 16


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(TINY_TOKENIZER)


async def _client(tok: ChatTokenizer, *, details: bool = True, events=None, loras=()) -> TestClient:
    engine = Engine(
        PROFILES["fast"],
        50_000,
        B,
        sequences=TokenSequences(tok, TokenBlockHasher(B)),
        preemption="recompute",
        events=events,
    )
    app = build_app(
        model="m",
        served=["m"],
        engine=engine,
        max_model_len=8192,
        replica_id="r0",
        tokenizer=tok,
        loras=list(loras),
        enable_prompt_tokens_details=details,
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def _publisher() -> KVEventPublisher:
    conf = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
    )
    conf.publisher = "zmq"
    return KVEventPublisher(conf, "map", B)


def test_encoding_in_pieces_equals_a_plain_encode(tok: ChatTokenizer) -> None:
    rng = random.Random(7)
    specials = ["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>"]
    alphabet = [*"ab cd\n\tXY!?é✓1", *specials]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        for special in (True, False):
            plain = tok.tokenizer.encode(text, add_special_tokens=special).ids
            assert tok.encode(text, special) == plain
            assert tok.encode(text, special) == plain  # from the piece cache this time


async def test_chat_history_is_a_prefix_of_the_next_turn_in_token_ids(tok) -> None:
    client = await _client(tok)
    try:
        turn1 = [
            {"role": "system", "content": "You answer in short words. " * 8},
            {"role": "user", "content": "What is a prefix cache?"},
        ]
        r1 = await (await client.post("/v1/chat/completions", json={"messages": turn1})).json()
        answer = r1["choices"][0]["message"]["content"]
        turn2 = [
            *turn1,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "ok"},
        ]
        ids1 = (await (await client.post("/tokenize", json={"messages": turn1})).json())["tokens"]
        ids2 = (await (await client.post("/tokenize", json={"messages": turn2})).json())["tokens"]
        n_out = r1["usage"]["completion_tokens"]
        assert n_out == 16
        assert ids2[: len(ids1)] == ids1
        # the answer re-tokenizes to the ids the engine generated, right after the prompt
        assert ids2[len(ids1) : len(ids1) + n_out] == tok.encode(answer)
        assert len(tok.encode(answer)) == n_out
        eot = tok.tokenizer.token_to_id("<|eot_id|>")
        assert ids2[len(ids1) + n_out] == eot
        bos = tok.tokenizer.token_to_id("<|begin_of_text|>")
        assert ids1[0] == bos and ids1.count(bos) == 1  # the template's BOS, not a second one
    finally:
        await client.close()


async def test_completion_prompts_get_the_bos_and_token_prompts_are_taken_as_is(tok) -> None:
    client = await _client(tok)
    try:
        bos = tok.tokenizer.token_to_id("<|begin_of_text|>")
        got = await (await client.post("/tokenize", json={"prompt": "hello world"})).json()
        plain = tok.tokenizer.encode("hello world", add_special_tokens=False).ids
        assert got["tokens"] == [bos, *plain]
        r = await (await client.post("/v1/completions", json={"prompt": "hello world"})).json()
        assert r["usage"]["prompt_tokens"] == got["count"]
        ids = [5, 6, 7]
        r = await (await client.post("/v1/completions", json={"prompt": ids})).json()
        assert r["usage"]["prompt_tokens"] == 3
        bad = await client.post("/v1/completions", json={"prompt": [tok.vocab_size]})
        assert bad.status == 400
        text = await (await client.post("/detokenize", json={"tokens": got["tokens"]})).json()
        assert text["prompt"] == "hello world"
    finally:
        await client.close()


def _consumer_index(events: list[dict[str, Any]]) -> set[tuple[int, ...]]:
    """What a consumer's index holds after these events, keyed by its own key (here the
    token prefix itself): vLLM's hashes only link a block to its parent and name removals."""
    prefix_of: dict[int, tuple[int, ...]] = {}
    held: set[tuple[int, ...]] = set()
    for ev in events:
        kind = event_type(ev)
        if kind == "BlockStored":
            parent = ev["parent_block_hash"]
            prefix = () if parent is None else prefix_of[parent]
            for i, h in enumerate(ev["block_hashes"]):
                prefix = prefix + tuple(ev["token_ids"][i * B : (i + 1) * B])
                prefix_of[h] = prefix
                held.add(prefix)
        elif kind == "BlockRemoved":
            held.discard(prefix_of[ev["block_hashes"][0]])
        else:
            held.clear()
    return held


async def test_cached_tokens_reported_match_what_the_events_say_is_held(tok) -> None:
    pub = _publisher()
    client = await _client(tok, events=pub)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:
        messages = [
            {"role": "system", "content": "Shared instructions for every turn. " * 10},
            {"role": "user", "content": "first question"},
        ]
        for turn in range(4):
            body = {"messages": messages, "max_tokens": 21}
            ids = (await (await client.post("/tokenize", json=body)).json())["tokens"]
            await sub.sync()
            held = _consumer_index(sub.events())
            expect = 0
            while expect + 1 <= (len(ids) - 1) // B and tuple(ids[: (expect + 1) * B]) in held:
                expect += 1
            r = await (await client.post("/v1/chat/completions", json=body)).json()
            details = r["usage"]["prompt_tokens_details"]
            cached = details["cached_tokens"] if details else 0
            assert cached == expect * B, turn
            if turn:
                assert cached > 0
            answer = r["choices"][0]["message"]["content"]
            messages = [
                *messages,
                {"role": "assistant", "content": answer},
                {"role": "user", "content": f"question {turn + 2}"},
            ]
    finally:
        sub.close()
        await client.close()


async def test_prompt_tokens_details_follow_vllm(tok) -> None:
    body = {"messages": [{"role": "user", "content": "same question " * 20}], "max_tokens": 2}
    off = await _client(tok, details=False)
    try:
        await off.post("/v1/chat/completions", json=body)
        r = await (await off.post("/v1/chat/completions", json=body)).json()
        assert r["usage"]["prompt_tokens_details"] is None  # hit, but the flag is off
    finally:
        await off.close()
    on = await _client(tok, details=True)
    try:
        r = await (await on.post("/v1/chat/completions", json=body)).json()
        assert r["usage"]["prompt_tokens_details"] is None  # nothing cached yet
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        raw = await (await on.post("/v1/chat/completions", json=stream)).read()
        chunks = [json.loads(x[6:]) for x in raw.split(b"\n\n") if x.startswith(b"data: {")]
        usage = chunks[-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        await on.close()


async def test_lora_and_cache_salt_key_the_cache_and_the_events(tok) -> None:
    pub = _publisher()
    client = await _client(tok, events=pub, loras=[LoRA(1, "sql", "/adapters/sql")])
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:
        base = {"prompt": "select rows from the table " * 10, "max_tokens": 2}

        async def cached(**kw: Any) -> int:
            r = await (await client.post("/v1/completions", json={**base, **kw})).json()
            d = r["usage"]["prompt_tokens_details"]
            return d["cached_tokens"] if d else 0

        assert await cached(model="m") == 0
        assert await cached(model="sql") == 0  # an adapter's KV is not the base model's
        assert await cached(model="sql") > 0
        assert await cached(model="m", cache_salt="tenant-a") == 0
        assert await cached(model="m", cache_salt="tenant-a") > 0
        assert await cached(model="m", cache_salt="tenant-b") == 0
        models = await (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["m", "sql"]
        await sub.sync()
        stored = [e for e in sub.events() if event_type(e) == "BlockStored"]
        lora = [e for e in stored if e.get("lora_name") == "sql"]
        assert lora and all(e["lora_id"] == 1 for e in lora)
        assert lora[0]["extra_keys"] == [["sql"]] * len(lora[0]["block_hashes"])
        salted = [e for e in stored if e["extra_keys"] and e["extra_keys"][0] == ["tenant-a"]]
        assert salted and salted[0]["parent_block_hash"] is None
        assert all(x is None for x in salted[0]["extra_keys"][1:])  # the salt: block 0 only
    finally:
        sub.close()
        await client.close()


@pytest.mark.slow
async def test_a_restarted_engine_starts_its_events_at_zero_with_an_empty_cache(
    fleet: Fleet,
) -> None:
    pub_port, replay_port = free_port(), free_port()
    conf = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub_port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": "kv@sim0",
    }
    extra = ["--tokenizer", "tiny", "--kv-events-config", json.dumps(conf)]
    extra += ["--enable-prompt-tokens-details"]
    port = free_port()

    async def start():
        return await fleet.start_sim(
            "sim0",
            model="m",
            kv_capacity=50_000,
            profile="fast",
            time_scale=1.0,
            extra=extra,
            port=port,
        )

    body = {"model": "m", "prompt": "the same long prompt " * 20, "max_tokens": 2}
    sim = await start()
    sub = Subscriber(conf["endpoint"], conf["replay_endpoint"], b"kv@sim0")
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(3):
                prompt = {**body, "prompt": f"{i} " + body["prompt"]}
                async with s.post(sim.url + "/v1/completions", json=prompt) as r:
                    assert r.status == 200
            await sub.sync()
            assert sub.last == 2
            await fleet.stop(sim)
            fleet.procs.remove(sim)
            sim = await start()
            async with s.post(sim.url + "/v1/completions", json=body) as r:
                usage = (await r.json())["usage"]
            assert usage["prompt_tokens_details"] is None  # the new process holds nothing
            replies = []
            for _ in range(100):  # the new publisher's buffer, once its replay socket is up
                replies = await sub.replay(0)
                if replies:
                    break
            assert int.from_bytes(replies[0][-2], "big") == 0
    finally:
        sub.close()


async def test_an_images_hash_keys_its_blocks_and_names_them_in_the_events(tok) -> None:
    """vLLM's extra keys for the blocks over an image's placeholder tokens: (its hash, where
    it starts relative to the block's first token), after the LoRA name, before the salt."""
    pub = _publisher()
    client = await _client(tok, events=pub, loras=[LoRA(1, "sql", "/adapters/sql")])
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    red, blue = ("data:image/png;base64," + c * 100 for c in ("UkVE", "QkxV"))

    def body(url: str, **kw: Any) -> dict[str, Any]:
        return {"max_tokens": 2, **kw, "messages": [
            {"role": "system", "content": "Look at the picture. " * 8 + "Please look at it now."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is it? " * 12}]}]}

    async def cached(b: dict[str, Any]) -> int:
        r = await (await client.post("/v1/chat/completions", json=b)).json()
        d = r["usage"]["prompt_tokens_details"]
        return d["cached_tokens"] if d else 0

    seen = 0

    async def stored_keys() -> list[Any]:
        """The extra keys of the blocks stored since the last call, block by block."""
        nonlocal seen
        await sub.sync()
        stored = [e for e in sub.events() if event_type(e) == "BlockStored"]
        new, seen = stored[seen:], len(stored)
        return [k for e in new for k in e["extra_keys"] or [None] * len(e["block_hashes"])]

    try:
        (image,) = tok.prompt("chat", body(red)).mm
        first, last = image.offset // B, (image.offset + image.length - 1) // B
        assert last > first  # the placeholder crosses a block boundary
        at = [(i, image.offset - i * B) for i in range(first, last + 1)]
        ident = {u: tok.prompt("chat", body(u)).mm[0].hash for u in (red, blue)}
        assert await cached(body(red)) == 0
        keys = await stored_keys()  # from block 0
        assert [(i, k) for i, k in enumerate(keys) if k] == [(i, [[ident[red], o]]) for i, o in at]
        assert await cached(body(blue)) == first * B  # another image: not its blocks
        keys = await stored_keys()  # from the image's first block on
        assert [(first + i, k) for i, k in enumerate(keys) if k] == [
            (i, [[ident[blue], o]]) for i, o in at]
        assert await cached(body(red)) > (last + 1) * B  # the same image: its blocks are a hit
        await stored_keys()
        assert await cached(body(red, model="sql", cache_salt="t")) == 0
        keys = await stored_keys()
        assert keys[0][0] == "sql" and keys[0][-1] == "t" and keys[1] == ["sql"]
        assert keys[first] == ["sql", [ident[red], image.offset - first * B]]
    finally:
        sub.close()
        await client.close()
