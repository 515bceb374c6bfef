"""The oracle hit rate: one LRU prefix cache as large as the whole fleet, on the same sequence.

It is what a perfect router could get if the fleet's memory were one pool; a router's engine
hit rate divided by it says how much of the achievable reuse the router found.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine_sim.chat import render_chat
from engine_sim.kvcache import PrefixCache
from engine_sim.tokenizer import count_tokens


def oracle_hit_rate(
    sent: Iterable[list[dict[str, str]]],
    capacity_tokens: int,
    block_size: int = 16,
    answers: Sequence[str] = (),
) -> float:
    """Cached / prompt tokens of `sent` through one LRU cache of `capacity_tokens`.

    `answers[i]` is the answer request i got ("" or missing: none). The simulators cache a
    finished answer's full blocks as vLLM does, so a conversation's next turn hits on them and
    they take room from other prefixes: the oracle holds them too, or it would both miss the
    reuse of answers and hold more prefixes than the fleet's memory can.
    """
    cache = PrefixCache(capacity_tokens, block_size)
    prompt = cached = 0
    for i, msgs in enumerate(sent):
        seq = render_chat(msgs, None).encode()
        answer = answers[i].encode() if i < len(answers) else b""
        prompt += count_tokens(seq)
        cached += cache.access(seq, answer)
    return cached / prompt if prompt else 0.0
