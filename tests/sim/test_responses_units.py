"""The pure parts of the Responses API: input items -> chat messages as vLLM builds them, and
the bounded response store."""

from __future__ import annotations

import pytest

from engine_sim.chat import render_chat
from engine_sim.responses_store import ResponseStore, Stored
from prefix_router.conversation import PromptError
from prefix_router.responses_chat import responses_chat, responses_messages, responses_tools


def test_instructions_and_items_are_the_equivalent_chat() -> None:
    user = {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                        {"type": "input_image", "image_url": "http://x/cat.png"}]}
    items = [
        user,
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]  # fmt: skip
    got, cont = responses_messages("sys", items)
    assert got == [
        {"role": "system", "content": "sys"},
        user,  # a message item passes as it is: the chat preprocessing reads its parts
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]  # fmt: skip
    assert not cont
    assert render_chat(got) == render_chat([got[0], {"role": "user", "content": [
        {"type": "text", "text": "look"}, user["content"][1]]}, *got[2:]])
    assert responses_messages(None, "hi") == ([{"role": "user", "content": "hi"}], False)


def test_reasoning_and_the_calls_after_it_are_one_assistant_message() -> None:
    call = {"type": "function_call", "name": "f", "arguments": "{}"}
    items = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {**call, "call_id": "c1"},
        {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                               "text": "done"}]},
    ]  # fmt: skip
    got, _ = responses_messages(None, items)
    assert [m["role"] for m in got] == ["assistant", "tool", "tool", "assistant"]
    assert got[0]["reasoning"] == "think"
    assert [c["id"] for c in got[0]["tool_calls"]] == ["c1", "c2"]
    assert got[3] == {"role": "assistant", "content": "done"}


def test_an_assistant_message_in_progress_is_continued() -> None:
    items = [{"role": "user", "content": "q"},
             {"type": "message", "role": "assistant", "status": "in_progress",
              "content": [{"type": "output_text", "text": "The answer is"}]}]  # fmt: skip
    chat = responses_chat({"input": items})
    assert chat["continue_final_message"] and not chat["add_generation_prompt"]
    assert chat["messages"][-1] == {"role": "assistant", "content": "The answer is"}


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
    got, _ = responses_messages("new", "q2", (prev_messages, prev_output))
    # vLLM 0.34: the new instructions first, then what was stored without its system
    # messages (instructions do not carry over), then the output
    assert got == [
        {"role": "system", "content": "new"},
        {"role": "user", "content": "q1"},
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
        (None, [{"type": "function_call", "name": "f"}]),
        (None, [{"type": "function_call_output", "call_id": "c1", "output": 3}]),
        (None, [{"type": "reasoning", "encrypted_content": "gAAA"}]),
        (None, [{"type": "file_search_call"}]),
        (None, ["text"]),
    ],
)
def test_bad_input_is_a_prompt_error(instructions, items) -> None:
    with pytest.raises(PromptError):
        responses_messages(instructions, items)


def test_tools_are_nested_under_function_as_vllm_dumps_them() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    (got,) = responses_tools([tool, {"type": "web_search"}])
    assert got == {"type": "function", "function": {"name": "f", "description": None,
                                                    "parameters": {"type": "object"}}}
    # vLLM keeps them with tool_choice "none" unless started to exclude them
    assert responses_chat({"input": "q", "tools": [tool], "tool_choice": "none"})["tools"]
    assert responses_tools(None) is None
    with pytest.raises(PromptError):
        responses_tools([3])


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
