"""prefix_router.responses: the answer and usage read from engines' replies."""

from __future__ import annotations

import json

from prefix_router.responses import read_json, read_sse


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chat_chunk(text: str, index: int = 0) -> dict:
    return {
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": index, "delta": {"content": text}, "logprobs": None,
                     "finish_reason": None}],
    }


USAGE = {"prompt_tokens": 120, "completion_tokens": 3, "total_tokens": 123,
         "prompt_tokens_details": {"cached_tokens": 96}}


def test_sse_chat_answer_and_usage():
    buf = b"".join([
        _event({**_chat_chunk("he"), "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                         "content": "he"}}]}),
        _event(_chat_chunk("llo")),
        _event(_chat_chunk("other choice", index=1)),
        _event({"id": "c", "choices": [], "usage": USAGE}),
        b"data: [DONE]\n\n",
    ])
    assert read_sse(buf, "chat") == ("hello", (120, 96))


def test_sse_completions_text_and_no_usage():
    buf = b"".join([
        _event({"choices": [{"index": 0, "text": "ab"}]}),
        _event({"choices": [{"index": 0, "text": "cd", "finish_reason": "length"}]}),
        b"data: [DONE]\n\n",
    ])
    assert read_sse(buf, "completions") == ("abcd", None)


def test_sse_cut_short_has_no_answer_but_keeps_usage():
    buf = _event(_chat_chunk("partial")) + _event({"choices": [], "usage": USAGE})
    assert read_sse(buf, "chat") == (None, (120, 96))


def test_sse_a_malformed_event_is_skipped_not_the_stream():
    buf = b"".join([
        _event(_chat_chunk("a")),
        b"data: {not json\n\n",
        _event({"choices": [{"index": 0, "delta": {"content": 5}}]}),  # a field of another type
        b": a comment line\n\n",
        _event(_chat_chunk("b")),
        b"data: [DONE]\n\n",
    ])
    assert read_sse(buf, "chat") == ("ab", None)


def test_sse_null_content_and_missing_cached_tokens():
    buf = b"".join([
        _event({"choices": [{"index": 0, "delta": {"content": None}}]}),
        _event(_chat_chunk("x")),
        _event({"choices": [], "usage": {"prompt_tokens": 7}}),
        b"data: [DONE]\n\n",
    ])
    assert read_sse(buf, "chat") == ("x", (7, None))  # unknown, not zero


def test_json_chat_and_completions():
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": USAGE}
    assert read_json(json.dumps(chat).encode(), "chat") == ("hi", (120, 96))
    comp = {"choices": [{"index": 0, "text": "yo"}], "usage": {"prompt_tokens": 3,
                                                                "prompt_tokens_details": None}}
    assert read_json(json.dumps(comp).encode(), "completions") == ("yo", (3, None))


def test_json_not_an_answer():
    assert read_json(b"not json", "chat") == (None, None)
    assert read_json(b"[1, 2]", "chat") == (None, None)
    assert read_json(b'{"usage": {"prompt_tokens": true}}', "chat") == (None, None)
    assert read_json(b'{"choices": []}', "chat") == (None, None)


def test_llama_cpp_timings_stand_in_for_usage_in_a_stream_without_it():
    buf = b"".join([
        _event(_chat_chunk("x")),
        _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "timings": {"cache_n": 96, "prompt_n": 24}}),
        b"data: [DONE]\n\n",
    ])
    assert read_sse(buf, "chat") == ("x", (120, 96))
