"""A model's tokenizer files, fetched once: the prompt module (prompt.py) renders and
tokenizes with them.

With a model's tokenizer files (`tokenizer.json` and `tokenizer_config.json`, the Hugging
Face layout) the router keys prefixes by the engine's own token ids in blocks of the
engine's block size, so a block boundary is the engine's and the router's blocks and the
engine's KV blocks are one and the same (what the engines' KV events name, too).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .prompt import token_bytes

__all__ = ["TOKENIZER_FILES", "fetch_tokenizer", "token_bytes"]

log = logging.getLogger("prefix_router.tokens")


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
