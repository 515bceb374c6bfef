"""The oracle (bench/oracle.py) is one simulator engine as large as the fleet, fed the run's
requests one after the other: it caches what the engine caches, answers included."""

from __future__ import annotations

from bench.harness.oracle import oracle_hit_rate
from bench.harness.workloads import build, messages_for
from engine_sim.chat import render_chat
from engine_sim.engine import Engine
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
from engine_sim.kvcache import TokenBlockHasher
from engine_sim.profiles import PROFILES
from engine_sim.sequences import TokenSequences


def engine_run(capacity: int, tokenizer: ChatTokenizer | None = None,
               ) -> tuple[list[list[dict[str, str]]], list[str], float]:
    """Multi-turn conversations, their turns interleaved, through one engine that answers at
    once (profile `zero`): (requests in order, their answers, the engine's hit rate). With
    `tokenizer`: the engine in its tokenizer mode, prompts as the server makes their ids."""
    seqs = None if tokenizer is None else TokenSequences(tokenizer, TokenBlockHasher(16, "t"))
    engine = Engine(PROFILES["zero"], capacity, sequences=seqs)
    sessions = build("multi-turn", 40).sessions[:6]
    answers: list[list[str]] = [[] for _ in sessions]
    sent: list[list[dict[str, str]]] = []
    got: list[str] = []
    for turn in range(max(len(s.turns) for s in sessions)):
        for k, s in enumerate(sessions):
            if turn >= len(s.turns):
                continue
            msgs = messages_for(s, turn, answers[k])
            ids = None if tokenizer is None else tokenizer.chat_ids(msgs)
            r = engine.submit(render_chat(msgs).encode(), s.turns[turn].max_tokens, seed=k,
                              ids=ids)
            assert r.done
            answer = "".join(r.text)
            answers[k].append(answer)
            sent.append(msgs)
            got.append(answer)
    c = engine.counters
    return sent, got, c.cached_tokens / c.prompt_tokens


def test_the_oracle_is_one_engine_fed_the_same_requests_and_answers() -> None:
    for capacity in (1_000_000, 12_000):  # everything fits; LRU evictions
        sent, answers, engine_hit = engine_run(capacity)
        assert oracle_hit_rate(sent, capacity, answers=answers) == engine_hit


def test_without_the_answers_the_oracle_misses_what_the_next_turn_reuses() -> None:
    # the oracle before answers were replayed: below what one engine of its size gets
    sent, _answers, engine_hit = engine_run(1_000_000)
    assert oracle_hit_rate(sent, 1_000_000) < engine_hit - 0.05


def test_in_tokenizer_mode_the_oracle_counts_and_caches_the_engines_token_ids() -> None:
    tok = ChatTokenizer(TINY_TOKENIZER)
    for capacity in (1_000_000, 12_000):
        sent, answers, engine_hit = engine_run(capacity, tok)
        assert oracle_hit_rate(sent, capacity, answers=answers, tokenizer=tok) == engine_hit
    # the byte oracle is another count: it would not be the engines' figure
    assert oracle_hit_rate(sent, 12_000, answers=answers) != engine_hit


def test_in_tokenizer_mode_the_oracle_keys_an_images_blocks_as_the_engine_does() -> None:
    """Chat with images: the blocks over an image's placeholder carry its hash in the engine
    (as vLLM's do), so the oracle's must too, or it counts another image's blocks as a hit."""
    tok = ChatTokenizer(TINY_TOKENIZER)
    seqs = TokenSequences(tok, TokenBlockHasher(16, "t"))
    for capacity in (1_000_000, 12_000):
        engine = Engine(PROFILES["zero"], capacity, sequences=seqs)
        sent, answers = [], []
        for k, s in enumerate(build("multimodal", 80).sessions):
            msgs = messages_for(s, 0, [])
            p = tok.prompt("chat", {"messages": msgs})
            r = engine.submit(b"", s.turns[0].max_tokens, seed=k, ids=p.token_ids, mm=p.mm)
            assert r.done
            sent.append(msgs)
            answers.append("".join(r.text))
        c = engine.counters
        assert oracle_hit_rate(sent, capacity, answers=answers, tokenizer=tok) == \
            c.cached_tokens / c.prompt_tokens
