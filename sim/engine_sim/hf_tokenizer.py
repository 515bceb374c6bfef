"""A Hugging Face tokenizer directory, used the way vLLM uses it.

`tokenizer.json` is run with the `tokenizers` library; `tokenizer_config.json` gives the chat
template (rendered with jinja2 in the sandbox and with the options transformers'
`apply_chat_template` uses) and the special tokens. As in vLLM:
- a chat is rendered with `add_generation_prompt=True` and encoded WITHOUT added special
  tokens (the template writes the BOS itself); a completion prompt is encoded WITH them;
- text content parts are joined with "\\n" and tool-call arguments given as JSON strings are
  parsed to objects before rendering (vLLM's handling for string-content templates);
- tools reach the template as vLLM's request model dumps them: `{"type", "function": {"name",
  "description", "parameters", "strict"}}` in that order, absent ones null, extra keys after.

Encoding splits the text at special tokens first (as `tokenizers` itself does) and keeps the
ids of each piece between them in a bounded cache: a conversation's history is the same pieces
turn after turn, so only the new ones cost anything. The ids are identical to a plain encode.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

TINY_TOKENIZER = Path(__file__).parent / "data" / "tiny-tokenizer"
_CACHE_PIECES = 4096


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' tojson filter: not HTML-escaped, unlike jinja2's own
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTokenizer:
    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        self.directory = d
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        conf_path = d / "tokenizer_config.json"
        conf = json.loads(conf_path.read_text()) if conf_path.exists() else {}
        template = conf.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (d / "chat_template.jinja").exists():
            template = (d / "chat_template.jinja").read_text()
        self._template = _environment().from_string(template) if template else None
        self.special_tokens = {
            k: _token_text(conf.get(k))
            for k in ("bos_token", "eos_token", "unk_token", "pad_token")
            if conf.get(k) is not None
        }
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()]
        self._specials = {s: self.tokenizer.token_to_id(s) for s in added}
        self._split = (
            re.compile(
                "(" + "|".join(re.escape(s) for s in sorted(added, key=len, reverse=True)) + ")"
            )
            if added
            else None
        )
        self._bos = self.tokenizer.encode("", add_special_tokens=True).ids
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()

    # -- encoding ---------------------------------------------------------------------------
    def _piece(self, text: str) -> list[int]:
        cache = self._pieces
        ids = cache.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False).ids
            cache[text] = ids
            if len(cache) > _CACHE_PIECES:
                cache.popitem(last=False)
        else:
            cache.move_to_end(text)
        return ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out: list[int] = list(self._bos) if add_special_tokens else []
        if self._split is None:
            out.extend(self._piece(text))
            return out
        specials = self._specials
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                out.append(specials[part])
            elif part:
                out.extend(self._piece(part))
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    # -- chat -------------------------------------------------------------------------------
    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        if self._template is None:
            raise ValueError("the tokenizer has no chat template")
        conversation = [_conversation_message(m) for m in messages]
        context = {
            **self.special_tokens,
            **(template_kwargs or {}),
            "messages": conversation,
            "tools": None if tools is None else [_tool(t) for t in tools],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except TemplateError as e:
            raise ValueError(f"chat template: {e}") from None

    def chat_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        add_special_tokens: bool = False,
        **kw: Any,
    ) -> list[int]:
        return self.encode(self.render_chat(messages, tools, **kw), add_special_tokens)


def _tool(tool: Any) -> dict[str, Any]:
    """A tool as vLLM's ChatCompletionToolsParam.model_dump() gives it to the template."""
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise ValueError("each tool must be an object with a function")
    fn = tool["function"]
    if not isinstance(fn.get("name"), str):
        raise ValueError("a tool's function needs a name")
    dumped_fn = {k: fn.get(k) for k in ("name", "description", "parameters", "strict")}
    dumped_fn.update((k, v) for k, v in fn.items() if k not in dumped_fn)
    dumped = {"type": tool.get("type", "function"), "function": dumped_fn}
    dumped.update((k, v) for k, v in tool.items() if k not in dumped)
    return dumped


def _conversation_message(msg: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as vLLM hands it to a string-content chat template."""
    out = dict(msg)
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                raise ValueError("only text content parts are supported")
        out["content"] = "\n".join(texts)
    elif content is not None and not isinstance(content, str):
        raise ValueError("content must be a string or a list of content parts")
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        parsed = []
        for call in calls:
            call = dict(call)
            fn = call.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                fn = dict(fn)
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass  # left as the string it is
                call["function"] = fn
            parsed.append(call)
        out["tool_calls"] = parsed
    return out
