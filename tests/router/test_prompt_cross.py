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
from aiohttp.test_utils import TestClient, TestServer

from engine_sim.engine import Engine
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
from engine_sim.kvcache import TokenBlockHasher
from engine_sim.profiles import PROFILES
from engine_sim.sequences import TokenSequences
from engine_sim.server import build_app
from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.core import RouterCore, build_core
from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes, chain_seed

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
    expected = block_hashes(array("I", engine_ids).tobytes(), 4, chain_seed("m", None))
    assert len(route.hashes) == len(engine_ids)
    first = next((i for i, (a, b) in enumerate(zip(route.hashes, expected, strict=True))
                  if a != b), None)  # fmt: skip
    assert first is None, f"the router's key leaves the engine's tokens at token {first}"
