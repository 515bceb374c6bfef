"""A load generator nobody on this project wrote, inference-perf (pinned in anchors.py), sending
OUR requests as a shareGPT file: its 0.7.0 (datagen/dataset/hf_sharegpt_datagen.py) sends each
record's first turn as a prompt, asking for as many tokens as its tokenizer counts in the second,
in file order; it drops the first record (so a placeholder comes first) and wraps around, so a
run asks for exactly rate x duration = the file's requests. Its tokenizer is built here to count
as the simulator does (a token per 4 bytes): no hub is ever asked."""

import asyncio
import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from .anchors import PACKAGES, missing
from .stats import ms

CLIENT = PACKAGES["inference-perf"]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}


def build_tokenizer(out: Path) -> Path:
    """The client's tokenizer, in `out`: its words are every 4-character string over
    " abcdefgh", and <unk>. Such text decodes and re-tokenizes exactly; any other 4 bytes (the
    simulator's answers, our prompts) are one <unk>, so counts equal the simulator's."""
    words = ("".join(t) for t in itertools.product(" abcdefgh", repeat=4))
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{w: i for i, w in enumerate(words, 1)}},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]{1,4}"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<unk>"])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
        "model_max_length": 131072, "clean_up_tokenization_spaces": False}))
    return out


def sharegpt_records(prompts: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """The shareGPT records for (prompt, max_tokens) pairs, after the placeholder. An answer of
    n tokens is "abcd" n times: n tokens to the local tokenizer."""
    if any(max_tokens < 1 for _, max_tokens in prompts):
        raise ValueError("max_tokens must be at least 1")
    return [{"conversations": [{"from": "human", "value": prompt},
                               {"from": "gpt", "value": "abcd" * max_tokens}]}
            for prompt, max_tokens in [("placeholder", 1), *prompts]]


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
    ttft = (ok.get("latency") or {}).get("time_to_first_token") or {}
    e2e = (ok.get("latency") or {}).get("request_latency") or {}
    return {
        "requests_ok": int(ok.get("count") or 0),
        "errors": int((summary.get("failures") or {}).get("count") or 0),
        **{f"ttft_{p}_ms": ms(ttft.get(key)) for p, key in
           (("p50", "median"), ("p90", "p90"), ("p99", "p99"))},
        "e2e_p50_ms": ms(e2e.get("median")),
        "token_count_mismatches": ok.get("token_count_mismatches"),
    }


async def run_inference_perf(base_url: str, model: str, prompts: list[tuple[str, int]],
                             rate: float, out_dir: Path, timeout: float) -> dict[str, Any]:
    """inference-perf sending exactly `prompts` ((prompt, max_tokens), in order) as streaming
    completions at Poisson `rate`; its parsed summary (raises on failure)."""
    return await asyncio.to_thread(_run, base_url, model, prompts, rate, out_dir, timeout)


def _run(base_url: str, model: str, prompts: list[tuple[str, int]], rate: float, out_dir: Path,
         timeout: float) -> dict[str, Any]:
    if why := missing(CLIENT):
        raise RuntimeError(why)
    seconds = round(len(prompts) / rate)
    if seconds < 1 or abs(seconds * rate - len(prompts)) > 1e-9:
        raise ValueError(f"{len(prompts)} requests at {rate:g} req/s is not a whole second count")
    out_dir = out_dir.absolute()  # the client runs there
    out_dir.mkdir(parents=True, exist_ok=True)
    # JSON Lines (as its loader, `datasets`' json builder, reads them), named .json as it must be
    data, cfg, log = (out_dir / f for f in ("requests.json", "config.yml", "inference-perf.log"))
    data.write_text("".join(json.dumps(r) + "\n" for r in sharegpt_records(prompts)))
    tokenizer = build_tokenizer(out_dir / "tokenizer")
    cfg.write_text(yaml.safe_dump(config(base_url, model, data, rate, seconds, tokenizer,
                                         out_dir / "reports")))
    with log.open("wb") as out:
        try:
            rc = subprocess.run(
                [str(CLIENT.venv / "bin" / "inference-perf"), "--config_file", str(cfg)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=out_dir,
                start_new_session=True, timeout=timeout,
                env={**os.environ, **OFFLINE_ENV, "HF_HOME": str(out_dir / "hf-home")}).returncode
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"inference-perf did not finish in {timeout}s") from None
    summary = out_dir / "reports" / "summary_lifecycle_metrics.json"
    if rc != 0 or not summary.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"inference-perf exited {rc}; {log}:\n{tail}")
    return {**parse_summary(json.loads(summary.read_text())), "client_version": CLIENT.version}
