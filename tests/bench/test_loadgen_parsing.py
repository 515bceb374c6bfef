"""The load generator's stream reading: where TTFT stops, what answer and usage it keeps."""

import pytest

from bench.harness.loadgen import _ends_done, _first_content, _read_events

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOK_A = b'data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}\n\n'
TOK_B = b'data: {"choices":[{"index":0,"delta":{"content":"cd"}}]}\n\n'
USAGE = (
    b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":8}}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_an_event_without_content_does_not_stop_the_clock():
    buf = bytearray(ROLE)
    found, unread = _first_content(buf, 0, "chat")
    assert not found and unread == len(ROLE)
    buf += TOK_A
    found, _ = _first_content(buf, unread, "chat")
    assert found


def test_an_event_split_across_reads_is_read_once_whole():
    stream = TOK_A
    buf = bytearray(stream[:20])
    found, unread = _first_content(buf, 0, "chat")
    assert not found and unread == 0  # half a line: nothing consumed
    buf += stream[20:]
    assert _first_content(buf, unread, "chat")[0]


def test_the_answer_usage_and_end_come_from_the_whole_stream():
    done, text, usage, _ = _read_events(ROLE + TOK_A + TOK_B + USAGE + DONE, "chat")
    assert done and text == "abcd"
    assert usage is not None and usage.prompt_tokens == 9 and usage.completion_tokens == 2


def test_a_stream_without_done_is_not_complete():
    done, text, _, _ = _read_events(TOK_A + TOK_B, "chat")
    assert not done and text == "abcd"


def test_completions_read_text_and_crlf_lines():
    ev = b'data: {"choices":[{"index":0,"text":"xy"}]}\r\n\r\n'
    assert _first_content(bytearray(ev), 0, "completions")[0]
    assert _read_events(ev + b"data: [DONE]\r\n\r\n", "completions")[:2] == (True, "xy")


def test_an_event_that_is_not_json_is_an_error():
    with pytest.raises(ValueError):
        _read_events(b"data: {oops\n\n" + DONE, "chat")
    with pytest.raises(ValueError):
        _first_content(bytearray(b"data: {oops\n\n"), 0, "chat")


@pytest.mark.parametrize(
    "tail,done",
    [
        (DONE, True),
        (b"data:[DONE]\r\n\r\n", True),
        (b"data: [DONE]\n", True),
        (b"data: [DONE]", False),  # the line may not be whole yet
        (TOK_A, False),
        (b": keep-alive\n\n", False),
    ],
)
def test_the_read_stops_at_a_whole_done_line(tail, done):
    assert _ends_done(bytearray(TOK_A + tail)) is done


def test_an_empty_usage_does_not_replace_a_reported_one():
    empty = b'data: {"choices":[],"usage":{}}\n\n'
    _, _, usage, _ = _read_events(USAGE + empty + DONE, "chat")
    assert usage is not None and usage.prompt_tokens == 9


def test_numbers_of_another_json_type_are_read_as_before():
    ev = b'data: {"choices":[],"usage":{"prompt_tokens":9.0,"completion_tokens":"2"}}\n\n'
    _, _, usage, _ = _read_events(ev + DONE, "chat")
    assert usage is not None and usage.prompt_tokens == 9 and usage.completion_tokens == 2


def test_a_stream_ended_with_an_error_event_is_not_a_whole_answer():
    # what our router sends when the engine cut the stream after its first bytes
    err = b'data: {"error": {"message": "the stream from the engine was cut"}}\n\n'
    done, text, _, error = _read_events(ROLE + TOK_A + err + DONE, "chat")
    assert done and text == "ab" and error == "the stream from the engine was cut"
