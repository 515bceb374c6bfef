"""`python -m bench multimodal-key`: what the router's prefix key makes of chat with images
(the `multimodal` workload), request by request in send order, with the router's own parsing
and keyer: how many requests its key says share more of their prompt with an earlier request
than they do (a wrong hit: the router would count on cache an engine cannot have).

The truth is the key a request gets when each image is a text part naming the image at its
position (its identity from the first character it differs in). Two keys are measured against it:
- byte mode (the router's default): an image part is its marker and identity (the hash of its
  data URL), and every block over it is keyed with that identity (prefix.py);
- token mode, with a chat template that renders an image as a placeholder (as vision models'
  templates do: Llama 3.2 Vision's `<|image|>`): the blocks over the placeholder's tokens are
  keyed with the image's identity, as vLLM keys them (its `extra_keys`).
Before images had blocks of their own (ec7484d) the same run counted 609 and 597 wrong hits of
2,000 (bench/results/api/multimodal-key-ec7484d.json). Nothing is sent: this measures the key
function, not a fleet."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import xxhash

from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.config import RouterSettings
from prefix_router.core import build_core
from prefix_router.parsing import canonical_chat, parse_for_routing

from .harness.workloads import build, messages_for
from .provenance import now_utc, stamp

OUT = Path("bench/results/api")
MODEL = "vlm"
_CONTENT = "{{- (message['content'] or '') | trim }}"
# a message's content as vision templates render it: text parts, an image as a placeholder
_PARTS = (
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- else %}{{- IMAGE(part) }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
)


def tokenizer_dir(root: Path) -> Path:
    """The simulators' tiny tokenizer with a vision template: an image is `<|image|>`."""
    d = root / "placeholder"
    shutil.copytree(TINY_TOKENIZER, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    template = cfg["chat_template"]
    assert _CONTENT in template
    cfg["chat_template"] = template.replace(_CONTENT, _PARTS.replace("IMAGE(part)", "'<|image|>'"))
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def _identity(url: str, n: int) -> str:
    """`n` characters naming the image, different from the first for another image."""
    h = format(xxhash.xxh3_64_intdigest(url.encode()), "016x")
    return (h * (n // 16 + 1))[:n]


def identity_messages(msgs: list[dict[str, Any]], aligned: bool) -> list[dict[str, Any]]:
    """The truth's messages: each image part a text part naming the image, so the key tells
    images apart from the image's first byte on. `aligned`: as many canonical bytes as the
    image part takes in byte mode, so both keys' blocks fall at the same places; else the
    placeholder and the image's hash."""
    out = []
    for m in msgs:
        c = m["content"]
        if isinstance(c, list):
            c = [p if p.get("type") == "text" else {"type": "text", "text": (
                _identity(p["image_url"]["url"], _text_len(p)) if aligned
                else "<|image|>" + _identity(p["image_url"]["url"], 16))} for p in c]
        out.append({**m, "content": c})
    return out


def _text_len(part: dict[str, Any]) -> int:
    """The text a text part needs to take as many canonical bytes as `part` does."""
    def size(p: dict[str, Any]) -> int:
        return len(canonical_chat([{"role": "user", "content": [p]}]))
    return size(part) - size({"type": "text", "text": ""})


async def keys(settings: dict[str, Any], requests: list[list[dict[str, Any]]]) -> list[list[int]]:
    core = build_core(RouterSettings.model_validate(
        {"discovery": {"backends": ["http://198.18.0.1:8000"]}, **settings}))
    out = []
    apart = not core.keyer.renders
    for msgs in requests:
        raw = json.dumps({"model": MODEL, "messages": msgs, "max_tokens": 8}).encode()
        parsed, _ = parse_for_routing(raw, "chat", None, False, apart)
        out.append((await core.keyer.key(parsed, [])).hashes)
    return out


def matches(chains: list[list[int]]) -> list[int]:
    """For each chain, the blocks of its longest prefix already met in an earlier one."""
    seen: set[int] = set()
    out = []
    for chain in chains:  # a chain hash names its whole prefix: matching blocks are a run
        n = 0
        while n < len(chain) and chain[n] in seen:
            n += 1
        out.append(n)
        seen.update(chain)
    return out


def compare(key: list[list[int]], truth: list[list[int]], block_tokens: float) -> dict[str, Any]:
    got, true = matches(key), matches(truth)
    wrong = [(g, t) for g, t in zip(got, true, strict=True) if g > t]
    return {
        "requests": len(key),
        "wrong_hits": len(wrong),
        "wrong_hit_share": round(len(wrong) / len(key), 4),
        "tokens_claimed_wrongly": round(sum(g - t for g, t in wrong) * block_tokens),
        "matched_blocks_key": sum(got),
        "matched_blocks_truth": sum(true),
    }


async def measure(count: int) -> dict[str, Any]:
    w = build("multimodal", count)
    requests = [messages_for(s, 0, []) for s in w.sessions]
    out: dict[str, Any] = {"workload": "multimodal", "requests": count,
                           "distinct_images": len({s.group for s in w.sessions})}  # fmt: skip
    # byte mode: the key holds each image's data URL; the truth puts its hash there instead
    settings: dict[str, Any] = {}
    core = build_core(RouterSettings.model_validate(
        {"discovery": {"backends": ["http://198.18.0.1:8000"]}}))
    bt = core.keyer.sizing.block_tokens
    truth = [identity_messages(m, aligned=True) for m in requests]
    out["byte_mode"] = compare(await keys(settings, requests), await keys(settings, truth), bt)
    raw = json.dumps({"model": MODEL, "messages": requests[0], "max_tokens": 8}).encode()
    span = parse_for_routing(raw, "chat", None, False, True)[0].media[0]
    out["byte_mode"]["image_tokens_estimated"] = round(
        core.keyer.sizing.prompt_tokens(span.end - span.start))
    with tempfile.TemporaryDirectory(prefix="bench-mm-") as d:
        tok = tokenizer_dir(Path(d))
        settings = {"tokenizer": str(tok)}
        core = build_core(RouterSettings.model_validate(
            {"discovery": {"backends": ["http://198.18.0.1:8000"]}, **settings}))
        # the truth's image is a few tokens longer than the placeholder: where both match
        # whole, the truth matches no fewer blocks (no wrong hit is counted for it)
        truth = [identity_messages(m, aligned=False) for m in requests]
        out["token_mode_placeholder"] = compare(
            await keys(settings, requests), await keys(settings, truth),
            core.keyer.sizing.block_tokens)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("multimodal-key", help="wrong hits of the router's key on chat with images")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--out", default=str(OUT), help="results folder")


def main(args: argparse.Namespace, command: str) -> None:
    result = {**stamp(command), "date": now_utc(), **asyncio.run(measure(args.requests))}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multimodal-key.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
