"""A Hugging Face tokenizer directory, used the way vLLM uses it.

The prompt of a request (chat, completion, Responses input) is built by the router's own
prompt module (prefix_router.prompt): vLLM's preprocessing of the messages, the chat template,
the tokenizer. The simulator plays the engine and the router predicts it; one renderer for
both means a chat's token ids are the same on both sides, so the router's keys match the
simulator's KV events (tests/router/test_prompt_cross.py checks it on a corpus of chats).
What is the simulator's own here: decoding its answers and the vocabulary it answers from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefix_router.conversation import PromptError, tool_dicts
from prefix_router.prompt import Prompt, Renderer

TINY_TOKENIZER = Path(__file__).parent / "data" / "tiny-tokenizer"


class ChatTokenizer:
    def __init__(self, directory: str | Path) -> None:
        self.renderer = Renderer(directory)
        self.directory = self.renderer.directory
        self.tokenizer = self.renderer.tokenizer
        self.special_tokens = self.renderer.special_tokens
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.renderer.encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def prompt(self, kind: str, body: Mapping[str, Any]) -> Prompt:
        """The prompt of a request body as vLLM builds it (`PromptError` where it refuses)."""
        return self.renderer.request(kind, body)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        try:
            p = self.renderer.chat(messages, tool_dicts(tools),
                                   add_generation_prompt=add_generation_prompt,
                                   chat_template_kwargs=template_kwargs)  # fmt: skip
        except PromptError as e:
            raise ValueError(str(e)) from None
        assert p.text is not None
        return p.text

    def chat_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        add_special_tokens: bool = False,
        **kw: Any,
    ) -> list[int]:
        return self.renderer.chat(messages, tool_dicts(tools),
                                  add_special_tokens=add_special_tokens, **kw).token_ids
