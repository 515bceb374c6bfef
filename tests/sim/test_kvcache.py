from engine_sim.chat import GENERATION_PROMPT, render_chat
from engine_sim.kvcache import PrefixCache, block_hashes
from engine_sim.tokenizer import count_tokens, tokenize

B = 16 * 4  # bytes per block


def test_tokenizer_is_four_bytes_per_token_and_deterministic():
    assert count_tokens(b"abcd" * 10) == 10
    assert count_tokens(b"abcde") == 2
    assert tokenize("abcdabcd") == tokenize("abcdabcd")
    assert len(tokenize("x" * 4001)) == 1001


def test_chat_history_plus_answer_prefixes_next_turn():
    turn1 = [{"role": "system", "content": "S" * 300}, {"role": "user", "content": "q1"}]
    p1 = render_chat(turn1)
    assert p1.endswith(GENERATION_PROMPT)
    turn2 = [*turn1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert render_chat(turn2).startswith(p1 + "a1")
    other = [turn1[0], {"role": "user", "content": "different"}]
    assert render_chat(other)[:300] == p1[:300]


def test_chained_hashes_depend_on_the_parent():
    a = block_hashes(b"x" * B + b"y" * B, 16)
    b = block_hashes(b"z" * B + b"y" * B, 16)
    assert a[1] != b[1]
    assert len(block_hashes(b"x" * (B - 1), 16)) == 0


def test_match_caps_so_one_token_is_computed():
    c = PrefixCache(10_000, 16)
    seq = b"a" * (B * 4)  # exactly 4 blocks, 64 tokens
    assert c.access(seq) == 0
    # an exact repeat may reuse at most 63 tokens -> 3 whole blocks
    assert c.access(seq) == 48
    assert c.access(seq + b"b" * 8) == 64


def test_lru_evicts_oldest_and_tail_first():
    c = PrefixCache(16 * 6, 16)  # 6 blocks
    a = b"a" * (B * 3)
    b = b"b" * (B * 3)
    c.access(a)
    c.access(b)
    c.access(b"c" * (B * 2))  # needs 2 blocks: a's two deepest go first
    assert c.access(a + b"!" * 8) == 16  # only a's first block survived


def test_referenced_blocks_are_never_evicted():
    c = PrefixCache(16 * 4, 16)
    seq = b"r" * (B * 2)
    hs = block_hashes(seq, 16)
    c.allocate(hs, total_blocks=3)  # 2 prompt blocks + 1 private
    assert c.can_allocate(block_hashes(b"q" * B, 16), 1)
    assert not c.can_allocate(block_hashes(b"q" * (B * 2), 16), 2)
    c.access(b"z" * (B * 4))  # offline use may only evict unreferenced blocks
    assert c.match(hs, 33) == 2
    c.release(hs, 3)
    assert c.usage_fraction() == 0.0


def test_generated_blocks_are_cached_on_release():
    c = PrefixCache(10_000, 16)
    prompt = b"p" * (B * 2)
    out = b"o" * (B * 2)
    hs = block_hashes(prompt, 16)
    c.allocate(hs, total_blocks=4)
    c.release(hs, 4, block_hashes(prompt + out, 16))
    assert c.match(block_hashes(prompt + out + b"next", 16), 66) == 4


def test_offline_access_caches_the_output_and_counts_hits_on_the_prompt_only():
    c = PrefixCache(10_000, 16)
    prompt = b"p" * (B * 2)
    out = b"o" * (B * 2)
    assert c.access(prompt, out) == 0
    assert c.cached_blocks() == 4  # the answer's full blocks are held too
    assert c.access(prompt + out + b"next turn") == 64  # the next turn reuses the answer
    # a repeat of the prompt alone may not count the answer's blocks as its own
    assert c.access(prompt, out) == 16
