"""Load generators nobody on this project wrote, run against a router URL, read into our fields.

`inference-perf` (kubernetes-sigs, PyPI `inference-perf`, pinned in bench/anchors.py) with its
`shared_prefix` data type. It needs a Hugging Face tokenizer to make prompts of exact lengths
and to count output tokens; `build_tokenizer` makes one locally that tokenizes exactly as the
simulator does (one token per 4 bytes: a WordLevel model over 4-character chunks, unknown
chunks counting as one `<unk>`), so the client's token counts equal the engine's and no hub is
ever asked (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1).

Its result file `summary_lifecycle_metrics.json` is parsed by `parse_inference_perf`. The
second client, `aiperf` (NVIDIA), uses the same tokenizer; see the notes above `AIPERF_ENV`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .anchors import CACHE, PACKAGES, stamp, venv_dir, venv_python

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
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>",
    "model_max_length": 131072,
    "clean_up_tokenization_spaces": False,
}))
assert len(tok.encode("abcd efgh" + "zzzz" + "x").ids) == 4
"""

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}


def build_tokenizer(client: str = "inference-perf", out: Path = TOKENIZER_DIR) -> Path:
    """The local tokenizer directory, built once with the client venv's `tokenizers`."""
    import subprocess

    if (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    py = venv_python(PACKAGES[client])
    subprocess.run([str(py), "-c", _BUILD, str(out)], check=True, env={**os.environ, **OFFLINE_ENV})
    return out


@dataclass(frozen=True)
class SharedPrefixLoad:
    """inference-perf's shared_prefix data, shaped like our `system-prompts` workload: ~2,000-
    token system prompts, questions of 50-300 tokens, answers of 64-256 tokens (uniform)."""

    rate: float = 5.0
    seconds: int = 10
    groups: int = 8
    prompts_per_group: int = 16
    system_prompt_len: int = 2000
    question_len: tuple[int, int] = (50, 300)
    output_len: tuple[int, int] = (64, 256)
    seed: int = 7
    num_workers: int = 1  # processes of the client; 1 keeps a 2-core machine usable


def _uniform(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "uniform", "min": lo, "max": hi, "mean": (lo + hi) / 2, "std_dev": 0}


def inference_perf_config(
    base_url: str, model: str, load: SharedPrefixLoad, tokenizer_dir: Path, out_dir: Path
) -> dict[str, Any]:
    """The YAML config (as a dict) of one inference-perf run: streaming completions, Poisson
    arrivals at `load.rate` for `load.seconds`."""
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "shared_prefix",
            "shared_prefix": {
                "num_groups": load.groups,
                "num_prompts_per_group": load.prompts_per_group,
                "system_prompt_len": load.system_prompt_len,
                "question_len": _uniform(*load.question_len),
                "output_len": _uniform(*load.output_len),
                "seed": load.seed,
            },
        },
        "load": {
            "type": "poisson",
            "stages": [{"rate": load.rate, "duration": load.seconds}],
            "num_workers": load.num_workers,
            "base_seed": load.seed,
        },
        "server": {"type": "vllm", "model_name": model, "base_url": base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer_dir)},
        "storage": {"local_storage": {"path": str(out_dir)}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": True}},
    }


def _ms(x: Any) -> float | None:
    return None if x is None else round(float(x) * 1000.0, 2)


def parse_inference_perf(summary: dict[str, Any]) -> dict[str, Any]:
    """Our fields from inference-perf's summary_lifecycle_metrics.json (seconds -> ms)."""
    ok = summary.get("successes") or {}
    failed = summary.get("failures") or {}
    lat = ok.get("latency") or {}
    ttft = lat.get("time_to_first_token") or {}
    e2e = lat.get("request_latency") or {}
    thr = ok.get("throughput") or {}
    prompt = ok.get("prompt_tokens") or {}
    total = prompt.get("total") or 0.0
    return {
        "client": "inference-perf",
        "requests_ok": int(ok.get("count") or 0),
        "errors": int(failed.get("count") or 0),
        "ttft_p50_ms": _ms(ttft.get("median")),
        "ttft_p90_ms": _ms(ttft.get("p90")),
        "ttft_p99_ms": _ms(ttft.get("p99")),
        "e2e_p50_ms": _ms(e2e.get("median")),
        "e2e_p99_ms": _ms(e2e.get("p99")),
        "output_tokens_per_s": round(float(thr.get("output_tokens_per_sec") or 0.0), 1),
        "throughput_rps": round(float(thr.get("requests_per_sec") or 0.0), 3),
        # usage.prompt_tokens_details.cached_tokens as the engine reported it, summed by the client
        "client_reported_hit_rate": round(prompt["cached"] / total, 4) if total else None,
        "token_count_mismatches": ok.get("token_count_mismatches"),
        "wall_s": summary.get("benchmark_time_seconds"),
    }


