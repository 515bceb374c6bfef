"""The prompt module against vLLM's rendering, captured once (tests/fixtures/vllm-prompts/).

Each golden case holds what vLLM 0.34.0 hands the chat template (its preprocessing applied by
hand, the source lines named in the case) and what transformers' apply_chat_template made of
it on the tiny tokenizer (hack/capture-vllm-prompts.py): our preprocessing must give the same
conversation, and our renderer the same text and token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.conversation import conversation
from prefix_router.prompt import Renderer
from prefix_router.responses_chat import responses_messages, responses_tools

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-prompts"
CASES = json.loads((FIXTURES / "golden-cases.json").read_text())["cases"]
GOLDEN = {c["name"]: c for c in json.loads((FIXTURES / "golden.json").read_text())["cases"]}


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer(TINY_TOKENIZER)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_conversation_is_the_one_vllm_hands_the_template(case, renderer) -> None:
    body = case["body"]
    if case["api"] == "responses":
        messages, _ = responses_messages(body.get("instructions"), body["input"])
        assert responses_tools(body.get("tools")) == case["tools"]
    else:
        messages = body["messages"]
    conv, _ = conversation(messages, renderer.content_format, renderer.placeholders,
                           renderer.developer_role)  # fmt: skip
    assert conv == case["conversation"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_prompt_is_the_one_vllm_renders(case, renderer) -> None:
    prompt = renderer.request(case["api"], {"model": "m", **case["body"]})
    golden = GOLDEN[case["name"]]
    assert prompt.text == golden["text"]
    assert prompt.token_ids == golden["token_ids"]


def test_an_image_is_located_in_the_token_ids(renderer) -> None:
    case = next(c for c in CASES if c["name"] == "image")
    prompt = renderer.request("chat", case["body"])
    (part,) = prompt.mm
    ids = prompt.token_ids
    assert part.modality == "image" and part.length > 0
    # the tokens that hold the placeholder (here not a special token of its own: its last
    # character merges with the newline after it)
    span = renderer.tokenizer.decode(ids[part.offset:part.offset + part.length])
    assert span.startswith("<|image|>") and len(span) <= len("<|image|>\n")
    before = renderer.tokenizer.decode(ids[:part.offset], skip_special_tokens=False)
    assert before.endswith("<|end_header_id|>\n\n")
    # a data URL is its own content: the same image elsewhere is the same hash
    again = renderer.request("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": case["body"]["messages"][0]["content"][1]["image_url"]}
    ]}]})
    assert again.mm[0].hash == part.hash
