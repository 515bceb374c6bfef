"""The prompt as the engine sees it: its chat template rendered, then its tokenizer's ids.

With a model's tokenizer files (`tokenizer.json` and `tokenizer_config.json`, the Hugging
Face layout) the router keys prefixes by the engine's own token ids in blocks of the
engine's block size, so a block boundary is the engine's and the router's blocks and the
engine's KV blocks are one and the same (what the engines' KV events name, too). The
template is rendered as Hugging Face's `apply_chat_template` does (which vLLM uses): a
sandboxed jinja2 environment with trimmed blocks, `raise_exception`, and the generation
prompt added; the rendered text is tokenized without adding special tokens again. A plain
completion prompt is tokenized with them, as vLLM does.

Tokenizing is the costly part (about 1-5 ms for a 2,000-token prompt), and most of a prompt
is text seen before: a system prompt, the history of a conversation. The tokenizer splits
its input at the special tokens first and tokenizes each piece between them on its own, so
the ids of a piece never depend on its neighbours: pieces are cached (by their text, bounded
in bytes) and only new text is tokenized. Whether a tokenizer really splits that way is
checked when it is loaded; one that does not is used whole, uncached.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from array import array
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RequestError
from .parsing import ParsedRequest

if TYPE_CHECKING:  # imported where a tokenizer is configured: a router without one is lighter
    from tokenizers import Tokenizer

log = logging.getLogger("prefix_router.tokens")

# Pieces shorter than this (role names, separators between special tokens) are kept in a
# plain dict: a tokenizer call costs 3-6 us, a lookup 0.04 us, and two renders a request meet
# about ten of them. Longer ones go to the LRU bounded in bytes.
CACHE_MIN_CHARS = 64
SHORT_PIECES_MAX = 4096  # distinct short pieces kept; the dict starts over when full


def token_bytes(ids: list[int]) -> bytes:
    """Token ids as a tokenized prompt's canonical bytes: 4-byte words (sizing.py counts on it)."""
    return array("I", ids).tobytes()


