"""The engine's prompt, built as vLLM builds it: one module for the router and the simulator.

The router keys a prompt by the engine's token ids, and the engine's KV events name the same
ids: the two only meet if both render a request the same way. So the simulator (which plays
vLLM) and the router import this one `Renderer`: vLLM's preprocessing of the messages
(conversation.py), then the model's chat template as transformers' `apply_chat_template`
renders it (a sandboxed jinja2 environment with trimmed blocks, loop controls,
`raise_exception`, `strftime_now` and a `tojson` that does not escape HTML; the special
tokens and the request's `chat_template_kwargs` in the context), then the tokenizer, without
adding special tokens again (the template writes them). A completion prompt is tokenized
with them, as vLLM does.

`add_generation_prompt` (default true) and `continue_final_message` (the final message left
open: the text is cut right after its content, transformers' rule) come from the request,
and the two together are refused, as vLLM refuses them.

Tokenizing is the costly part (1-5 ms for 2,000 tokens) and most of a prompt was seen
before: the tokenizer splits at its special tokens first and each piece's ids never depend
on its neighbours, so pieces are cached (bounded in bytes) and only new text is tokenized.
Whether a tokenizer really splits that way is checked when it is loaded.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .conversation import (
    ContentFormat,
    MediaItem,
    PromptError,
    conversation,
    tool_dicts,
)
from .prefix import Media
from .responses_chat import responses_chat

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("prefix_router.prompt")

# Pieces shorter than this (role names, separators) are kept in a plain dict: a tokenizer
# call costs 3-6 us, a lookup 0.04 us. Longer ones go to the LRU bounded in bytes.
CACHE_MIN_CHARS = 64
SHORT_PIECES_MAX = 4096  # distinct short pieces kept; the dict starts over when full
# A model whose directory names no placeholder: Llama 4's (vllm 0.34.0,
# vllm/model_executor/models/mllama4.py l. 731-733), the tiny tokenizer's family.
DEFAULT_PLACEHOLDERS: Mapping[str, str] = {"image": "<|image|>"}
# vLLM's placeholder per model type, for a directory with a config.json (each model class's
# get_placeholder_str in vllm/model_executor/models/)
PLACEHOLDERS_BY_MODEL_TYPE: Mapping[str, Mapping[str, str]] = {
    "llama4": {"image": "<|image|>"},
    "llava": {"image": "<image>"},
    "qwen2_vl": {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                 "video": "<|vision_start|><|video_pad|><|vision_end|>"},
    "qwen2_5_vl": {"image": "<|vision_start|><|image_pad|><|vision_end|>",
                   "video": "<|vision_start|><|video_pad|><|vision_end|>"},
    "gemma3": {"image": "<start_of_image>"},
    "phi3_v": {"image": "<|image_{n}|>"},
}


def token_bytes(ids: list[int]) -> bytes:
    """Token ids as a tokenized prompt's canonical bytes: 4-byte words (sizing.py counts on it)."""
    return array("I", ids).tobytes()


@dataclass(frozen=True, slots=True)
class MultiModalPart:
    """A media item in the prompt: where its placeholder's tokens are (`offset` into the
    token ids, -1 where the template did not write the placeholder) and what identifies its
    content (as vLLM's mm hashes do): the blocks over the placeholder are keyed with it."""

    modality: str
    offset: int
    length: int
    hash: str


