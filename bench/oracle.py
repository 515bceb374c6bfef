"""The oracle hit rate: one LRU prefix cache as large as the whole fleet, on the same sequence.

It is what a perfect router could get if the fleet's memory were one pool; a router's engine
hit rate divided by it says how much of the achievable reuse the router found.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_sim.chat import render_chat
from engine_sim.kvcache import PrefixCache
from engine_sim.tokenizer import count_tokens


def oracle_hit_rate(
    sent: Iterable[list[dict[str, str]]], capacity_tokens: int, block_size: int = 16
) -> float:
    cache = PrefixCache(capacity_tokens, block_size)
    prompt = cached = 0
    for msgs in sent:
        seq = render_chat(msgs, None).encode()
        prompt += count_tokens(seq)
        cached += cache.access(seq)
    return cached / prompt if prompt else 0.0
