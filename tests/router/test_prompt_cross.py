"""The router keys a chat by the very token ids the simulator (playing vLLM) runs it with.

Each chat of a corpus of real shapes (tools, tool calls and results, content parts, images,
a system prompt alone, an assistant prefill continued, ...) goes through both real paths: the
router's (parse, then `RouterCore.route`, whose chain of block hashes is the key its index and
the engines' KV events meet on) and the simulator's HTTP API (`/v1/chat/completions/render`,
the ids it runs and publishes events for). With blocks of one token, equal chains are equal
token ids. Only the API both have had all along is used, so this file runs on older commits
too (bench/results/agentic/README.md shows it failing before the prompt module).
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest
import waiting
from aiohttp.test_utils import TestClient, TestServer

from engine_sim.engine import Engine
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
from engine_sim.kvcache import TokenBlockHasher
from engine_sim.kvevents import KVEventPublisher, KVEventsConfig
from engine_sim.profiles import PROFILES
from engine_sim.sequences import TokenSequences
from engine_sim.server import build_app
from prefix_router.backends import BackendSet
from prefix_router.config import EventSettings, RouterSettings
from prefix_router.core import RouterCore, build_core
from prefix_router.events.subscriber import EventSubscriber
from prefix_router.index.events import EventsIndex
from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes, chain_seed
from prefix_router.prompt import token_media

CORPUS = Path(__file__).parents[1] / "fixtures" / "vllm-prompts" / "corpus.json"
CASES = json.loads(CORPUS.read_text())["cases"]


@pytest.fixture(scope="module")
def scheduler() -> RouterCore:
    s = RouterSettings(tokenizer=str(TINY_TOKENIZER), block_size=1, max_prompt_tokens=100_000)
    members = BackendSet()
    members.set_members(["http://198.18.0.1:8000"])
    return build_core(s, members)


@pytest.fixture
async def sim():
    tok = ChatTokenizer(TINY_TOKENIZER)
    engine = Engine(PROFILES["fast"], 50_000, 16,
                    sequences=TokenSequences(tok, TokenBlockHasher(16)), preemption="recompute")
    app = build_app(model="m", served=["m"], engine=engine, max_model_len=100_000,
                    replica_id="r0", tokenizer=tok)  # fmt: skip
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client
    await client.close()


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_the_router_keys_a_chat_by_the_simulators_token_ids(case, scheduler, sim) -> None:
    body = {"model": "m", **case["body"]}
    r = await sim.post("/v1/chat/completions/render", json=body)
    assert r.status == 200, await r.text()
    engine_ids = (await r.json())["token_ids"]
    route = await scheduler.route(parse_request(json.dumps(body).encode(), "chat"))
    # the blocks over an image carry its identity (the router's own here; the engine's events
    # name it in the test below): this one checks the token ids under them
    assert route.key.prompt is not None
    expected = block_hashes(array("I", engine_ids).tobytes(), 4, chain_seed("m", None),
                            media=token_media(route.key.prompt))  # fmt: skip
    assert len(route.hashes) == len(engine_ids)
    first = next((i for i, (a, b) in enumerate(zip(route.hashes, expected, strict=True))
                  if a != b), None)  # fmt: skip
    assert first is None, f"the router's key leaves the engine's tokens at token {first}"


# -- images: the engine's KV events, keyed by the router's feed, against the router's key --------
ENGINE = "http://198.18.0.1:8000"
RED, BLUE = ("data:image/png;base64," + c * 400 for c in ("UkVE", "QkxV"))
SYSTEM = "You look at pictures and answer in one short sentence, plainly. " * 4
ASK = "What is in this picture? Name every object you can see in it, left to right. " * 3


def image_chat(*urls: str, question: str = ASK) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": "m", "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [*parts, {"type": "text", "text": question}]}]}


@pytest.fixture
async def evented():
    """A simulator in token mode publishing KV events on loopback, the router's subscriber
    feeding an events index from them, and the router's keyer (blocks of 16 on both)."""
    tok = ChatTokenizer(TINY_TOKENIZER)
    conf = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                          replay_endpoint="tcp://127.0.0.1:0")  # fmt: skip
    conf.publisher = "zmq"
    pub = KVEventPublisher(conf, "map", 16)
    seqs = TokenSequences(tok, TokenBlockHasher(16))
    engine = Engine(PROFILES["fast"], 50_000, 16, sequences=seqs, preemption="recompute",
                    events=pub)  # fmt: skip
    app = build_app(model="m", served=["m"], engine=engine, max_model_len=100_000,
                    replica_id="r0", tokenizer=tok, enable_prompt_tokens_details=True)
    client = TestClient(TestServer(app))
    await client.start_server()
    index = EventsIndex(16, 100_000)
    ends = {ENGINE: f"{pub.endpoint},{pub.replay_endpoint}"}
    sub = EventSubscriber(EventSettings(endpoints=ends), index, 16, lambda backend, lora: "m")
    sub.join(ENGINE)
    s = RouterSettings(tokenizer=str(TINY_TOKENIZER), block_size=16, max_prompt_tokens=100_000)
    keyer = build_core(s, BackendSet()).keyer
    yield client, index, keyer
    await sub.close()
    await client.close()


async def test_the_engines_events_hold_the_routers_key_of_an_image_chat(evented) -> None:
    client, index, keyer = evented

    async def key(body: dict) -> list[int]:
        return (await keyer.key(parse_request(json.dumps(body).encode(), "chat"), [])).hashes

    async def send(body: dict) -> int:
        r = await (await client.post("/v1/chat/completions", json=body)).json()
        details = r["usage"]["prompt_tokens_details"]
        return details["cached_tokens"] if details else 0

    async def held(chain: list[int], blocks: int) -> None:
        await waiting.until(lambda: index.match("m", chain).get(ENGINE, 0) == blocks, 30,
                            "the engine's events to hold the chain", interval=0.01)  # fmt: skip

    red = await key(image_chat(RED))
    assert await send(image_chat(RED)) == 0
    await held(red, len(red))  # every block, the image's too, under the router's own key
    prompt = keyer.prompt(parse_request(json.dumps(image_chat(RED)).encode(), "chat"))
    at = prompt.mm[0].offset // 16  # the block the image starts in
    # another image: the engine keeps only the blocks before the image's, and so does the key
    blue = await key(image_chat(BLUE))
    assert index.match("m", blue)[ENGINE] == at
    assert await send(image_chat(BLUE)) == at * 16
    await held(blue, len(blue))
    # the same image again, the question longer: the image's blocks are a hit
    longer = image_chat(RED, question=ASK + "Then say which colour it is.")
    again = await key(longer)
    shared = index.match("m", again)[ENGINE]
    assert shared > at + 1
    assert await send(longer) == shared * 16
    # two images: each its own blocks, in order
    both = await key(image_chat(RED, BLUE))
    assert await send(image_chat(RED, BLUE)) == at * 16
    await held(both, len(both))
    assert index.match("m", await key(image_chat(BLUE, RED)))[ENGINE] == at