@dataclass(frozen=True, slots=True)
class Chat:
    """What a chat prompt was rendered from: enough to render its next turn."""

    messages: tuple[dict[str, Any], ...]
    tools: list[dict[str, Any]] | None
    kwargs: Mapping[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool


@dataclass(frozen=True, slots=True, eq=False)
class Prompt:
    """The prompt the engine runs: `canonical` is what the prefix key is computed over (token
    ids as 4-byte words where the tokenizer is known, else canonical bytes), `text` the
    rendered text (None for token ids given or byte prompts), `mm` its media parts."""

    canonical: bytes
    text: str | None = None
    mm: tuple[MultiModalPart, ...] = ()
    exact: bool = True  # token ids (True) or canonical bytes
    continuation: Callable[[str], Prompt] | None = field(default=None, repr=False)

    @property
    def token_ids(self) -> list[int]:
        if not self.exact:
            raise ValueError("a prompt of canonical bytes has no token ids")
        return array("I", self.canonical).tolist()

    def next_turn(self, answer: str) -> Prompt:
        """The prompt this conversation's next turn starts with: this one and the answer."""
        if self.continuation is None:
            return self  # token ids given: the answer's ids are not known
        return self.continuation(answer)


def token_media(prompt: Prompt) -> tuple[Media, ...]:
    """The prompt's media items as spans of its canonical bytes (4 a token id), for the key:
    an item the template did not write (no placeholder) has no tokens to key."""
    return tuple(Media(p.offset * 4, (p.offset + p.length) * 4, p.hash)
                 for p in prompt.mm if p.offset >= 0 and p.length > 0)  # fmt: skip


class Encoder:
    """Text -> token ids as 4-byte words, piece by piece between special tokens."""

    def __init__(self, tok: Tokenizer, budget_bytes: int = 64 << 20) -> None:
        self.tok = tok
        added = tok.get_added_tokens_decoder()
        self._special = {t.content: token_bytes([i]) for i, t in added.items() if t.content}
        names = sorted(self._special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._short: dict[str, bytes] = {}
        self._lock = threading.Lock()  # large prompts are tokenized in a worker thread
        self._size = 0
        self._budget = budget_bytes
        self._pieces = True
        marks = names[:4] or [""]
        probe = "".join(f"{m} A system, prompt.\n\n{m}Hi  there! " for m in marks)
        if self.encode(probe) != self.whole(probe):
            log.warning("this tokenizer does not split at its special tokens alone: prompts "
                        "are tokenized whole, uncached")  # fmt: skip
            self._pieces = False

    def whole(self, text: str) -> bytes:
        return token_bytes(self.tok.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> bytes:
        if not self._pieces:
            return self.whole(text)
        if self._split is None:
            return self._piece(text)
        special = self._special
        return b"".join(special.get(p) or self._piece(p) for p in self._split.split(text) if p)

    def pieces(self, text: str) -> list[tuple[int, str, bytes]]:
        """(its first character, the piece, its ids) of each piece `encode` joins."""
        if not self._pieces or self._split is None:
            return [(0, text, self.encode(text))]
        out, at, special = [], 0, self._special
        for p in self._split.split(text):
            if p:
                out.append((at, p, special.get(p) or self._piece(p)))
                at += len(p)
        return out

    def _piece(self, text: str) -> bytes:
        if len(text) < CACHE_MIN_CHARS:
            short = self._short
            got = short.get(text)
            if got is None:
                got = self.whole(text)
                if len(short) >= SHORT_PIECES_MAX:
                    short.clear()  # many distinct short pieces: a bound, not an LRU
                short[text] = got
            return got
        cache = self._cache
        with self._lock:
            got = cache.get(text)
            if got is not None:
                cache.move_to_end(text)
                return got
        got = self.whole(text)
        with self._lock:
            cache[text] = got
            self._size += len(got) + len(text)
            while self._size > self._budget and cache:
                old, ids = cache.popitem(last=False)
                self._size -= len(ids) + len(old)
        return got


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # transformers' tojson filter: not HTML-escaped, unlike jinja2's own
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _loops_over_content(template: Any) -> bool:
    """vLLM's content-format detection, reduced to its common case: a template with a
    `for ... in <message>['content']` (or `.content`) loop takes content as a list of parts
    ("openai"), any other as a string (vllm/renderers/hf.py l. 500-604)."""
    import jinja2.nodes as n

    def is_content(node: Any) -> bool:
        while isinstance(node, (n.Filter, n.Test)) and node.node is not None:
            node = node.node
        if isinstance(node, n.Getitem):
            return isinstance(node.arg, n.Const) and node.arg.value == "content"
        return isinstance(node, n.Getattr) and node.attr == "content"

    return any(is_content(loop.iter) for loop in template.find_all(n.For))


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise PromptError(f"'{name}' must be a boolean", name)
    return value


class Renderer:
    """A model's tokenizer directory (Hugging Face layout: tokenizer.json, tokenizer_config.json
    or chat_template.jinja, optionally config.json) -> prompts as its vLLM engine builds them."""

    def __init__(self, directory: str | Path, cache_bytes: int = 64 << 20,
                 placeholders: Mapping[str, str] | None = None) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        d = Path(directory)
        self.directory = d
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.encoder = Encoder(self.tokenizer, cache_bytes)
        conf_path = d / "tokenizer_config.json"
        conf = json.loads(conf_path.read_text()) if conf_path.exists() else {}
        template = conf.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"),
                            template[0]["template"] if template else None)  # fmt: skip
        if template is None and (d / "chat_template.jinja").exists():
            template = (d / "chat_template.jinja").read_text()
        self.special_tokens = {k: _token_text(conf.get(k))
                               for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                               if conf.get(k) is not None}  # fmt: skip
        self._refused = jinja2.TemplateError
        self._template = None
        self.content_format: ContentFormat = "string"
        self.developer_role = True
        self._variables: frozenset[str] = frozenset()
        if isinstance(template, str):
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(template)
            import jinja2.meta

            ast = env.parse(template)
            self.content_format = "openai" if _loops_over_content(ast) else "string"
            self._variables = frozenset(jinja2.meta.find_undeclared_variables(ast))
            # vLLM's test (vllm/renderers/hf.py l. 607-609)
            self.developer_role = '"developer"' in template or "'developer'" in template
        self.placeholders = placeholders or self._placeholders(d)
        self._bos = self.tokenizer.encode("", add_special_tokens=True).ids

    @staticmethod
    def _placeholders(d: Path) -> Mapping[str, str]:
        config = d / "config.json"
        if config.exists():
            model_type = json.loads(config.read_text()).get("model_type")
            if model_type in PLACEHOLDERS_BY_MODEL_TYPE:
                return PLACEHOLDERS_BY_MODEL_TYPE[model_type]
        return DEFAULT_PLACEHOLDERS

    # -- requests -----------------------------------------------------------------------------
    def request(self, kind: str, body: Mapping[str, Any]) -> Prompt:
        """The prompt of an OpenAI request body: `kind` "chat", "completions" or "responses"."""
        if kind == "chat":
            kwargs = body.get("chat_template_kwargs")
            if kwargs is not None and not isinstance(kwargs, dict):
                raise PromptError("'chat_template_kwargs' must be an object",
                                  "chat_template_kwargs")  # fmt: skip
            return self.chat(
                body.get("messages"), tool_dicts(body.get("tools")),
                add_generation_prompt=_flag(body, "add_generation_prompt", True),
                continue_final_message=_flag(body, "continue_final_message", False),
                chat_template_kwargs=kwargs,
                add_special_tokens=_flag(body, "add_special_tokens", False))
        if kind == "responses":
            return self.request("chat", responses_chat(body))
        return self.completion(body.get("prompt"),
                               _flag(body, "add_special_tokens", True))  # fmt: skip

    def completion(self, prompt: Any, add_special_tokens: bool = True) -> Prompt:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]  # a batch goes where its first prompt goes
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return Prompt(token_bytes(prompt))
        if not isinstance(prompt, str) or not prompt:
            raise PromptError("prompt must be a non-empty string or a list of token ids",
                              "prompt")  # fmt: skip
        ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids

        def nxt(answer: str) -> Prompt:
            return self.completion(prompt + answer, add_special_tokens)

        return Prompt(token_bytes(ids), prompt, continuation=nxt)

    def chat(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> Prompt:
        """`tools` as vLLM dumps them (conversation.tool_dicts)."""
        if add_generation_prompt and continue_final_message:
            raise PromptError("Cannot set both `continue_final_message` and "
                              "`add_generation_prompt` to True.")  # fmt: skip
        spec = Chat(tuple(messages) if isinstance(messages, list) else messages, tools,
                    dict(chat_template_kwargs or {}), add_generation_prompt,
                    continue_final_message, add_special_tokens)  # fmt: skip
        return self._chat(spec)

    def _chat(self, spec: Chat) -> Prompt:
        messages = list(spec.messages) if isinstance(spec.messages, tuple) else spec.messages
        conv, media = conversation(messages, self.content_format, self.placeholders,
                                   self.developer_role)  # fmt: skip
        text = self._render(conv, spec)
        ids = self.encoder.encode(text)
        if spec.add_special_tokens:
            ids = token_bytes(self._bos) + ids
        mm = self._locate(text, media, len(self._bos) if spec.add_special_tokens else 0)
        return Prompt(ids, text, mm, continuation=lambda answer: self._next_chat(spec, answer))

    def _next_chat(self, spec: Chat, answer: str) -> Prompt:
        msgs = list(spec.messages)
        last = msgs[-1] if msgs else None
        if spec.continue_final_message and isinstance(last, Mapping):
            # the answer continues the final message: the next turn holds it whole
            content = last.get("content")
            text = content if isinstance(content, str) else ""
            msgs[-1] = {**last, "content": text + answer}
        else:
            msgs.append({"role": "assistant", "content": answer})
        return self._chat(Chat(tuple(msgs), spec.tools, spec.kwargs, False, False,
                               spec.add_special_tokens))  # fmt: skip

    def _render(self, conv: list[dict[str, Any]], spec: Chat) -> str:
        if self._template is None:
            raise PromptError("the model's tokenizer has no chat template")
        # as vLLM: the request's template kwargs that the template reads (the rest dropped)
        kwargs = {k: v for k, v in spec.kwargs.items() if k in self._variables
                  and k not in ("messages", "tools", "add_generation_prompt")}  # fmt: skip
        context = {**self.special_tokens, **kwargs, "messages": conv, "tools": spec.tools,
                   "add_generation_prompt": spec.add_generation_prompt}
        try:
            text = self._template.render(**context)
        except self._refused as exc:
            raise PromptError(f"the chat template refused the request: {exc}") from None
        if spec.continue_final_message:
            text = _cut_after_final(text, conv[-1].get("content"))
        return text

    def _locate(self, text: str, media: tuple[MediaItem, ...], shift: int) -> tuple[
            MultiModalPart, ...]:
        """Each media item's placeholder tokens, in order of the placeholders in the text: a
        piece (between special tokens) that holds one is tokenized again with offsets, the
        pieces before it counted from the cache."""
        if not media:
            return ()
        pieces = self.encoder.pieces(text)
        starts = [p[0] for p in pieces]
        before = [0, *itertools.accumulate(len(p[2]) // 4 for p in pieces)]
        offsets: dict[int, Any] = {}

        def token_at(char: int) -> int | None:
            k = bisect.bisect_right(starts, char) - 1
            if k not in offsets:
                offsets[k] = self.tokenizer.encode(pieces[k][1], add_special_tokens=False)
            inside = offsets[k].char_to_token(char - starts[k])
            return None if inside is None else before[k] + inside

        out = []
        start = 0
        for item in media:
            at = text.find(item.placeholder, start)
            first = last = None
            if at >= 0:  # else the template did not write it (an "openai" format template)
                start = at + len(item.placeholder)
                first, last = token_at(at), token_at(start - 1)
            if first is None or last is None:
                out.append(MultiModalPart(item.modality, -1, 0, item.hash))
            else:
                out.append(MultiModalPart(item.modality, shift + first, last + 1 - first,
                                          item.hash))  # fmt: skip
        return tuple(out)

    # -- the simulator's needs -------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.encoder.encode(text)
        if add_special_tokens:
            ids = token_bytes(self._bos) + ids
        return array("I", ids).tolist()


def _cut_after_final(text: str, final: Any) -> str:
    """transformers' continue_final_message: the rendered text ends where the final
    message's content does (its last text part for a list), trailing spacing the template
    trimmed left out."""
    if isinstance(final, list):
        texts = [p["text"] for p in final if isinstance(p, dict) and "text" in p]
        if not texts:
            raise PromptError("continue_final_message is set but we could not find any text "
                              "to continue in the final message!")  # fmt: skip
        final = texts[-1]
    if not isinstance(final, str) or final.strip() not in text:
        raise PromptError("continue_final_message is set but the final message does not "
                          "appear in the chat after applying the chat template!")  # fmt: skip
    at = text.rindex(final.strip())
    if text[at:at + len(final.lstrip())] == final:
        return text[:at + len(final.lstrip())]
    return text[:at + len(final.strip())]
