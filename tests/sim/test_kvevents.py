"""KV events on vLLM's wire: our encoder against vLLM's captured bytes, and the engine's events
(stores, evictions, resets, preemption) as a plain-msgspec consumer with replay sees them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from aiohttp.test_utils import TestClient, TestServer
from kvsub import Subscriber, event_type, field_of

from engine_sim import kvevents as kv
from engine_sim.engine import Engine
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
from engine_sim.kvcache import TokenBlockHasher
from engine_sim.profiles import PROFILES, Profile
from engine_sim.sequences import TokenSequences
from engine_sim.server import build_app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-kv-events"
OURS = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"}
OURS |= {"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}
OURS |= {"kv_cache_spec_sliding_window"}


def _unhex(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"hex"}:
        return bytes.fromhex(v["hex"])
    if isinstance(v, list):
        return [_unhex(x) for x in v]
    return v


def _our_batch(meaning: dict[str, Any], encoding: str) -> kv.EventBatch:
    stored, removed, cleared = kv._TYPES[encoding]
    events = []
    for ev in meaning["events"]:
        args = {k: _unhex(v) for k, v in ev.items() if k in OURS}
        if args.get("extra_keys"):
            args["extra_keys"] = [None if x is None else tuple(x) for x in args["extra_keys"]]
        cls = {"BlockStored": stored, "BlockRemoved": removed, "AllBlocksCleared": cleared}
        events.append(cls[ev["type"]](**args))
    return kv.EventBatch(ts=meaning["ts"], events=events, data_parallel_rank=0)


@pytest.mark.parametrize(
    ("name", "encoding", "same_bytes"),
    [("0.23.0-array", "array", True), ("0.34.0-map", "map", True), ("0.25.0-map", "map", False)],
)
def test_our_encoder_writes_what_vllm_wrote(name: str, encoding: str, same_bytes: bool) -> None:
    # 0.25.0's BlockStored declared fewer fields than 0.34.0's: msgspec then writes a shorter
    # map header, so those bytes differ from ours (and 0.34.0's) though every value is equal.
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    enc = msgspec.msgpack.Encoder()
    for message in fixture["live"]:
        ours = enc.encode(_our_batch(message["meaning"], encoding))
        theirs = bytes.fromhex(message["frames_hex"][2])
        assert msgspec.msgpack.decode(ours) == msgspec.msgpack.decode(theirs)
        has_stored = any(e["type"] == "BlockStored" for e in message["meaning"]["events"])
        assert (ours == theirs) is (same_bytes or not has_stored)


@pytest.mark.parametrize("name", ["0.10.2-array", "0.23.0-array", "0.25.0-map", "0.34.0-map"])
def test_vllm_frames_decode_with_plain_msgspec(name: str) -> None:
    fixture = json.loads((FIXTURES / f"{name}.json").read_text())
    live = fixture["live"]
    assert [m["seq"] for m in live] == list(range(5))
    for m in live:
        topic, seq, payload = (bytes.fromhex(f) for f in m["frames_hex"])
        assert topic == fixture["topic"].encode() and int.from_bytes(seq, "big") == m["seq"]
        batch = msgspec.msgpack.decode(payload)
        assert isinstance(batch, list) and batch[0] == m["meaning"]["ts"] and batch[2] == 0
        for ev, meant in zip(batch[1], m["meaning"]["events"], strict=True):
            assert event_type(ev) == meant["type"]
            if meant["type"] == "BlockStored":
                assert field_of(ev, "block_hashes", 1) == _unhex(meant["block_hashes"])
                assert field_of(ev, "parent_block_hash", 2) == _unhex(meant["parent_block_hash"])
                assert field_of(ev, "token_ids", 3) == meant["token_ids"]
                assert field_of(ev, "block_size", 4) == 16
    # unsigned 64-bit hashes survive
    assert msgspec.msgpack.decode(bytes.fromhex(live[0]["frames_hex"][2]))[1][0] is not None
    # replay: seq 1.. then the end marker, with the topic frame from vLLM 0.26 on
    replies = [[bytes.fromhex(f) for f in r] for r in fixture["replay_frames_hex"]]
    with_topic = fixture["vllm_version"] >= "0.26"
    for i, frames in enumerate(replies[:-1], start=1):
        assert frames[0] == b""
        body = frames[1:]
        assert len(body) == (3 if with_topic else 2)
        assert int.from_bytes(body[-2], "big") == i
        assert body[-1].hex() == live[i]["frames_hex"][2]
    end = replies[-1][1:]
    assert end[-2] == kv.END_SEQ and end[-1] == b""


# -- the engine's events --------------------------------------------------------------------
def _publisher(encoding: str, topic: str = "kv@sim") -> kv.KVEventPublisher:
    conf = kv.KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint="tcp://127.0.0.1:0",
        replay_endpoint="tcp://127.0.0.1:0",
        topic=topic,
    )
    return kv.KVEventPublisher(conf, encoding, block_size=16)


def _token_engine(events, capacity: int = 50_000, profile: Profile | None = None, **kw) -> Engine:
    tok = ChatTokenizer(TINY_TOKENIZER)
    seqs = TokenSequences(tok, TokenBlockHasher(16, "test-seed"))
    return Engine(
        profile or PROFILES["fast"],
        capacity,
        16,
        sequences=seqs,
        preemption="recompute",
        events=events,
        **kw,
    )


async def _client(engine: Engine) -> TestClient:
    tok = engine.seqs.tokenizer
    app = build_app(
        model="m",
        served=["m"],
        engine=engine,
        max_model_len=8192,
        replica_id="r0",
        tokenizer=tok,
        enable_prompt_tokens_details=True,
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def _stored(events: list[Any]) -> list[Any]:
    return [e for e in events if event_type(e) == "BlockStored"]


@pytest.mark.parametrize("encoding", ["array", "map"])
async def test_published_events_decode_to_vllm_structures(encoding: str) -> None:
    pub = _publisher(encoding)
    engine = _token_engine(pub)
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint, b"kv@sim")
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "tell me " * 40}]}
        got = await client.post("/v1/chat/completions", json={**body, "max_tokens": 3})
        usage = (await got.json())["usage"]
        await sub.sync()
        ids = (await (await client.post("/tokenize", json=body)).json())["tokens"]
        assert usage["prompt_tokens"] == len(ids)
        (ev,) = _stored(sub.events())  # the prompt's full blocks, stored at admission
        if encoding == "array":
            assert isinstance(ev, list) and ev[0] == "BlockStored" and len(ev) == 12
            assert ev[5:8] == [None, "GPU", None] and ev[9:] == [0, "full_attention", None]
        else:
            assert isinstance(ev, dict) and ev["type"] == "BlockStored"
            assert ev["medium"] == "GPU" and ev["lora_name"] is None and ev["group_idx"] == 0
            assert "kv_cache_spec_sliding_window" not in ev  # a default: omitted in maps
        full = len(ids) // 16
        assert field_of(ev, "token_ids", 3) == ids[: full * 16]
        assert field_of(ev, "parent_block_hash", 2) is None
        hashes = field_of(ev, "block_hashes", 1)
        assert len(hashes) == full and all(0 <= h < 2**64 for h in hashes)
        assert field_of(ev, "extra_keys", 8) == [None] * full
        batch = sub.batches[0]
        assert isinstance(batch, list) and isinstance(batch[0], float) and batch[2] == 0
        # replay replies as vLLM sends them: with the topic frame from 0.26 (map), without
        # before (array)
        (reply,) = await sub.replay(0)
        assert reply[:-2] == ([b"kv@sim"] if encoding == "map" else [])
        assert int.from_bytes(reply[-2], "big") == 0
    finally:
        sub.close()
        await client.close()


async def test_a_subscriber_that_misses_batches_gets_them_from_replay() -> None:
    pub = _publisher("map")
    engine = _token_engine(pub)
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint, b"kv@sim")
    try:
        n = 0

        async def one() -> None:
            nonlocal n
            n += 1
            body = {"model": "m", "prompt": f"request {n} " * 30, "max_tokens": 2}
            assert (await client.post("/v1/completions", json=body)).status == 200

        # until one batch has come live (the subscription takes a moment to reach the PUB)
        for _ in range(200):
            await one()
            if await sub.receive(timeout=0.05) is not None:
                break
        assert sub.live
        # unsubscribed for a while: what is published meanwhile is lost to the SUB socket
        sub.sub.setsockopt(zmq.UNSUBSCRIBE, b"kv@sim")
        missed_before = pub.published
        for _ in range(5):
            await one()
        assert pub.published >= missed_before + 5
        sub.sub.setsockopt(zmq.SUBSCRIBE, b"kv@sim")
        seq = None
        for _ in range(200):
            await one()
            seq = await sub.receive(timeout=0.05)
            if seq is not None and seq >= missed_before + 5:
                break
        assert seq is not None
        assert sub.gaps, "the gap was not seen"
        first, upto = sub.gaps[-1]
        assert set(range(first, upto)) <= set(sub.replayed)
        assert sorted(sub.batches) == list(range(seq + 1))  # nothing missing
    finally:
        sub.close()
        await client.close()


async def test_evictions_publish_block_removed() -> None:
    pub = _publisher("array")
    engine = _token_engine(pub, capacity=16 * 12)  # 12 blocks
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:
        for i in range(4):  # ~6 blocks each: the later ones evict the earlier ones' blocks
            body = {"model": "m", "prompt": f"document {i} " + "words " * 90, "max_tokens": 2}
            assert (await client.post("/v1/completions", json=body)).status == 200
        await sub.sync()
        events = sub.events()
        stored = {h for e in _stored(events) for h in e[1]}
        removed = [e for e in events if event_type(e) == "BlockRemoved"]
        assert removed
        assert all(len(e[1]) == 1 and e[1][0] in stored and e[2] == "GPU" for e in removed)
        # what is left is what was stored less what was removed, and fits the capacity
        left = stored - {e[1][0] for e in removed}
        assert len(left) == engine.cache.cached_blocks() <= 12
    finally:
        sub.close()
        await client.close()


async def test_reset_prefix_cache_publishes_all_blocks_cleared() -> None:
    pub = _publisher("map")
    engine = _token_engine(pub)
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:
        body = {"model": "m", "prompt": "cached " * 100, "max_tokens": 2}
        await client.post("/v1/completions", json=body)
        assert engine.cache.cached_blocks() > 0
        resp = await client.post("/reset_prefix_cache")
        assert resp.status == 200
        await sub.sync()
        assert event_type(sub.events()[-1]) == "AllBlocksCleared"
        assert sub.events()[-1] == {"type": "AllBlocksCleared"}
        assert engine.cache.cached_blocks() == 0
        again = await (await client.post("/v1/completions", json=body)).json()
        assert again["usage"]["prompt_tokens_details"] is None  # a miss after the reset
    finally:
        sub.close()
        await client.close()


async def test_reset_during_requests_preempts_them_and_they_finish() -> None:
    pub = _publisher("map")
    slow = Profile("t", 0.002, 0.0, 0.0, 8192, 100_000)
    engine = _token_engine(pub, profile=slow)
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:
        body = {"model": "m", "prompt": "long answer " * 40, "max_tokens": 60}
        task = asyncio.create_task(client.post("/v1/completions", json=body))
        for _ in range(1000):
            if engine.running and engine.running[0].generated > 5:
                break
            await asyncio.sleep(0.005)
        assert (await (await client.post("/reset_prefix_cache")).json())["preempted"] == 1
        done = await (await task).json()
        assert done["usage"]["completion_tokens"] == 60
        await sub.sync()
        kinds = [event_type(e) for e in sub.events()]
        cleared = kinds.index("AllBlocksCleared")
        # the request's prompt was stored again when it was recomputed
        assert "BlockStored" in kinds[cleared + 1 :]
    finally:
        sub.close()
        await client.close()


async def test_a_burst_preempts_and_the_events_show_it() -> None:
    pub = _publisher("map")
    slow = Profile("t", 0.001, 0.0, 0.0, 8192, 100_000)
    # 40 blocks; 8 requests of 4 prompt blocks each grow by 6 blocks of output
    engine = _token_engine(pub, capacity=16 * 40, profile=slow)
    client = await _client(engine)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    try:

        async def one(i: int) -> dict[str, Any]:
            ids = engine.seqs.tokenizer.encode(f"burst {i} " + "text " * 70)[:64]
            body = {"model": "m", "prompt": ids, "max_tokens": 96}
            return await (await client.post("/v1/completions", json=body)).json()

        answers = await asyncio.gather(*(one(i) for i in range(8)))
        assert all(a["usage"]["completion_tokens"] == 96 for a in answers)
        stats = await (await client.get("/stats")).json()
        assert stats["preemptions"] > 0
        metrics = await (await client.get("/metrics")).text()
        assert 'vllm:num_preemptions_total{model_name="m"}' in metrics
        await sub.sync()
        events = sub.events()
        removed = {e["block_hashes"][0] for e in events if event_type(e) == "BlockRemoved"}
        # a preempted request's blocks were evicted, then stored again when it was recomputed
        seen: dict[int, list[str]] = {}
        for e in events:
            if event_type(e) == "BlockStored":
                for h in e["block_hashes"]:
                    seen.setdefault(h, []).append("stored")
            elif event_type(e) == "BlockRemoved":
                seen.setdefault(e["block_hashes"][0], []).append("removed")
        again = [h for h, kinds in seen.items() if kinds[:3] == ["stored", "removed", "stored"]]
        assert removed and again
        assert engine.cache.usage_fraction() == 0.0 and not engine.running
    finally:
        sub.close()
        await client.close()
