"""The prompt module's rules beyond the golden cases: Responses input, prefill, refusals,
templates that take content as parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.core import build_core
from prefix_router.errors import RequestError
from prefix_router.parsing import parse_request
from prefix_router.prompt import PromptError, Renderer


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(TINY_TOKENIZER)


def test_a_responses_request_is_the_prompt_of_its_equivalent_chat(renderer) -> None:
    tools = [{"type": "function", "name": "grep", "description": "search",
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
    responses = renderer.request("responses", {"instructions": "Be exact.", "tools": tools,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "find it"}]},
                  {"type": "function_call", "call_id": "c1", "name": "grep",
                   "arguments": "{\"q\": \"x\"}"},
                  {"type": "function_call", "call_id": "c2", "name": "grep",
                   "arguments": "{\"q\": \"y\"}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
                  {"type": "function_call_output", "call_id": "c2", "output": "b.py"}]})
    chat = renderer.request("chat", {"tools": [{"type": "function", "function": {
        k: v for k, v in tools[0].items() if k != "type"}}], "messages": [
        {"role": "system", "content": "Be exact."}, {"role": "user", "content": "find it"},
        # two calls in a row are one assistant message with both
        {"role": "assistant", "tool_calls": [_call("c1", "x"), _call("c2", "y")]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "b.py"}]})  # fmt: skip
    assert responses.token_ids == chat.token_ids


def _call(cid: str, q: str) -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": "grep", "arguments": json.dumps({"q": q})}}


def test_an_assistant_message_in_progress_is_continued(renderer) -> None:
    body = {"input": [{"type": "message", "role": "user", "content": "Name it."},
                      {"type": "message", "role": "assistant", "status": "in_progress",
                       "content": [{"type": "output_text", "text": "It is called"}]}]}
    prompt = renderer.request("responses", body)
    assert prompt.text is not None and prompt.text.endswith("It is called")
    # the answer goes on in the same message: the prompt is a prefix of the next turn
    nxt = renderer.request("responses", body).next_turn(" Ada.")
    assert nxt.text is not None and nxt.text.startswith(prompt.text)
    assert "It is called Ada.<|eot_id|>" in nxt.text
    ids, more = prompt.token_ids, nxt.token_ids
    assert more[: len(ids) - 1] == ids[:-1]  # the last token may merge with the answer's


def test_both_generation_prompt_and_continuation_are_refused_with_a_400(renderer) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "continue_final_message": True}  # add_generation_prompt defaults to true
    with pytest.raises(PromptError):
        renderer.request("chat", body)
    s = RouterSettings(tokenizer=str(TINY_TOKENIZER))
    members = BackendSet()
    members.set_members(["http://198.18.0.1:8000"])
    core = build_core(s, members)
    with pytest.raises(RequestError) as err:
        core.keyer.prompt(parse_request(json.dumps(body).encode(), "chat"))
    assert err.value.status == 400 and "continue_final_message" in err.value.message


def test_an_unknown_part_type_is_refused(renderer) -> None:
    with pytest.raises(PromptError, match="unsupported chat content part type"):
        renderer.request("chat", {"messages": [{"role": "user", "content": [
            {"type": "hologram", "data": "x"}]}]})


def test_a_template_that_loops_over_content_gets_the_parts(tmp_path: Path) -> None:
    """vLLM's "openai" content format: texts and media stay parts, in order."""
    d = tmp_path / "parts"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((TINY_TOKENIZER / "tokenizer.json").read_bytes())
    cfg = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for message in messages %}[{{ message['role'] }}]"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}<IMG>"
        "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = Renderer(d)
    assert r.content_format == "openai"
    p = r.request("chat", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}},
        "then"]}], "add_generation_prompt": False})
    assert p.text == "[user]see<IMG>then"
    assert [m.modality for m in p.mm] == ["image"] and p.mm[0].offset == -1


def test_a_placeholder_made_of_special_tokens_is_located() -> None:
    """Real multimodal models' placeholders are special tokens (Qwen2-VL's are three): each
    part's offset and length name exactly them, whatever text is around."""
    r = Renderer(TINY_TOKENIZER, placeholders={"image": "<|python_tag|><|eom_id|>"})
    tag, eom = (r.tokenizer.token_to_id(t) for t in ("<|python_tag|>", "<|eom_id|>"))
    image = {"type": "image_url", "image_url": {"url": "https://198.18.0.1/a.png"}}
    p = r.request("chat", {"messages": [
        {"role": "system", "content": "look " * 50},
        {"role": "user", "content": [{"type": "text", "text": "first"}, image]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image, {"type": "text", "text": "again"}]}]})
    ids = p.token_ids
    assert [(m.length, ids[m.offset:m.offset + 2]) for m in p.mm] == [(2, [tag, eom])] * 2
    assert p.mm[0].hash == p.mm[1].hash and p.mm[0].offset < p.mm[1].offset


def test_media_the_router_has_no_placeholder_for_are_routed_not_refused(renderer) -> None:
    """An audio or embeddings part: the engine may take it (an audio model, --enable-mm-embeds);
    the router keys it with vLLM's own marker rather than refuse it."""
    p = renderer.request("chat", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "image_embeds", "image_embeds": {"a": "AAAA"}},
        {"type": "image_embeds", "image_embeds": {"a": "BBBB"}}, "what is it?"]}]})
    assert p.text is not None and "<##AUDIO##>\n<|image|>\n<|image|>\nwhat is it?" in p.text
    assert [m.modality for m in p.mm] == ["audio", "image", "image"]
    assert p.mm[1].hash != p.mm[2].hash  # their data tells them apart
