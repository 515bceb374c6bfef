import asyncio

from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES, Profile


async def drain(r):
    while (await r.out.get()) is not None:
        pass


async def test_batching_limit_and_fifo():
    e = Engine(PROFILES["fast"], 100_000, max_num_seqs=2)
    e.start()
    try:
        rs = [e.submit(f"req {i} ".encode() * 20, 10, i) for i in range(5)]
        await asyncio.sleep(0.005)
        assert len(e.running) <= 2
        assert list(e.waiting) == rs[2:]
        await asyncio.gather(*(drain(r) for r in rs))
        firsts = [r.first_token_at for r in rs]
        assert firsts == sorted(firsts)
        assert all(r.generated == 10 for r in rs)
    finally:
        await e.stop()


async def test_prefill_time_scales_with_uncached_tokens():
    slow = Profile("t", 0.001, 50e-6, 0.0, 8192, 100_000)
    e = Engine(slow, 100_000)
    e.start()
    try:
        prompt = b"shared prefix " * 600  # ~2,100 tokens
        r1 = e.submit(prompt + b"one", 1, 1)
        await drain(r1)
        r2 = e.submit(prompt + b"two", 1, 2)
        await drain(r2)
        assert r1.cached_tokens == 0 and r2.cached_tokens > 2000
        t1 = r1.first_token_at - r1.arrived
        t2 = r2.first_token_at - r2.arrived
        assert t1 > 0.09  # 2,100 tokens x 50 us
        assert t2 < t1 / 3
    finally:
        await e.stop()


async def test_decode_slows_as_the_batch_grows():
    # each step reads the KV of every decoding sequence: 2,000 tokens of context at 5 us a
    # token is 10 ms a sequence, so a step with 4 sequences takes ~4x one with 1
    kv_bound = Profile("t", 0.001, 0.0, 5e-6, 8192, 100_000)

    async def decode_time(n: int) -> float:
        """The time the profile gave the decode steps (not the wall time: a busy host's
        event loop stretches every step alike)."""
        e = Engine(kv_bound, 100_000)
        e.start()
        try:
            rs = [e.submit(f"seq {i} ".encode() + b"x" * 8000, 6, i) for i in range(n)]
            await asyncio.gather(*(drain(r) for r in rs))
            return e.counters.decode_step_model_seconds
        finally:
            await e.stop()

    one, four = await decode_time(1), await decode_time(4)
    assert four > 2.5 * one, (one, four)


async def test_cancel_frees_slot_and_blocks():
    e = Engine(PROFILES["fast"], 100_000, max_num_seqs=1)
    e.start()
    try:
        r = e.submit(b"x" * 4000, 5000, 1)
        await asyncio.sleep(0.02)
        assert e.running == [r]
        e.cancel(r)
        assert not e.running and e.cache.usage_fraction() == 0.0
    finally:
        await e.stop()


async def test_zero_profile_answers_at_once():
    e = Engine(PROFILES["zero"], 100_000)
    r = e.submit(b"hello world", 7, 1)
    assert r.done and r.generated == 7
    assert len("".join(r.text).encode()) == 28  # 4 bytes per output token
