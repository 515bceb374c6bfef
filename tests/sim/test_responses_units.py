"""The pure parts of the Responses API: input items -> chat messages as vLLM builds them, and
the bounded response store."""

from __future__ import annotations

import pytest

from engine_sim.chat import render_chat
from engine_sim.responses_store import ResponseStore, Stored
from prefix_router.responses_input import chat_tools, input_messages


def test_instructions_and_items_are_the_equivalent_chat() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": "http://x/cat.png"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]  # fmt: skip
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}]},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]  # fmt: skip
    got = input_messages("sys", items)
    assert got == chat
    assert render_chat(got) == render_chat(chat)
    assert input_messages(None, "hi") == [{"role": "user", "content": "hi"}]


def test_a_previous_response_is_its_messages_then_its_output() -> None:
    prev_messages = [{"role": "system", "content": "old"}, {"role": "user", "content": "q1"}]
    prev_output = [
        {"type": "reasoning", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "a1"}],
        },
    ]
    got = input_messages("new", "q2", (prev_messages, prev_output))
    # vLLM: the new instructions first, then everything stored (the old ones too)
    assert got == [
        {"role": "system", "content": "new"},
        *prev_messages,
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]


@pytest.mark.parametrize(
    "instructions,items",
    [
        (None, 5),
        (None, []),
        (3, "x"),
        (None, [{"type": "message"}]),
        (None, [{"role": "user", "content": [{"type": "input_audio"}]}]),
        (None, [{"type": "function_call", "name": "f"}]),
        (None, [{"type": "file_search_call"}]),
    ],
)
def test_bad_input_is_a_value_error(instructions, items) -> None:
    with pytest.raises(ValueError):
        input_messages(instructions, items)


def test_tools_are_nested_under_function_and_dropped_with_tool_choice_none() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    (got,) = chat_tools([tool], "auto")
    assert got["type"] == "function"
    assert list(got["function"]) == ["name", "parameters", "strict", "type", "description"]
    assert got["function"]["name"] == "f" and got["function"]["description"] is None
    assert chat_tools([tool], "none") is None
    assert chat_tools(None, "auto") is None


def _entry(n: int, status: str = "completed") -> Stored:
    return Stored({"status": status, "output": [], "pad": "x" * n}, [])


async def test_the_store_is_bounded_and_forgets_the_least_recently_used() -> None:
    store = ResponseStore(max_bytes=5_000)
    for i in range(3):
        store.put(f"r{i}", _entry(1_000))
    assert len(store) == 3 and store.bytes <= 5_000
    store.get("r0")  # used: r1 is now the oldest
    store.put("r3", _entry(1_000))
    assert store.get("r1") is None and store.get("r0") is not None
    assert store.evicted == 1 and store.bytes <= 5_000


async def test_a_running_response_is_never_evicted() -> None:
    store = ResponseStore(max_bytes=3_000)
    store.put("bg", _entry(1_000, status="queued"))
    for i in range(5):
        store.put(f"r{i}", _entry(1_000))
    assert store.get("bg") is not None
    store.grow("bg", 10_000)  # its stream's events: over the bound, still kept
    assert store.get("bg") is not None and len(store) == 1
