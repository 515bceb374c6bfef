"""The oracle hit rate: one LRU prefix cache as large as the whole fleet, on the same sequence:
what a perfect router could get if the fleet's memory were one pool."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine_sim.chat import render_chat
from engine_sim.hf_tokenizer import ChatTokenizer
from engine_sim.kvcache import PrefixCache
from engine_sim.tokenizer import count_tokens, token_ids_to_bytes


def oracle_hit_rate(sent: Iterable[list[dict[str, str]]], capacity_tokens: int,
                    block_size: int = 16, answers: Sequence[str] = (),
                    tokenizer: ChatTokenizer | None = None) -> float:
    """Cached / prompt tokens of `sent` through one LRU cache of `capacity_tokens`.

    `answers[i]` is the answer request i got ("" or missing: none). The simulators cache a
    finished answer's full blocks as vLLM does, so a conversation's next turn hits on them and
    they take room from other prefixes: the oracle holds them too, or it would both miss the
    reuse of answers and hold more prefixes than the fleet's memory can.

    `tokenizer`: the simulators tokenize with it (their tokenizer mode), so the oracle counts
    and caches the same token ids: the prompt as the chat template renders it, and the answer
    less its last token (an engine caches the tokens it computed, and the last one sampled
    was never fed back).
    """
    cache = PrefixCache(capacity_tokens, block_size)
    prompt = cached = 0
    for i, msgs in enumerate(sent):
        text = answers[i] if i < len(answers) else ""
        if tokenizer is None:
            seq, answer = render_chat(msgs, None).encode(), text.encode()
        else:  # 4 bytes a token id: the byte cache then keys blocks of ids
            seq = token_ids_to_bytes(tokenizer.chat_ids(msgs))
            answer = token_ids_to_bytes(tokenizer.encode(text)[:-1])
        prompt += count_tokens(seq)
        cached += cache.access(seq, answer)
    return cached / prompt if prompt else 0.0
