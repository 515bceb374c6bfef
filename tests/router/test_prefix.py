from prefix_router.prefix import block_hashes, chain_seed, extend_hashes


def test_only_full_blocks_are_hashed():
    assert len(block_hashes(b"a" * 63, 64, 1)) == 0
    assert len(block_hashes(b"a" * 64, 64, 1)) == 1
    assert len(block_hashes(b"a" * 200, 64, 1)) == 3


def test_chain_names_the_whole_prefix():
    seed = chain_seed("m", None)
    a = block_hashes(b"x" * 64 + b"y" * 64, 64, seed)
    b = block_hashes(b"z" * 64 + b"y" * 64, 64, seed)
    # Same second block after a different first block must not collide.
    assert a[1] != b[1]
    assert a[0] != b[0]


def test_shared_prefix_shares_hashes():
    seed = chain_seed("m", None)
    common = b"s" * 640
    a = block_hashes(common + b"user one" * 20, 64, seed)
    b = block_hashes(common + b"user two" * 20, 64, seed)
    assert a[:10] == b[:10]
    assert a[10] != b[10]


def test_model_and_salt_isolate():
    data = b"q" * 256
    base = block_hashes(data, 64, chain_seed("m", None))
    assert base != block_hashes(data, 64, chain_seed("other", None))
    assert base != block_hashes(data, 64, chain_seed("m", "tenant-a"))
    assert block_hashes(data, 64, chain_seed("m", "tenant-a")) != block_hashes(
        data, 64, chain_seed("m", "tenant-b")
    )


def test_limit():
    assert len(block_hashes(b"a" * 6400, 64, 1, limit=5)) == 5


def test_extend_matches_full_hash():
    seed = chain_seed("m", None)
    first = b"p" * 300
    full = first + b"answer" * 50
    assert extend_hashes(block_hashes(first, 64, seed), full, 64, seed) == block_hashes(
        full, 64, seed
    )


def test_a_prompt_is_keyed_by_its_first_blocks_only():
    from prefix_router.prefix import MAX_CHAIN_BLOCKS

    long = bytes(range(256)) * (MAX_CHAIN_BLOCKS // 2 + 10)  # 4 blocks of 64 per repeat
    chain = block_hashes(long, 64, 1)
    assert len(chain) == MAX_CHAIN_BLOCKS
    assert chain == block_hashes(long[: 64 * MAX_CHAIN_BLOCKS], 64, 1)
    assert extend_hashes(chain[:10], long, 64, 1) == chain
