"""Token-aligned prefixes: the prompt as the engine sees it."""

import json

import pytest

from prefix_router.errors import RequestError
from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes
from prefix_router.tokens import ChatTokenizer, token_bytes


def chat(messages, **extra):
    return parse_request(json.dumps({"model": "m", "messages": messages, **extra}).encode(), "chat")


def test_the_rendered_history_is_a_token_prefix_of_the_next_turn(tokenizer_dir) -> None:
    tok = ChatTokenizer(tokenizer_dir)
    first = [{"role": "system", "content": "claims assistant " * 30},
             {"role": "user", "content": "question one"}]  # fmt: skip
    turn1 = chat(first)
    ids1 = tok.prompt_ids(turn1)
    history = tok.next_turn_ids(turn1, "answer two")
    turn2 = chat([*first, {"role": "assistant", "content": "answer two"},
                  {"role": "user", "content": "question three"}])  # fmt: skip
    ids2 = tok.prompt_ids(turn2)
    assert ids2[: len(history)] == history
    # turn 1 ends with the generation prompt, which the answer's turn starts with (the last
    # token may merge differently): its blocks are the next turn's
    common = 0
    while common < len(ids1) and ids1[common] == ids2[common]:
        common += 1
    assert common >= len(ids1) - 1
    h1 = block_hashes(token_bytes(ids1), 16 * 4, 1)
    h2 = block_hashes(token_bytes(ids2), 16 * 4, 1)
    assert h2[: common // 16] == h1[: common // 16]


def test_the_bos_is_rendered_once_and_completions_get_it_from_the_tokenizer(
    tokenizer_dir,
) -> None:
    tok = ChatTokenizer(tokenizer_dir)
    bos = tok._tok.token_to_id("<|begin_of_text|>")
    ids = tok.prompt_ids(chat([{"role": "user", "content": "hi"}]))
    assert ids[0] == bos and ids.count(bos) == 1
    given = parse_request(json.dumps({"model": "m", "prompt": [5, 6, 7]}).encode(), "completions")
    assert tok.prompt_ids(given) == [5, 6, 7]  # token ids pass as they are


def test_a_template_that_refuses_a_conversation_is_a_400(tokenizer_dir, tmp_path) -> None:
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    strict = tmp_path / "strict"
    strict.mkdir()
    (strict / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    cfg["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        + cfg["chat_template"]
    )
    (strict / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = ChatTokenizer(strict)
    with pytest.raises(RequestError) as err:
        tok.prompt_ids(chat([{"role": "assistant", "content": "x"}]))
    assert err.value.status == 400 and "user first" in err.value.message


def test_cached_pieces_give_the_ids_of_the_whole_text(tokenizer_dir) -> None:
    tok = ChatTokenizer(tokenizer_dir, cache_bytes=4096)
    assert tok._pieces is not None  # this tokenizer splits at its special tokens
    system = "claims assistant: answer each billing question briefly. " * 20
    for i in range(30):
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"question {i} " * (i % 7 + 1)}]  # fmt: skip
        text = tok._text(msgs, None, True)
        whole = tok._tok.encode(text, add_special_tokens=False).ids
        assert tok.prompt_ids(chat(msgs)) == whole
    assert tok._pieces._size <= 4096  # bounded


async def test_a_hub_tokenizer_is_fetched_once_with_the_token(tokenizer_dir, tmp_path,
                                                              monkeypatch) -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from prefix_router.tokens import fetch_tokenizer

    asked: list[tuple[str, str | None]] = []

    async def resolve(request: web.Request) -> web.Response:
        asked.append((request.path, request.headers.get("Authorization")))
        return web.Response(body=(tokenizer_dir / request.match_info["name"]).read_bytes())

    app = web.Application()
    app.router.add_get("/org/tiny/resolve/{rev}/{name}", resolve)
    hub = TestServer(app)
    await hub.start_server()
    try:
        monkeypatch.setenv("HF_ENDPOINT", str(hub.make_url("")))
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        got = await asyncio.to_thread(fetch_tokenizer, "hf://org/tiny@v2", tmp_path)
        assert ChatTokenizer(got).prompt_ids(chat([{"role": "user", "content": "hi"}]))
        assert asked == [("/org/tiny/resolve/v2/tokenizer.json", "Bearer hf_secret"),
                         ("/org/tiny/resolve/v2/tokenizer_config.json", "Bearer hf_secret")]
        await asyncio.to_thread(fetch_tokenizer, "hf://org/tiny@v2", tmp_path)
        assert len(asked) == 2  # cached
    finally:
        await hub.close()


def test_short_pieces_are_kept_under_a_bound_and_give_the_same_ids(
    tokenizer_dir, monkeypatch
) -> None:
    import prefix_router.tokens as tokens

    monkeypatch.setattr(tokens, "SHORT_PIECES_MAX", 8)
    tok = ChatTokenizer(tokenizer_dir)
    assert tok._pieces is not None
    for i in range(40):  # more distinct short messages than the bound
        msgs = [{"role": "user", "content": f"hi {i}"}]
        whole = tok._tok.encode(tok._text(msgs, None, True), add_special_tokens=False).ids
        assert tok.prompt_ids(chat(msgs)) == whole
        assert len(tok._pieces._short) <= 8
