"""A load generator nobody on this project wrote, sending OUR requests, read into our fields.

`inference-perf` (kubernetes-sigs, pinned in anchors.py), `shareGPT` data: it sends each entry's
first turn of a local file as the prompt, asking for as many tokens as its tokenizer counts in
the second, in file order. Its 0.7.0 source (datagen/dataset/hf_sharegpt_datagen.py) throws the
first record away, so the file begins with a placeholder, and wraps around at the end, so a run
asks for exactly rate x duration = the file's requests. Its tokenizer is built locally
(`build_tokenizer`) to count exactly as the simulator does (one token per 4 bytes), so no hub
is ever asked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .anchors import CACHE, PACKAGES, stamp, venv_dir, venv_python
from .stats import ms

TOKENIZER_DIR = CACHE / "tokenizers" / "sim-4byte"

# Run by the client venv's python (it has `tokenizers`): argv[1] is the output directory.
# Vocabulary: every 4-character string over " abcdefgh" (6,561) plus <unk> at id 0. Text of
# these characters decodes and re-tokenizes exactly; any other 4-byte chunk (the simulator's
# answers, our prompts) is one <unk>, so counts still equal the simulator's.
_BUILD = r"""
import itertools, json, sys
from pathlib import Path
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
vocab = {"<unk>": 0}
for t in itertools.product(" abcdefgh", repeat=4):
    vocab["".join(t)] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]{1,4}"), behavior="isolated")
tok.decoder = decoders.Fuse()
tok.add_special_tokens(["<unk>"])
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>", "model_max_length": 131072, "clean_up_tokenization_spaces": False}))
assert len(tok.encode("abcd efgh" + "zzzz" + "x").ids) == 4
"""

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
SHAREGPT_PLACEHOLDER = {
    "conversations": [{"from": "human", "value": "placeholder"}, {"from": "gpt", "value": "abcd"}]
}


def build_tokenizer(out: Path = TOKENIZER_DIR) -> Path:
    """The local tokenizer directory, built once with the client venv's `tokenizers`."""
    if (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    py = venv_python(PACKAGES["inference-perf"])
    subprocess.run([str(py), "-c", _BUILD, str(out)], check=True, env={**os.environ, **OFFLINE_ENV})
    return out


def sharegpt_records(prompts: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """The shareGPT file's records for (prompt, max_tokens) pairs, placeholder first. An answer
    of n tokens is "abcd" n times: with the local tokenizer (one token per 4 characters, no
    special tokens added) the client counts exactly n."""
    out: list[dict[str, Any]] = [SHAREGPT_PLACEHOLDER]
    for prompt, max_tokens in prompts:
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        out.append({"conversations": [{"from": "human", "value": prompt},
                                      {"from": "gpt", "value": "abcd" * max_tokens}]})
    return out


def config(base_url: str, model: str, data: Path, rate: float, seconds: int, tokenizer: Path,
           reports: Path, seed: int = 7) -> dict[str, Any]:
    """inference-perf's config: the requests in `data`, streaming completions, Poisson
    arrivals at `rate` for `seconds` (rate x seconds = the file's requests)."""
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "shareGPT", "path": str(data)},
        # room for every request at once: a slow server must not hold back the arrivals
        "load": {"type": "poisson", "stages": [{"rate": rate, "duration": seconds}],
                 "num_workers": 1, "base_seed": seed, "worker_max_concurrency": 10_000},
        "server": {"type": "vllm", "model_name": model, "base_url": base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "storage": {"local_storage": {"path": str(reports)}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": True}},
    }


def parse_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """Our fields from inference-perf's summary_lifecycle_metrics.json (seconds -> ms)."""
    ok = summary.get("successes") or {}
    lat = ok.get("latency") or {}
    ttft = lat.get("time_to_first_token") or {}
    e2e = lat.get("request_latency") or {}
    return {
        "requests_ok": int(ok.get("count") or 0),
        "errors": int((summary.get("failures") or {}).get("count") or 0),
        "ttft_p50_ms": ms(ttft.get("median")),
        "ttft_p90_ms": ms(ttft.get("p90")),
        "ttft_p99_ms": ms(ttft.get("p99")),
        "e2e_p50_ms": ms(e2e.get("median")),
        "token_count_mismatches": ok.get("token_count_mismatches"),
    }


def prepare(base_url: str, model: str, prompts: list[tuple[str, int]], rate: float,
            out_dir: Path) -> Path:
    """The run's folder: the requests file and the config (every path in it absolute: the
    client runs in that folder). Returns the config's path."""
    seconds = round(len(prompts) / rate)
    if seconds < 1 or abs(seconds * rate - len(prompts)) > 1e-9:
        raise ValueError(f"{len(prompts)} requests at {rate:g} req/s is not a whole second count")
    out_dir = out_dir.absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    # JSON Lines (its loader, `datasets`' json builder, reads them as they are); the name must
    # end in .json all the same (inference-perf's rule for a file path)
    data = out_dir / "requests.json"
    data.write_text("".join(json.dumps(r) + "\n" for r in sharegpt_records(prompts)))
    cfg = out_dir / "config.yml"
    cfg.write_text(yaml.safe_dump(config(base_url, model, data, rate, seconds, build_tokenizer(),
                                         out_dir / "reports")))
    return cfg


def read_result(rc: int, out_dir: Path) -> dict[str, Any]:
    summary = out_dir.absolute() / "reports" / "summary_lifecycle_metrics.json"
    if rc != 0 or not summary.exists():
        tail = (out_dir / "inference-perf.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"inference-perf exited {rc}; {out_dir}/inference-perf.log:\n{tail}")
    return {**parse_summary(json.loads(summary.read_text())),
            "client_version": PACKAGES["inference-perf"].version}


async def run_inference_perf(base_url: str, model: str, prompts: list[tuple[str, int]],
                             rate: float, out_dir: Path, timeout: float) -> dict[str, Any]:
    """inference-perf sending exactly `prompts` ((prompt, max_tokens), in order) as streaming
    completions at Poisson `rate`; its parsed summary (raises on failure)."""
    pkg = PACKAGES["inference-perf"]
    if stamp(pkg) is None:
        raise RuntimeError(f"inference-perf is not installed; run `python -m bench install "
                           f"inference-perf` (builds {venv_dir(pkg)})")
    cfg = prepare(base_url, model, prompts, rate, out_dir)
    with open(cfg.parent / "inference-perf.log", "wb") as log:  # noqa: ASYNC230 (the child's)
        proc = await asyncio.create_subprocess_exec(
            str(venv_dir(pkg) / "bin" / "inference-perf"), "--config_file", str(cfg),
            stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            cwd=str(cfg.parent), start_new_session=True,
            env={**os.environ, **OFFLINE_ENV, "HF_HOME": str(cfg.parent / "hf-home")})
        try:
            rc = await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"inference-perf did not finish in {timeout}s") from None
    return read_result(rc, cfg.parent)
