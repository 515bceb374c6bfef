"""The simulator's CPU tier (vLLM's CPU offloading): a block the GPU cache evicts moves to a
larger LRU, published as a CPU store before its GPU removal; a request's blocks after its GPU
hit that the CPU tier holds are loaded, not prefilled, and count as cached."""

from __future__ import annotations

from engine_runs import cached_tokens, prompt
from kvsub import Subscriber, event_type, field_of

from engine_sim import kvevents as kv
from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES


async def test_an_evicted_prefix_is_loaded_from_the_cpu_tier() -> None:
    with_cpu = Engine(PROFILES["zero"], 256, 16, cpu_offload_tokens=4096)
    gpu_only = Engine(PROFILES["zero"], 256, 16)
    for e in (with_cpu, gpu_only):
        assert await cached_tokens(e, prompt("a", 160)) == 0
        await cached_tokens(e, prompt("b", 240))  # pushes a's blocks out of the GPU cache
        assert e.cache.match(e.seqs.prompt_hashes(e.submit(b"", 1, 0)), 1) == 0
    # a again: its 9 full blocks (the last token is always computed) come from the CPU tier
    assert await cached_tokens(with_cpu, prompt("a", 160)) == 144
    assert with_cpu.counters.cpu_cached_tokens == 144
    assert await cached_tokens(gpu_only, prompt("a", 160)) == 0


async def test_an_offload_is_published_for_the_cpu_before_the_gpu_removal() -> None:
    conf = kv.KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                             replay_endpoint="tcp://127.0.0.1:0")  # fmt: skip
    pub = kv.KVEventPublisher(conf, "map")
    e = Engine(PROFILES["zero"], 256, 16, events=pub, cpu_offload_tokens=4096)
    sub = Subscriber(pub.endpoint, pub.replay_endpoint)
    pub.start()
    try:
        await cached_tokens(e, prompt("a", 160))
        await cached_tokens(e, prompt("b", 240))
        await sub.replay(0)
        events = [ev for seq in sorted(sub.batches) for ev in sub.batches[seq][1]]
        cpu = [i for i, ev in enumerate(events) if field_of(ev, "medium", 6) == "CPU"]
        gone = [
            i for i, ev in enumerate(events)
            if event_type(ev) == "BlockRemoved" and field_of(ev, "medium", 2) == "GPU"
        ]  # fmt: skip
        assert cpu and len(cpu) == len(gone)
        for i, j in zip(cpu, gone, strict=True):
            stored, removed = events[i], events[j]
            assert event_type(stored) == "BlockStored" and i < j
            assert field_of(stored, "block_hashes", 1) == field_of(removed, "block_hashes", 1)
            assert field_of(stored, "token_ids", 3) == []  # vLLM's placeholder: the hash only
    finally:
        sub.close()
        await pub.close()