async def _run_client(
    args: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout: float
) -> int:
    """Run a client process to completion (killed after `timeout`); its exit code."""
    with open(log_path, "wb") as log:  # noqa: ASYNC230 (a log file handed to the child)
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            cwd=str(cwd),
            env={**os.environ, **env},
            start_new_session=True,
        )
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"{args[0]} did not finish in {timeout}s; see {log_path}") from None


# ----------------------------------------------------------------------------------------------
# inference-perf on OUR request sequence: its `shareGPT` data type reads a local JSON file of
# conversations and, with `api: completion`, sends each entry's first turn as the prompt and asks
# for as many tokens as its tokenizer counts in the second turn, in file order. Read in its 0.7.0
# source (inference_perf/datagen/dataset/hf_sharegpt_datagen.py): the generator throws away the
# first record when it starts, so the file begins with a placeholder; the list wraps around when
# it runs out, so the run asks for exactly as many requests as the file holds (rate x duration
# with num_workers >= 1 sends exactly int(rate x duration)).

SHAREGPT_PLACEHOLDER = {
    "conversations": [{"from": "human", "value": "placeholder"}, {"from": "gpt", "value": "abcd"}]
}


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


def inference_perf_file_config(
    base_url: str, model: str, data_path: Path, rate: float, seconds: int, tokenizer_dir: Path,
    out_dir: Path, seed: int = 7,
) -> dict[str, Any]:
    """inference-perf's config for the requests in `data_path` (a shareGPT file): streaming
    completions, Poisson arrivals at `rate` for `seconds` (rate x seconds = the file's
    requests)."""
    cfg = inference_perf_config(base_url, model, SharedPrefixLoad(rate=rate, seconds=seconds,
                                                                  seed=seed),
                                tokenizer_dir, out_dir)
    cfg["data"] = {"type": "shareGPT", "path": str(data_path)}
    # room for every request at once: a slow server must not hold back the arrivals
    cfg["load"]["worker_max_concurrency"] = 10_000
    return cfg


def _write_config(
    out_dir: Path, config: Callable[[Path, Path], dict[str, Any]]
) -> tuple[Path, Path, Path, Path]:
    """inference-perf's config.yml in `out_dir`, made by `config(tokenizer dir, reports dir)`;
    (out_dir, config path, reports dir, log path)."""
    out_dir = out_dir.absolute()  # the client runs in out_dir: every path in its config absolute
    tok = build_tokenizer("inference-perf")
    out_dir.mkdir(parents=True, exist_ok=True)
    reports = out_dir / "reports"
    cfg_path = out_dir / "config.yml"
    cfg_path.write_text(yaml.safe_dump(config(tok, reports)))
    return out_dir, cfg_path, reports, out_dir / "inference-perf.log"


def _prepare(
    base_url: str, model: str, load: SharedPrefixLoad, out_dir: Path
) -> tuple[Path, Path, Path, Path]:
    return _write_config(
        out_dir, lambda tok, reports: inference_perf_config(base_url, model, load, tok, reports)
    )


def _prepare_file(
    base_url: str, model: str, prompts: list[tuple[str, int]], rate: float, out_dir: Path
) -> tuple[Path, Path, Path, Path]:
    seconds = round(len(prompts) / rate)
    if seconds < 1 or abs(seconds * rate - len(prompts)) > 1e-9:
        raise ValueError(f"{len(prompts)} requests at {rate:g} req/s is not a whole second count")
    out_dir = out_dir.absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    # JSON Lines (its loader, `datasets`' json builder, reads them as they are); the name must
    # end in .json all the same (inference-perf's rule for a file path)
    data = out_dir / "requests.json"
    data.write_text("".join(json.dumps(r) + "\n" for r in sharegpt_records(prompts)))
    return _write_config(
        out_dir,
        lambda tok, reports: inference_perf_file_config(
            base_url, model, data, rate, seconds, tok, reports
        ),
    )


