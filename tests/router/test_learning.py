"""What the index learns from the engines' reports: sizing from prompt_tokens, and each
engine's real capacity from cached_tokens."""

import json

from prefix_router.attempt import Attempt
from prefix_router.index.learning import EngineCache
from prefix_router.index.local import LocalIndex
from prefix_router.index.table import OwnershipTable
from prefix_router.parsing import parse_request
from prefix_router.sizing import Sizing


def test_bytes_per_token_follow_the_engines_counts() -> None:
    s = Sizing(16, 64, 4.0, exact=False)
    assert s.block_tokens == 16
    moved = [s.learn(2900, 1000) for _ in range(300)]  # a tokenizer of 2.9 bytes a token
    assert abs(s.bytes_per_token - 2.9) < 0.01
    assert abs(s.block_tokens - 64 / 2.9) < 0.1
    assert any(moved) and not all(moved)  # the capacity model follows in steps, not per call
    assert not s.learn(100_000, 10)  # a garbled count is not trusted
    exact = Sizing(16, 64, 4.0, exact=True)
    assert not exact.learn(2900, 1000) and exact.block_tokens == 16


def test_an_engine_larger_than_modelled_grows_the_model_only_when_full() -> None:
    e = EngineCache()
    assert not e.observe(predicted=2, held=8, full=False)  # the index just did not know
    assert e.observe(predicted=2, held=8, full=True)
    assert e.scale > 1.0
    for _ in range(100):
        e.observe(predicted=2, held=8, full=True)
    assert e.scale == 4.0  # bounded
    assert not e.observe(predicted=8, held=0, full=True)  # a miss teaches no capacity


def test_the_table_holds_what_its_engine_was_learned_to_hold() -> None:
    t = OwnershipTable(block_tokens=16, capacity_tokens=16 * 100)
    chain = list(range(1, 11))
    t.record(chain[5:], "a", now=0.0)  # the tail first, older
    t.record(chain[:5], "a", now=50.0)
    t.record(chain, "b", now=0.0)
    assert t.match(chain, now=60.0) == {"a": 10, "b": 10}
    t.limit("b", 4)  # b's engine holds 4 blocks: its least recently used go
    assert t.match(chain, now=60.0) == {"a": 10, "b": 4}


async def test_a_reported_cache_miss_is_counted_and_other_prefixes_stay(make_core) -> None:
    # the index says backend a holds two system prompts; a's engine answers that it held none
    # of one of them. The miss is counted (the prediction-error metrics), and the index does
    # not infer from it that a also dropped the other, older one: that inference (a keep
    # time learned from the miss's age) was measured to lower the hit rate on llama-server
    # and on the simulator (bench/results/real-engine/causes.md)
    a = "http://192.0.2.1:8000"
    clock = [1000.0]
    core = make_core([a, "http://192.0.2.2:8000"], 1_000_000, clock=lambda: clock[0])
    index = core.index.table
    assert isinstance(index, LocalIndex)

    def chat(system: str, user: str):
        body = {"model": "m", "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": user}]}  # fmt: skip
        return parse_request(json.dumps(body).encode(), "chat")

    first = await core.route(chat("S" * 4000, "one"))
    other = await core.route(chat("T" * 4000, "two"))
    index.record("m", other.hashes, a)
    clock[0] += 10.0
    index.record("m", first.hashes, a)
    clock[0] += 40.0
    again = await core.route(chat("S" * 4000, "three"))
    assert (again.decision.reason, again.decision.backend) == ("hit", a)
    with Attempt(core.ledger, again, a) as at:
        at.answered(200)
        at.first_byte(streamed=False)
        at.done(None, (int(again.prompt_tokens), 0))  # the engine held nothing of it
    samples = core.metrics.corrections.collect()[0].samples
    assert [x.value for x in samples if x.name.endswith("_total")
            and x.labels["direction"] == "over"] == [1.0]
    assert await index.lookup("m", other.hashes) == {a: len(other.hashes)}


async def test_a_prompt_held_whole_is_not_a_correction_for_its_last_block(
    make_core, tokenizer_dir
) -> None:
    # an engine computes at least a prompt's last token (vLLM caps a hit at prompt - 1): of a
    # prompt held whole, block-aligned, it reports one block less, and has dropped nothing
    clock = [1000.0]
    core = make_core(["http://192.0.2.1:8000"], 100_000, clock=lambda: clock[0],
                     tokenizer=str(tokenizer_dir), cached_tokens_reported=True)
    index = core.index.table
    assert isinstance(index, LocalIndex)
    for words in range(40, 400):  # a prompt whose token count is a multiple of the block
        body = {"model": "m", "messages": [{"role": "user", "content": "hi " * words}]}
        parsed = parse_request(json.dumps(body).encode(), "chat")
        first = await core.route(parsed)
        if int(first.prompt_tokens) % 16 == 0:
            break
    tokens = int(first.prompt_tokens)
    with Attempt(core.ledger, first, first.decision.backend) as a:
        a.answered(200)
        a.first_byte(streamed=False)
        a.done(None, (tokens, None))
    clock[0] += 30.0
    again = await core.route(parsed)
    assert again.decision.matched_blocks == tokens // 16
    with Attempt(core.ledger, again, again.decision.backend) as a:
        a.answered(200)
        a.first_byte(streamed=False)
        a.done(None, (tokens, tokens - 16))  # all but the last block, as vLLM reports it
    corrections = core.metrics.corrections.collect()[0].samples
    assert not [x for x in corrections if x.name.endswith("_total") and x.value]
    assert await index.lookup("m", again.hashes) == {"http://192.0.2.1:8000": tokens // 16}