def _special(cfg: dict[str, Any], name: str) -> str:
    value = cfg.get(name) or ""
    return value.get("content", "") if isinstance(value, dict) else str(value)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class _Pieces:
    """Text -> token bytes, piece by piece between special tokens, known pieces cached."""

    def __init__(self, tok: Tokenizer, budget_bytes: int) -> None:
        self._tok = tok
        added = tok.get_added_tokens_decoder()
        self._special = {t.content: token_bytes([i]) for i, t in added.items() if t.content}
        names = sorted(self._special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._short: dict[str, bytes] = {}
        self._lock = threading.Lock()  # large prompts are tokenized in a worker thread
        self._size = 0
        self._budget = budget_bytes

    def specials(self) -> list[str]:
        return list(self._special)

    def encode(self, text: str) -> bytes:
        if self._split is None:
            return self._piece(text)
        special = self._special
        return b"".join(
            special.get(p) or self._piece(p) for p in self._split.split(text) if p
        )

    def _piece(self, text: str) -> bytes:
        if len(text) < CACHE_MIN_CHARS:
            short = self._short
            got = short.get(text)
            if got is None:
                got = token_bytes(self._tok.encode(text, add_special_tokens=False).ids)
                if len(short) >= SHORT_PIECES_MAX:
                    short.clear()  # many distinct short messages: a bound, not an LRU
                short[text] = got
            return got
        cache = self._cache
        with self._lock:
            got = cache.get(text)
            if got is not None:
                cache.move_to_end(text)
                return got
        got = token_bytes(self._tok.encode(text, add_special_tokens=False).ids)
        with self._lock:
            cache[text] = got
            self._size += len(got) + len(text)
            while self._size > self._budget and cache:
                old, ids = cache.popitem(last=False)
                self._size -= len(ids) + len(old)
        return got


class ChatTokenizer:
    def __init__(self, directory: str | Path, cache_bytes: int = 64 << 20) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self._refused = jinja2.TemplateError
        d = Path(directory)
        self._tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"),
                            template[0]["template"])  # fmt: skip
        if not isinstance(template, str):
            raise ValueError(f"{d}/tokenizer_config.json has no chat_template")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(template)
        self._specials = {n: _special(cfg, n) for n in ("bos_token", "eos_token")}
        self._pieces: _Pieces | None = _Pieces(self._tok, cache_bytes)
        marks = list(self._pieces.specials())[:4] or [""]
        probe = "".join(f"{m} A system, prompt.\n\n{m}Hi  there! " for m in marks)
        whole = token_bytes(self._tok.encode(probe, add_special_tokens=False).ids)
        if self._pieces.encode(probe) != whole:
            log.warning("%s: this tokenizer does not split at its special tokens alone: "
                        "prompts are tokenized whole, uncached", d)  # fmt: skip
            self._pieces = None

    def _text(self, messages: list[Any], tools: Any, generation: bool) -> str:
        return self._template.render(
            messages=messages, tools=tools, add_generation_prompt=generation, **self._specials
        )

    def _render(self, messages: list[Any], tools: Any, generation: bool) -> bytes:
        try:
            text = self._text(messages, tools, generation)
        except self._refused as exc:
            # what the engine would answer too: the template refuses this conversation
            raise RequestError(400, f"the chat template refused the request: {exc}") from None
        if self._pieces is not None:
            return self._pieces.encode(text)
        return token_bytes(self._tok.encode(text, add_special_tokens=False).ids)

    def prompt_bytes(self, parsed: ParsedRequest) -> bytes:
        """The prompt's token ids as the engine will see them, as 4-byte words."""
        body = parsed.body
        if parsed.kind == "chat":
            return self._render(body["messages"], body.get("tools"), True)
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return token_bytes(prompt)  # token ids already
        if isinstance(prompt, list):
            prompt = prompt[0]
        return token_bytes(self._tok.encode(prompt, add_special_tokens=True).ids)

    def prompt_ids(self, parsed: ParsedRequest) -> list[int]:
        return array("I", self.prompt_bytes(parsed)).tolist()

    def next_turn_bytes(self, parsed: ParsedRequest, answer: str) -> bytes:
        """The token ids the next turn of this conversation starts with, as 4-byte words."""
        body = parsed.body
        if parsed.kind == "chat":
            turn = [*body["messages"], {"role": "assistant", "content": answer}]
            return self._render(turn, body.get("tools"), False)
        prompt = body["prompt"]
        if isinstance(prompt, str):
            return token_bytes(self._tok.encode(prompt + answer, add_special_tokens=True).ids)
        return self.prompt_bytes(parsed)  # a token-id prompt: the answer's ids are not known

    def next_turn_ids(self, parsed: ParsedRequest, answer: str) -> list[int]:
        return array("I", self.next_turn_bytes(parsed, answer)).tolist()

    def tokenize(self, parsed: ParsedRequest) -> None:
        """Replace the request's canonical bytes with its token ids, as the engine sees it."""
        parsed.canonical = self.prompt_bytes(parsed)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def fetch_tokenizer(source: str, cache_dir: Path) -> Path:
    """A local directory with the tokenizer files of `source`: a directory as it is, or
    `hf://org/name[@revision]`, fetched once from the Hugging Face hub (`HF_ENDPOINT`,
    `HF_TOKEN` as the hub's own clients read them) into `cache_dir`. Blocking: called at
    startup, before the router serves."""
    import os
    import urllib.request

    if not source.startswith("hf://"):
        return Path(source)
    repo, _, revision = source.removeprefix("hf://").partition("@")
    revision = revision or "main"
    target = cache_dir / repo / revision
    if all((target / f).is_file() for f in TOKENIZER_FILES):
        return target
    target.mkdir(parents=True, exist_ok=True)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    token = os.environ.get("HF_TOKEN")
    for name in TOKENIZER_FILES:
        req = urllib.request.Request(f"{endpoint}/{repo}/resolve/{revision}/{name}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
        tmp = target / f".{name}.part"
        tmp.write_bytes(data)
        tmp.replace(target / name)
    log.info("tokenizer of %s fetched into %s", source, target)
    return target