def _read_result(rc: int, reports: Path, log_path: Path) -> dict[str, Any]:
    summary_path = reports / "summary_lifecycle_metrics.json"
    if rc != 0 or not summary_path.exists():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"inference-perf exited {rc}; {log_path}:\n{tail}")
    return parse_inference_perf(json.loads(summary_path.read_text()))


async def run_inference_perf(
    base_url: str,
    model: str,
    load: SharedPrefixLoad,
    out_dir: Path,
    *,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """One inference-perf run against `base_url`; its parsed summary (raises on failure)."""
    _installed("inference-perf")
    prepared = _prepare(base_url, model, load, out_dir)
    result = await _run_inference_perf(prepared, timeout)
    result["rate"] = load.rate
    result["seconds"] = load.seconds
    return result


async def run_inference_perf_file(
    base_url: str,
    model: str,
    prompts: list[tuple[str, int]],
    rate: float,
    out_dir: Path,
    *,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """inference-perf sending exactly `prompts` ((prompt, max_tokens), in order) as streaming
    completions at Poisson `rate`; its parsed summary (raises on failure)."""
    _installed("inference-perf")
    prepared = _prepare_file(base_url, model, prompts, rate, out_dir)
    result = await _run_inference_perf(prepared, timeout)
    result["rate"] = rate
    result["requests"] = len(prompts)
    return result


def _installed(client: str) -> None:
    pkg = PACKAGES[client]
    if stamp(pkg) is None:
        raise RuntimeError(
            f"{client} is not installed; run `python -m bench.anchors {client}` "
            f"(builds {venv_dir(pkg)})"
        )


async def _run_inference_perf(
    prepared: tuple[Path, Path, Path, Path], timeout: float
) -> dict[str, Any]:
    pkg = PACKAGES["inference-perf"]
    out_dir, cfg_path, reports, log_path = prepared
    exe = venv_dir(pkg) / "bin" / "inference-perf"
    t0 = time.monotonic()
    rc = await _run_client(
        [str(exe), "--config_file", str(cfg_path)],
        {**OFFLINE_ENV, "HF_HOME": str(out_dir / "hf-home")},
        out_dir,
        log_path,
        timeout,
    )
    result = _read_result(rc, reports, log_path)
    result["version"] = pkg.version
    result["process_s"] = round(time.monotonic() - t0, 1)
    result["report_dir"] = str(reports)
    return result


# ----------------------------------------------------------------------------------------------
# aiperf (NVIDIA, PyPI `aiperf`): --num-prefix-prompts prefixes of --prefix-prompt-length tokens,
# one picked at random per request, prepended to a random prompt of --isl tokens.
#
# Two things it needs here (bench/results/anchors/NOTES.md):
# - `--prompt-corpus random`: its default corpus (Shakespeare) is tokenized with our tokenizer
#   into mostly <unk>, which it then decodes *with* special tokens, sending the literal text
#   "<unk>" (5 bytes for 1 counted token: 685 engine tokens for 550 requested). Random ids
#   from the vocabulary decode to text that re-tokenizes exactly.
# - no HF_HUB_OFFLINE: in offline mode aiperf 0.13.0 resolves every tokenizer name through
#   huggingface_hub.snapshot_download(local_files_only=True), which rejects a local directory
#   ("HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name'").
#   Online, a local path is loaded from disk; HF_ENDPOINT points at a closed local port so
#   that any hub request would fail at once instead of leaving the machine.

AIPERF_ENV = {
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class PrefixPromptLoad:
    """aiperf's prefix prompts, shaped like `system-prompts` (and like SharedPrefixLoad)."""

    rate: float = 5.0
    seconds: int = 10
    prefixes: int = 8
    prefix_len: int = 2000
    isl: tuple[int, int] = (175, 72)  # mean, stddev of the user prompt (tokens)
    osl: tuple[int, int] = (160, 55)  # mean, stddev of the answer (tokens)
    seed: int = 7
    workers: int = 1


def aiperf_command(
    exe: str | Path,
    base_url: str,
    model: str,
    load: PrefixPromptLoad,
    tokenizer_dir: Path,
    out_dir: Path,
) -> list[str]:
    """The `aiperf profile` command line of one run: streaming completions, rate x seconds
    requests at Poisson arrivals of `load.rate`."""
    return [
        str(exe),
        "profile",
        "--model",
        model,
        "--url",
        base_url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--tokenizer",
        str(tokenizer_dir),
        "--prompt-corpus",
        "random",
        "--num-prefix-prompts",
        str(load.prefixes),
        "--prefix-prompt-length",
        str(load.prefix_len),
        "--isl",
        str(load.isl[0]),
        "--isl-stddev",
        str(load.isl[1]),
        "--osl",
        str(load.osl[0]),
        "--osl-stddev",
        str(load.osl[1]),
        "--extra-inputs",
        "ignore_eos:true",
        "--request-rate",
        f"{load.rate:g}",
        "--arrival-pattern",
        "poisson",
        # a count, not --benchmark-duration: with a 5 s duration at 4 req/s it sent 12, not ~20
        # (its workers start inside the timed window)
        "--request-count",
        str(max(1, int(load.rate * load.seconds))),
        "--random-seed",
        str(load.seed),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--workers-max",
        str(load.workers),
        "--artifact-dir",
        str(out_dir),
    ]


def parse_aiperf(summary: dict[str, Any]) -> dict[str, Any]:
    """Our fields from aiperf's profile_export_aiperf.json (already in ms)."""

    def raw(metric: str, key: str) -> float | None:
        v = (summary.get(metric) or {}).get(key)
        return None if v is None else float(v)

    def stat(metric: str, key: str) -> float | None:
        v = raw(metric, key)
        return None if v is None else round(v, 2)

    ok = int(stat("completed_request_count", "avg") or stat("request_count", "avg") or 0)
    errors = sum(int(e.get("count", 1)) for e in summary.get("error_summary") or [])
    cache_pct = raw("overall_usage_prompt_cache_read_pct", "avg")
    return {
        "client": "aiperf",
        "requests_ok": ok,
        "errors": errors,
        "ttft_p50_ms": stat("time_to_first_token", "p50"),
        "ttft_p90_ms": stat("time_to_first_token", "p90"),
        "ttft_p99_ms": stat("time_to_first_token", "p99"),
        "e2e_p50_ms": stat("request_latency", "p50"),
        "e2e_p99_ms": stat("request_latency", "p99"),
        "output_tokens_per_s": round(raw("output_token_throughput", "avg") or 0.0, 1),
        "throughput_rps": stat("request_throughput", "avg"),
        "client_reported_hit_rate": None if cache_pct is None else round(cache_pct / 100.0, 4),
        "token_count_mismatches": int(stat("usage_discrepancy_count", "avg") or 0),
        "wall_s": stat("benchmark_duration", "avg"),
    }


def _read_aiperf(rc: int, out_dir: Path, log_path: Path) -> dict[str, Any]:
    path = out_dir / "profile_export_aiperf.json"
    if rc != 0 or not path.exists():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"aiperf exited {rc}; {log_path}:\n{tail}")
    return parse_aiperf(json.loads(path.read_text()))


def _prepare_aiperf(out_dir: Path) -> tuple[Path, Path]:
    out_dir = out_dir.absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir, build_tokenizer("aiperf")


async def run_aiperf(
    base_url: str,
    model: str,
    load: PrefixPromptLoad,
    out_dir: Path,
    *,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """One aiperf run against `base_url`; its parsed summary (raises on failure)."""
    pkg = PACKAGES["aiperf"]
    _installed("aiperf")
    out_dir, tok = _prepare_aiperf(out_dir)
    artifacts = out_dir / "artifacts"
    log_path = out_dir / "aiperf.log"
    args = aiperf_command(venv_dir(pkg) / "bin" / "aiperf", base_url, model, load, tok, artifacts)
    t0 = time.monotonic()
    env = {**AIPERF_ENV, "HF_HOME": str(out_dir / "hf-home")}
    rc = await _run_client(args, env, out_dir, log_path, timeout)
    result = _read_aiperf(rc, artifacts, log_path)
    result["version"] = pkg.version
    result["rate"] = load.rate
    result["seconds"] = load.seconds
    result["process_s"] = round(time.monotonic() - t0, 1)
    result["report_dir"] = str(artifacts)
    return result
