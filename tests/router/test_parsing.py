import json

import pytest

from prefix_router.errors import RequestError
from prefix_router.parsing import canonical_chat, next_turn_canonical, parse_request


def body(**kw):
    return json.dumps(kw).encode()


def test_chat_history_is_a_prefix_of_the_next_turn():
    sys = {"role": "system", "content": "You are helpful." * 20}
    turn1 = [sys, {"role": "user", "content": "hi"}]
    p = parse_request(body(model="m", messages=turn1), "chat")
    nxt = next_turn_canonical(p, "hello there")
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "more"},
    ]
    assert canonical_chat(turn2).startswith(nxt)
    assert canonical_chat(turn2).startswith(p.canonical)


def test_shared_system_prompt_is_shared_prefix():
    sys = {"role": "system", "content": "S" * 500}
    a = canonical_chat([sys, {"role": "user", "content": "a"}])
    b = canonical_chat([sys, {"role": "user", "content": "b"}])
    assert a[:500] == b[:500]


def test_content_parts_and_tools_in_order():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]
    parts = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}}]
    a = canonical_chat([{"role": "user", "content": parts}], tools)
    b = canonical_chat([{"role": "user", "content": list(reversed(parts))}], tools)
    assert a != b  # order matters
    # key order inside a tool definition does not
    tools2 = [{"function": {"parameters": {"a": 2, "b": 1}, "name": "f"}, "type": "function"}]
    assert a == canonical_chat([{"role": "user", "content": parts}], tools2)
    # roles matter
    assert canonical_chat([{"role": "user", "content": "x"}]) != canonical_chat(
        [{"role": "system", "content": "x"}]
    )


def test_cannot_forge_message_boundary():
    a = canonical_chat([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    b = canonical_chat([{"role": "user", "content": "a\nuser\nb"}])
    assert a != b


def test_completions_prompt_forms():
    assert parse_request(body(model="m", prompt="abc"), "completions").canonical == b"abc"
    assert parse_request(body(model="m", prompt=["abc", "d"]), "completions").canonical == b"abc"
    toks = parse_request(body(model="m", prompt=[1, 2, 3]), "completions").canonical
    assert toks != b"" and len(toks) > 12


@pytest.mark.parametrize(
    "raw,kind,status",
    [
        (b"{not json", "chat", 400),
        (b"[1,2]", "chat", 400),
        (body(messages=[{"role": "user", "content": "x"}]), "chat", 400),
        (body(model="m"), "chat", 400),
        (body(model="m", messages=[]), "chat", 400),
        (body(model="m", messages=["x"]), "chat", 400),
        (body(model="m", messages=[{"content": "x"}]), "chat", 400),
        (body(model="m", messages=[{"role": "user", "content": 5}]), "chat", 400),
        (body(model="m"), "completions", 400),
        (body(model="m", prompt=""), "completions", 400),
        (body(model="m", prompt=[1, -2]), "completions", 400),
        (body(model="m", prompt={"a": 1}), "completions", 400),
        (body(model="m", prompt="x", stream="yes"), "completions", 400),
        (body(model=5, prompt="x"), "completions", 400),
        (b"\xff\xfe", "completions", 400),
        (b"[" * 100_000 + b"]" * 100_000, "completions", 400),
        # lone surrogates, which JSON can escape but no text encoding holds
        (body(model="m", prompt="ab\ud800cd"), "completions", 400),
        (body(model="m", prompt=["\udc00"]), "completions", 400),
        (body(model="m", messages=[{"role": "user", "content": "a\udc00"}]), "chat", 400),
        (
            body(model="m", messages=[{"role": "u", "content": "x"}], tools=[{"x": "\ud800"}]),
            "chat",
            400,
        ),
        (body(model="m", prompt="x", cache_salt="\ud800"), "completions", 400),
    ],
)
def test_bad_input(raw, kind, status):
    with pytest.raises(RequestError) as e:
        parse_request(raw, kind)
    assert e.value.status == status
    assert e.value.message


def test_a_salt_header_that_is_not_text_is_400():
    # aiohttp hands header bytes that are not UTF-8 over as surrogate escapes
    with pytest.raises(RequestError) as e:
        parse_request(body(model="m", prompt="x"), "completions", "t\udcff")
    assert e.value.status == 400
    assert parse_request(body(model="m", prompt="x"), "completions", "tenant").cache_salt == (
        "tenant"
    )


def _deep_chat(where: str, depth: int) -> bytes:
    """A chat body whose deepest point is `depth` levels down (the body itself is level 1)
    in `where`: its tools, a content part or a message's tool_calls (written out: json.dumps
    cannot write what is too deep for it)."""
    def nested(levels: int) -> bytes:
        return b"[" * levels + b"]" * levels

    if where == "tools":  # body > tools > ...
        return b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": ' + \
            nested(depth - 1) + b"}"
    if where == "content":  # body > messages > message > content > part > image_url > ...
        return b'{"model": "m", "messages": [{"role": "user", "content": [{"type": ' \
            b'"image_url", "image_url": ' + nested(depth - 5) + b"}]}]}"
    # body > messages > message > tool_calls > ...
    return b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": ' + \
        nested(depth - 3) + b"}]}"


@pytest.mark.parametrize("where", ["tools", "content", "tool_calls"])
def test_nesting_is_bounded_at_parse_time(where: str) -> None:
    # Near 980 levels json.dumps of these parts (the canonical bytes) hit Python's recursion
    # limit: the router answered 500 with a traceback in its log.
    from prefix_router.parsing import MAX_DEPTH

    assert parse_request(_deep_chat(where, MAX_DEPTH), "chat").canonical
    for depth in (MAX_DEPTH + 1, 980, 985, 5000):
        with pytest.raises(RequestError) as e:
            parse_request(_deep_chat(where, depth), "chat")
        assert e.value.status == 400 and "nests deeper" in e.value.message
