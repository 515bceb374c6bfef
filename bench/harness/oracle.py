"""The oracle hit rate: what a perfect router could get if the fleet's memory were one pool."""

from collections.abc import Iterable, Sequence
from typing import Any

from engine_sim.chat import render_chat
from engine_sim.hf_tokenizer import ChatTokenizer
from engine_sim.kvcache import PrefixCache
from engine_sim.tokenizer import count_tokens, token_ids_to_bytes
from prefix_router.prompt import MultiModalPart


def oracle_hit_rate(sent: Iterable[list[dict[str, Any]]], capacity_tokens: int,
                    block_size: int = 16, answers: Sequence[str] = (),
                    tokenizer: ChatTokenizer | None = None,
                    tools: Sequence[list[dict[str, Any]] | None] = ()) -> float:
    """Cached / prompt tokens of `sent` through one LRU cache of `capacity_tokens`, which also
    caches each answer (`answers[i]`, "" for none) as the simulators do. With `tokenizer`: the
    engines' token ids, the answer less its last token (sampled, never fed back). `tools[i]`:
    the tools request i was sent with."""
    cache = PrefixCache(capacity_tokens, block_size)
    prompt = cached = 0
    mm: tuple[MultiModalPart, ...] = ()
    for i, msgs in enumerate(sent):
        text = answers[i] if i < len(answers) else ""
        given = tools[i] if i < len(tools) else None
        if tokenizer is None:
            seq, answer = render_chat(msgs, given).encode(), text.encode()
        else:  # 4 bytes a token id: the byte cache then keys blocks of ids
            p = tokenizer.prompt("chat", {"messages": msgs, "tools": given})
            seq, mm = token_ids_to_bytes(p.token_ids), p.mm  # blocks over an image: its hash
            answer = token_ids_to_bytes(tokenizer.encode(text)[:-1])
        prompt += count_tokens(seq)
        cached += cache.access(seq, answer, mm)
    return cached / prompt if prompt else 0.0
