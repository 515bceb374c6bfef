"""Token-aligned prefixes: the prompt as the engine sees it."""

import json

import pytest

from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes
from prefix_router.prompt import PromptError, Renderer
from prefix_router.tokens import token_bytes


def chat(messages, **extra):
    return parse_request(json.dumps({"model": "m", "messages": messages, **extra}).encode(), "chat")


def ids(r: Renderer, parsed) -> list[int]:
    return r.request(parsed.kind, parsed.body).token_ids


def test_the_rendered_history_is_a_token_prefix_of_the_next_turn(tokenizer_dir) -> None:
    tok = Renderer(tokenizer_dir)
    first = [{"role": "system", "content": "claims assistant " * 30},
             {"role": "user", "content": "question one"}]  # fmt: skip
    turn1 = chat(first)
    ids1 = ids(tok, turn1)
    history = tok.request("chat", turn1.body).next_turn("answer two").token_ids
    turn2 = chat([*first, {"role": "assistant", "content": "answer two"},
                  {"role": "user", "content": "question three"}])  # fmt: skip
    ids2 = ids(tok, turn2)
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
    tok = Renderer(tokenizer_dir)
    bos = tok.tokenizer.token_to_id("<|begin_of_text|>")
    got = ids(tok, chat([{"role": "user", "content": "hi"}]))
    assert got[0] == bos and got.count(bos) == 1
    given = parse_request(json.dumps({"model": "m", "prompt": [5, 6, 7]}).encode(), "completions")
    assert ids(tok, given) == [5, 6, 7]  # token ids pass as they are


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
    tok = Renderer(strict)
    with pytest.raises(PromptError) as err:
        ids(tok, chat([{"role": "assistant", "content": "x"}]))
    assert "user first" in str(err.value)


def test_cached_pieces_give_the_ids_of_the_whole_text(tokenizer_dir) -> None:
    tok = Renderer(tokenizer_dir, cache_bytes=4096)
    system = "claims assistant: answer each billing question briefly. " * 20
    for i in range(30):
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"question {i} " * (i % 7 + 1)}]  # fmt: skip
        prompt = tok.request("chat", chat(msgs).body)
        whole = tok.tokenizer.encode(prompt.text, add_special_tokens=False).ids
        assert prompt.token_ids == whole


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
        assert ids(Renderer(got), chat([{"role": "user", "content": "hi"}]))
        assert asked == [("/org/tiny/resolve/v2/tokenizer.json", "Bearer hf_secret"),
                         ("/org/tiny/resolve/v2/tokenizer_config.json", "Bearer hf_secret")]
        await asyncio.to_thread(fetch_tokenizer, "hf://org/tiny@v2", tmp_path)
        assert len(asked) == 2  # cached
    finally:
        await hub.close()


def test_short_pieces_are_kept_under_a_bound_and_give_the_same_ids(
    tokenizer_dir, monkeypatch
) -> None:
    import prefix_router.prompt as prompt

    monkeypatch.setattr(prompt, "SHORT_PIECES_MAX", 8)
    tok = Renderer(tokenizer_dir)
    for i in range(40):  # more distinct short messages than the bound
        p = tok.request("chat", chat([{"role": "user", "content": f"hi {i}"}]).body)
        assert p.token_ids == tok.tokenizer.encode(p.text, add_special_tokens=False).ids
