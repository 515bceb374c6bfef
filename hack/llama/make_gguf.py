"""Write a tiny random-weight llama GGUF whose tokenizer is a given Hugging Face tokenizer.

The weights mean nothing (seeded noise), so the model speaks gibberish; what matters for the
router is that llama-server runs it as a real engine: it tokenizes with the real BPE tokenizer,
renders the real chat template, fills and reuses a real KV cache, and costs real CPU per prompt
token. The file is cached by a hash of everything that goes into it, so a second call is free.

    python hack/llama/make_gguf.py [TOKENIZER_DIR] [--layers 2 --hidden 256 ...]

prints the path of the GGUF. TOKENIZER_DIR holds `tokenizer.json` (byte-level BPE with Llama 3's
pre-tokenizer split) and `tokenizer_config.json` (special tokens, chat template).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TOKENIZER_DIR = REPO / "sim" / "engine_sim" / "data" / "tiny-tokenizer"

# llama.cpp names its pre-tokenizers; "llama-bpe" is Llama 3's split, the only one this script
# vouches for. A tokenizer with another split would be tokenized differently by the engine than by
# Hugging Face, and the router's token blocks would not be the engine's.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class ModelShape:
    """The model's size. The defaults keep one 2,000-token prefill in the tens of milliseconds
    on one CPU core: enough that a cache hit is measurable, small enough for a busy 2-core box."""

    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 768
    context: int = 16384
    seed: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token takes (K and V, f16, every layer): what sizes a prompt's
        state in llama-server's host prompt cache, and so what `--cache-ram` holds."""
        return self.layers * 2 * self.kv_heads * (self.hidden // self.heads) * 2


def cache_dir() -> Path:
    base = os.environ.get("PREFIX_ROUTER_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-router"
    )
    return Path(base) / "llama" / "models"


def content_key(tokenizer_dir: Path, shape: ModelShape) -> str:
    """Hash of this script, the tokenizer files and the shape: any change makes a new file."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        h.update(name.encode() + b"\0" + (tokenizer_dir / name).read_bytes())
    h.update(json.dumps(asdict(shape), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _check_pre_tokenizer(tokenizer_json: dict) -> None:
    pre = tokenizer_json.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre])
    splits = [p["pattern"]["Regex"] for p in parts if p.get("type") == "Split"]
    if splits != [LLAMA3_SPLIT]:
        raise SystemExit(
            "error: the tokenizer's pre-tokenizer is not Llama 3's split; llama.cpp would "
            f"tokenize it differently (found {splits!r})"
        )
    if tokenizer_json.get("model", {}).get("type") != "BPE":
        raise SystemExit("error: only a BPE tokenizer.json is supported")


def _vocab(tokenizer_dir: Path) -> tuple[list[str], list[int]]:
    """Token strings by id and their llama.cpp types: special added tokens are CONTROL (the
    template's markers), other added tokens USER_DEFINED, the rest NORMAL."""
    import gguf
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    size = max(by_id) + 1
    if len(by_id) != size:
        raise SystemExit(f"error: token ids are not dense (0..{size - 1}, {len(by_id)} tokens)")
    added = tok.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(size):
        tokens.append(by_id[i])
        if i in added:
            special = added[i].special
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def write_gguf(path: Path, tokenizer_dir: Path, shape: ModelShape) -> None:
    import gguf
    import numpy as np

    tokenizer_json = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    _check_pre_tokenizer(tokenizer_json)
    tokens, types = _vocab(tokenizer_dir)
    n_vocab = len(tokens)
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise SystemExit("error: hidden must divide by heads and heads by kv_heads")
    head_dim = shape.hidden // shape.heads

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("prefix-router tiny random llama")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(tokenizer_dir, load_merges=True, n_vocab=n_vocab)
    if not special.chat_template:
        raise SystemExit("error: tokenizer_config.json has no chat_template")
    special.add_to_gguf(w, quiet=True)
    # The template ends each turn with <|eot_id|>: generation must stop there too.
    eot = tokens.index("<|eot_id|>") if "<|eot_id|>" in tokens else None
    if eot is not None:
        w.add_eot_token_id(eot)

    # Seeded noise, scaled so activations stay finite through the layers. Norm weights are ones.
    rng = np.random.default_rng(shape.seed)

    def noise(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) / np.sqrt(dims[-1])).astype(
            np.float16
        )

    ones = np.ones(shape.hidden, dtype=np.float32)
    kv = shape.kv_heads * head_dim
    # numpy shapes are (rows=out, cols=in); GGUF stores them reversed, as llama.cpp expects.
    w.add_tensor("token_embd.weight", noise(n_vocab, shape.hidden))
    for b in range(shape.layers):
        w.add_tensor(f"blk.{b}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{b}.attn_q.weight", noise(shape.hidden, shape.hidden))
        w.add_tensor(f"blk.{b}.attn_k.weight", noise(kv, shape.hidden))
        w.add_tensor(f"blk.{b}.attn_v.weight", noise(kv, shape.hidden))
        w.add_tensor(f"blk.{b}.attn_output.weight", noise(shape.hidden, shape.hidden))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{b}.ffn_gate.weight", noise(shape.ffn, shape.hidden))
        w.add_tensor(f"blk.{b}.ffn_up.weight", noise(shape.ffn, shape.hidden))
        w.add_tensor(f"blk.{b}.ffn_down.weight", noise(shape.hidden, shape.ffn))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", noise(n_vocab, shape.hidden))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ensure_model(
    tokenizer_dir: Path | str = DEFAULT_TOKENIZER_DIR,
    shape: ModelShape | None = None,
    out_dir: Path | None = None,
) -> Path:
    """The cached GGUF for this tokenizer and shape, written first if missing."""
    tokenizer_dir = Path(tokenizer_dir)
    shape = shape or ModelShape()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(f"{tokenizer_dir / name} is missing (the tokenizer to embed)")
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"tiny-llama-{content_key(tokenizer_dir, shape)}.gguf"
    if path.is_file():
        return path
    # Written beside its final name and renamed, so a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".gguf.part")
    os.close(fd)
    try:
        write_gguf(Path(tmp), tokenizer_dir, shape)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tokenizer_dir", nargs="?", type=Path, default=DEFAULT_TOKENIZER_DIR)
    p.add_argument("--out-dir", type=Path, default=None, help="default: the user's cache")
    d = ModelShape()
    for field, value in asdict(d).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=int, default=value)
    a = p.parse_args(argv)
    shape = ModelShape(**{f: getattr(a, f) for f in asdict(d)})
    print(ensure_model(a.tokenizer_dir, shape, a.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
