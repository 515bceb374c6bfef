"""An image in a chat is its own blocks of the key, as vLLM keys them: every block over the
image's placeholder tokens (its marker's bytes without a tokenizer) is hashed with the image's
identity, so two chats that differ only in the image part at the image's first block, equal
images share their blocks, and a text-only chat's key is what it always was (pinned)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.config import RouterSettings
from prefix_router.core import build_core
from prefix_router.keying import Key, Keyer
from prefix_router.parsing import parse_for_routing
from prefix_router.prefix import Media, block_hashes, chain_seed, extend_hashes

SEED = chain_seed("m", None)
SYSTEM = "You look at pictures and answer in one short sentence, plainly. " * 4
RED, BLUE = "data:image/png;base64," + "UkVE" * 400, "data:image/png;base64," + "QkxV" * 400
MODES = {"bytes": {}, "tokens": {"tokenizer": str(TINY_TOKENIZER)}}


QUESTION = "What is in this picture? Name every object you can see in it, left to right. " * 3


def chat(*images: str, question: str = QUESTION) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in images]
    return {"model": "m", "max_tokens": 8,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [*parts, {"type": "text", "text": question}]}]}


def keyer(mode: str) -> Keyer:
    return build_core(RouterSettings.model_validate(
        {"discovery": {"backends": ["http://198.18.0.1:8000"]}, **MODES[mode]})).keyer


def key(k: Keyer, body: dict[str, Any]) -> Key:
    parsed, _ = parse_for_routing(json.dumps(body).encode(), "chat", None, False, not k.renders)
    return asyncio.run(k.key(parsed, []))


def shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


# -- the chain ----------------------------------------------------------------------------------
def test_only_the_blocks_over_an_item_carry_it() -> None:
    data = bytes(range(256)) * 2  # 8 blocks of 64
    plain = block_hashes(data, 64, SEED)
    red = block_hashes(data, 64, SEED, media=[Media(150, 260, "red")])  # blocks 2, 3, 4
    blue = block_hashes(data, 64, SEED, media=[Media(150, 260, "blue")])
    assert red[:2] == plain[:2] and red[2] != plain[2]
    assert shared(red, blue) == 2  # another image: apart from its first block on
    assert red == block_hashes(data, 64, SEED, media=[Media(150, 260, "red")])
    # the same image elsewhere in the block is another block (vLLM keys its offset too)
    assert block_hashes(data, 64, SEED, media=[Media(151, 260, "red")])[2] != red[2]
    # a chain extended over the item equals the one computed whole
    assert extend_hashes(red[:3], data, 64, SEED, [Media(150, 260, "red")]) == red


def test_the_blocks_after_an_item_differ_only_through_the_chain() -> None:
    data = bytes(range(256)) * 2
    red = block_hashes(data, 64, SEED, media=[Media(0, 10, "red")])
    blue = block_hashes(data, 64, SEED, media=[Media(0, 10, "blue")])
    assert all(x != y for x, y in zip(red, blue, strict=True))  # a hash names its prefix


# -- the router's key ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_a_chat_that_differs_only_in_its_image_parts_at_the_images_first_block(mode) -> None:
    k = keyer(mode)
    red, red2, blue = key(k, chat(RED)), key(k, chat(RED)), key(k, chat(BLUE))
    assert red.hashes == red2.hashes  # the same image shares every block
    at = shared(red.hashes, blue.hashes)
    # where the image starts: its placeholder's first token, or its part's first byte
    if mode == "tokens":
        assert red.prompt is not None
        first = red.prompt.mm[0].offset * 4
    else:
        first = red.media[0].start
    assert at == first // k.sizing.block_bytes
    assert 0 < at < len(red.hashes) - 1


def test_byte_mode_keys_an_image_by_its_identity_not_its_base64_text() -> None:
    k = keyer("bytes")
    red = key(k, chat(RED))
    assert red.prompt is not None
    assert b"UkVE" not in red.prompt.canonical
    # the estimate no longer counts 1,600 base64 characters as 400 tokens
    assert red.prompt_tokens < key(k, chat()).prompt_tokens + 40


@pytest.mark.parametrize("mode", MODES)
def test_the_next_turn_of_an_image_chat_keeps_the_images_blocks(mode) -> None:
    k = keyer(mode)
    answer = "It is a red square on a white ground, nothing else. " * 3
    first = key(k, chat(RED))
    body = chat(RED)
    body["messages"] += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "And the background?"}]
    nxt = k.next_turn(first, answer)
    assert nxt[:len(first.hashes)] == first.hashes
    assert key(k, body).hashes[:len(nxt)] == nxt


def test_two_images_each_key_their_own_blocks() -> None:
    k = keyer("tokens")
    both = key(k, chat(RED, BLUE))
    swapped = key(k, chat(BLUE, RED))
    assert both.prompt is not None and len(both.prompt.mm) == 2
    first = both.prompt.mm[0].offset * 4 // k.sizing.block_bytes
    assert shared(both.hashes, swapped.hashes) == first


# -- text-only chats keep their keys ---------------------------------------------------------------
TEXT_CHAT = {
    "model": "m", "max_tokens": 8,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "messages": [
        {"role": "system", "content": "You are a careful assistant. " * 12},
        {"role": "user", "content": [
            {"type": "text", "text": "Summarise this report, please. " * 6},
            {"type": "text", "text": "And keep it short."}]},
        {"role": "assistant", "content": "Sure: it says the numbers went up."},
        {"role": "user", "content": "Thanks, and why?"}]}
# (blocks, first hash, last hash, next turn's blocks, its last hash), computed at ec7484d,
# before media had blocks of their own
PINNED = {"bytes": (11, 1677747077572374609, 17614311529138502083, 19, 1454360009589864882),
          "tokens": (25, 16653586198212511777, 11688343200738017483, 36, 638930311616846905)}


@pytest.mark.parametrize("mode", MODES)
def test_a_text_only_chats_key_is_what_it_was(mode) -> None:
    k = keyer(mode)
    got = key(k, TEXT_CHAT)
    nxt = k.next_turn(got, "Because of the weather, " * 20)
    assert (len(got.hashes), got.hashes[0], got.hashes[-1], len(nxt), nxt[-1]) == PINNED[mode]
