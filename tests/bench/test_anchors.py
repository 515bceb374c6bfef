"""bench/anchors.py and bench/thirdparty.py: command lines and result parsing (pure), and, when
an anchor's cached venv exists, the anchor itself in front of two real simulators.

Nothing here installs anything: `python -m bench.anchors` builds the venvs.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import aiohttp
import pytest

from bench import anchors
from bench.anchors import ANCHORS, PACKAGES, Package, available, start_anchor
from bench.fleet import Fleet
from bench.thirdparty import (
    PrefixPromptLoad,
    SharedPrefixLoad,
    aiperf_command,
    inference_perf_config,
    parse_aiperf,
    parse_inference_perf,
)

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_sglang_command_has_workers_policy_settings_and_own_metrics_port():
    a = ANCHORS["sglang-cache_aware"]
    args = a.command("/venv/bin/python", WORKERS, 4000, 4001)
    assert args[:3] == ["/venv/bin/python", "-m", "sglang_router.launch_router"]
    i = args.index("--worker-urls")
    assert args[i + 1 : i + 3] == WORKERS
    assert _after(args, "--policy") == "cache_aware"
    assert _after(args, "--port") == "4000"
    assert _after(args, "--host") == "127.0.0.1"
    assert _after(args, "--prometheus-port") == "4001"
    assert _after(args, "--cache-threshold") == "0.3"
    assert _after(args, "--balance-abs-threshold") == "64"
    assert _after(args, "--balance-rel-threshold") == "1.5"
    assert _after(args, "--eviction-interval-secs") == "120"
    assert _after(args, "--max-tree-size") == str(2**26)
    assert _after(args, "--shutdown-grace-period-secs") == "2"


def test_vllm_commands():
    ca = ANCHORS["vllm-cache_aware"].command("py", WORKERS, 1, 2)
    assert _after(ca, "-m") == "vllm_router.launch_router"
    assert _after(ca, "--policy") == "cache_aware"
    assert _after(ca, "--cache-threshold") == "0.5"
    assert _after(ca, "--balance-abs-threshold") == "32"
    assert _after(ca, "--balance-rel-threshold") == "1.1"
    assert _after(ca, "--log-level") == "warning"
    ch = ANCHORS["vllm-consistent_hash"].command("py", WORKERS, 1, 2)
    assert _after(ch, "--policy") == "consistent_hash"
    assert "--cache-threshold" not in ch


def test_every_anchor_names_its_source_and_a_pinned_package():
    for a in ANCHORS.values():
        assert a.source
        pkg = PACKAGES[a.package]
        assert pkg.version.count(".") == 2
        assert anchors.venv_dir(pkg).name == f"{pkg.name}-{pkg.version}"


def test_install_command_is_pinned_and_absent_venv_has_no_stamp():
    pkg = Package("no-such-anchor", "0.0.0")
    assert anchors.install_command(pkg)[-1] == "no-such-anchor==0.0.0"
    assert anchors.stamp(pkg) is None


def test_interpreters_sort_by_number():
    names = ["3.9.18", "3.13.0", "3.12.1", "2.7.18", "3.11.7"]
    assert sorted(names, key=anchors._numeric, reverse=True)[:3] == ["3.13.0", "3.12.1", "3.11.7"]


def test_inference_perf_config(tmp_path: Path):
    load = SharedPrefixLoad(rate=5, seconds=10)
    cfg = inference_perf_config("http://r", "m", load, tmp_path / "tok", tmp_path / "out")
    sp = cfg["data"]["shared_prefix"]
    assert cfg["data"]["type"] == "shared_prefix"
    assert cfg["api"] == {"type": "completion", "streaming": True}
    assert sp["system_prompt_len"] == 2000
    assert sp["question_len"]["type"] == "uniform"
    assert (sp["question_len"]["min"], sp["question_len"]["max"]) == (50, 300)
    assert cfg["load"]["type"] == "poisson"
    assert cfg["load"]["stages"] == [{"rate": 5, "duration": 10}]
    assert cfg["server"]["base_url"] == "http://r"
    assert cfg["tokenizer"]["pretrained_model_name_or_path"] == str(tmp_path / "tok")


INFERENCE_PERF_SUMMARY = {
    "benchmark_time_seconds": 12.4,
    "successes": {
        "count": 50,
        "latency": {
            "time_to_first_token": {"median": 0.05266, "p90": 0.1993, "p99": 0.2087},
            "request_latency": {"median": 2.99185, "p99": 4.75099},
        },
        "throughput": {"output_tokens_per_sec": 667.31, "requests_per_sec": 4.0221},
        "prompt_tokens": {"total": 100000.0, "cached": 72860.0, "uncached": 27140.0},
        "token_count_mismatches": 0,
    },
    "failures": {"count": 2, "request_latency": None},
}


def test_parse_inference_perf():
    r = parse_inference_perf(INFERENCE_PERF_SUMMARY)
    assert r["requests_ok"] == 50
    assert r["errors"] == 2
    assert r["ttft_p50_ms"] == 52.66
    assert r["ttft_p90_ms"] == 199.3
    assert r["ttft_p99_ms"] == 208.7
    assert r["e2e_p99_ms"] == 4750.99
    assert r["output_tokens_per_s"] == 667.3
    assert r["client_reported_hit_rate"] == 0.7286


def test_parse_inference_perf_with_no_successes():
    r = parse_inference_perf({"successes": {"count": 0}, "failures": {"count": 5}})
    assert (r["requests_ok"], r["errors"], r["ttft_p50_ms"]) == (0, 5, None)
    assert r["client_reported_hit_rate"] is None


def test_aiperf_command(tmp_path: Path):
    load = PrefixPromptLoad(rate=5, seconds=10)
    args = aiperf_command("aiperf", "http://r", "m", load, tmp_path / "tok", tmp_path / "out")
    assert args[:2] == ["aiperf", "profile"]
    assert _after(args, "--num-prefix-prompts") == "8"
    assert _after(args, "--prefix-prompt-length") == "2000"
    assert _after(args, "--prompt-corpus") == "random"
    assert _after(args, "--request-count") == "50"
    assert _after(args, "--request-rate") == "5"
    assert _after(args, "--endpoint-type") == "completions"
    assert "--streaming" in args
    assert _after(args, "--tokenizer") == str(tmp_path / "tok")


def test_parse_aiperf():
    summary = {
        "completed_request_count": {"unit": "requests", "avg": 50.0},
        "time_to_first_token": {"unit": "ms", "p50": 56.951, "p90": 180.0, "p99": 209.2},
        "request_latency": {"unit": "ms", "p50": 3000.0, "p99": 5000.0},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 612.345},
        "request_throughput": {"unit": "requests/sec", "avg": 3.9},
        "overall_usage_prompt_cache_read_pct": {"unit": "%", "avg": 67.6},
        "benchmark_duration": {"unit": "sec", "avg": 13.0},
        "error_summary": [{"error_details": {"code": 500}, "count": 3}],
    }
    r = parse_aiperf(summary)
    assert r["requests_ok"] == 50
    assert r["errors"] == 3
    assert r["ttft_p50_ms"] == 56.95
    assert r["ttft_p99_ms"] == 209.2
    assert r["output_tokens_per_s"] == 612.3
    assert r["client_reported_hit_rate"] == 0.676


# ---- with the cached venvs (skipped when absent; `python -m bench.anchors` installs) ----------


@pytest.mark.parametrize("name", sorted(ANCHORS))
async def test_anchor_routes_ten_requests_over_two_sims(name: str, tmp_path: Path):
    a = ANCHORS[name]
    if not available(a):
        pytest.skip(
            f"{a.package} {PACKAGES[a.package].version} is not installed in "
            f"{anchors.venv_dir(PACKAGES[a.package])}; run `python -m bench.anchors {a.package}`"
        )
    from bench.run import fetch_stats, start_sims

    async with Fleet(tmp_path / "logs") as fleet:
        sims = await start_sims(fleet, 2, 50_000, "fast", 1.0)
        p = await start_anchor(fleet, a, sims)
        body = {
            "model": "sim-llama-3.1-70b",
            "messages": [{"role": "system", "content": "s" * 400}, {"role": "user", "content": ""}],
            "max_tokens": 4,
            "stream": True,
        }
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> tuple[int, bytes]:
                b = {**body, "messages": [body["messages"][0], {"role": "user", "content": f"{i}"}]}
                async with s.post(p.url + "/v1/chat/completions", json=b) as r:
                    return r.status, await r.read()

            results = await asyncio.gather(*(one(i) for i in range(10)))
        assert all(status == 200 and b"data: [DONE]" in raw for status, raw in results)
        stats = await fetch_stats(sims)
        assert sum(st["requests"] for st in stats) == 10


def test_local_tokenizer_counts_like_the_simulator(tmp_path: Path):
    pkg = PACKAGES["inference-perf"]
    if anchors.stamp(pkg) is None:
        pytest.skip(f"inference-perf is not installed in {anchors.venv_dir(pkg)}")
    from bench.thirdparty import build_tokenizer
    from engine_sim.tokenizer import count_tokens

    out = build_tokenizer("inference-perf", tmp_path / "tok")
    text = "abcd efgh" + " sel lis zon" + "\n[system prompt 3] x"
    script = (
        "import sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(len(t(sys.argv[2], add_special_tokens=False).input_ids))"
    )
    n = subprocess.run(
        [str(anchors.venv_python(pkg)), "-c", script, str(out), text],
        capture_output=True,
        text=True,
        check=True,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    ).stdout.split()[-1]
    assert int(n) == count_tokens(text.encode())


def test_parse_names_defaults_to_every_package_and_checks_names() -> None:
    from bench.anchors import PACKAGES, parse_names

    assert parse_names([]) == list(PACKAGES)
    assert parse_names(["vllm-router"]) == ["vllm-router"]
    with pytest.raises(SystemExit):
        parse_names(["no-such-router"])
