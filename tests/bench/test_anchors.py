"""The anchors and the third-party client (bench/harness/anchors.py, thirdparty.py): the
documented settings each anchor is given, the client's requests and its figures; and, when a
cached venv exists, the anchor itself in front of two real simulators.

Nothing here installs anything: `python -m bench install` builds the venvs, and `make test`
runs it first (about 2 minutes and 1 GB the first time, nothing after), so under `make test`
these run; without a venv they skip, and fail when $CI is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest

from bench.harness import anchors
from bench.harness.anchors import ANCHORS, PACKAGES, check_names, missing, start_anchor
from bench.harness.engines import fetch_stats
from bench.harness.fleet import Fleet
from bench.harness.thirdparty import config, parse_summary, sharegpt_records

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_each_anchor_gets_its_documented_settings_and_its_own_metrics_port() -> None:
    args = ANCHORS["sglang-cache_aware"].command("/venv/bin/python", WORKERS, 4000, 4001)
    assert args[:3] == ["/venv/bin/python", "-m", "sglang_router.launch_router"]
    i = args.index("--worker-urls")
    assert args[i + 1 : i + 3] == WORKERS
    assert [_after(args, f) for f in ("--policy", "--port", "--host", "--prometheus-port")] == [
        "cache_aware", "4000", "127.0.0.1", "4001"]
    assert [_after(args, f) for f in ("--cache-threshold", "--balance-abs-threshold",
                                      "--balance-rel-threshold", "--eviction-interval-secs",
                                      "--max-tree-size")] == ["0.3", "64", "1.5", "120", str(2**26)]
    ca = ANCHORS["vllm-cache_aware"].command("py", WORKERS, 1, 2)
    assert [_after(ca, f) for f in ("--cache-threshold", "--balance-abs-threshold",
                                    "--balance-rel-threshold")] == ["0.5", "32", "1.1"]
    ch = ANCHORS["vllm-consistent_hash"].command("py", WORKERS, 1, 2)
    assert _after(ch, "--policy") == "consistent_hash" and "--cache-threshold" not in ch
    for a in ANCHORS.values():
        assert a.source and PACKAGES[a.package].version.count(".") == 2


def test_an_anchor_not_installed_says_how_to_install_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anchors, "ANCHORS_DIR", tmp_path)
    assert "python -m bench install sglang-router" in (missing(ANCHORS["sglang-cache_aware"]) or "")
    assert check_names([]) == list(PACKAGES)
    with pytest.raises(SystemExit):
        check_names(["no-such-router"])


def test_the_client_is_sent_our_requests_with_answers_it_counts_exactly(tmp_path: Path) -> None:
    records = sharegpt_records([("hello", 3), ("world", 1)])
    assert records[0] == {"conversations": [{"from": "human", "value": "placeholder"},
                                            {"from": "gpt", "value": "abcd"}]}
    assert records[1]["conversations"][1]["value"] == "abcd" * 3  # 3 tokens of 4 bytes
    with pytest.raises(ValueError):
        sharegpt_records([("x", 0)])
    cfg = config("http://r", "m", tmp_path / "r.json", 8.0, 30, tmp_path / "tok", tmp_path / "o")
    assert cfg["data"] == {"type": "shareGPT", "path": str(tmp_path / "r.json")}
    assert cfg["load"]["stages"] == [{"rate": 8.0, "duration": 30}]  # 240 requests
    assert cfg["api"] == {"type": "completion", "streaming": True}
    json.dumps(cfg)


def test_the_clients_summary_in_our_fields() -> None:
    r = parse_summary({"successes": {"count": 50, "latency": {
        "time_to_first_token": {"median": 0.05266, "p90": 0.1993, "p99": 0.2087},
        "request_latency": {"median": 2.99185}}}, "failures": {"count": 2}})
    assert (r["requests_ok"], r["errors"]) == (50, 2)
    assert (r["ttft_p50_ms"], r["ttft_p90_ms"], r["ttft_p99_ms"]) == (52.66, 199.3, 208.7)
    assert parse_summary({"successes": {"count": 0}, "failures": {"count": 5}})["ttft_p50_ms"] \
        is None


# ---- with the cached venvs (`python -m bench install` builds them; `make test` runs it) ------


def installed(what: anchors.Anchor | anchors.Package) -> None:
    """Skips when `what`'s venv is absent, or fails under $CI (make test installs them)."""
    if why := missing(what):
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{why} (CI is set, so this fails)", pytrace=False)
        pytest.skip(why)



@pytest.mark.parametrize("name", sorted(ANCHORS))
async def test_anchor_routes_ten_requests_over_two_sims(name: str, tmp_path: Path) -> None:
    installed(ANCHORS[name])
    async with Fleet(tmp_path / "logs") as fleet:
        sims = [(await fleet.start_sim(f"sim{i}", model="m", kv_capacity=50_000, profile="fast",
                                       time_scale=1.0)).url for i in range(2)]
        p = await start_anchor(fleet, name, sims)
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> tuple[int, bytes]:
                body = {"model": "m", "max_tokens": 4, "stream": True, "messages": [
                    {"role": "system", "content": "s" * 400}, {"role": "user", "content": str(i)}]}
                async with s.post(p.url + "/v1/chat/completions", json=body) as r:
                    return r.status, await r.read()

            results = await asyncio.gather(*(one(i) for i in range(10)))
        assert all(status == 200 and b"data: [DONE]" in raw for status, raw in results)
        assert sum(st["requests"] for st in await fetch_stats(sims)) == 10


def test_local_tokenizer_counts_like_the_simulator(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from bench.harness.thirdparty import build_tokenizer
    from engine_sim.tokenizer import count_tokens

    out = build_tokenizer(tmp_path / "tok")
    text = "abcd efgh" + " sel lis zon" + "\n[system prompt 3] x"
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert len(tok.encode(text, add_special_tokens=False).ids) == count_tokens(text.encode())
    assert tok.decode(tok.encode("abcd" * 3).ids) == "abcd" * 3  # an answer as it was asked


def test_the_client_reads_the_local_tokenizer_as_built(tmp_path: Path) -> None:
    from bench.harness.thirdparty import build_tokenizer
    from engine_sim.tokenizer import count_tokens

    pkg = PACKAGES["inference-perf"]
    installed(pkg)
    out = build_tokenizer(tmp_path / "tok")
    text = "abcd efgh" + " sel lis zon" + "\n[system prompt 3] x"
    script = ("import sys; from transformers import AutoTokenizer; "
              "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
              "print(len(t(sys.argv[2], add_special_tokens=False).input_ids))")
    n = subprocess.run(
        [str(pkg.python), "-c", script, str(out), text], capture_output=True,
        text=True, check=True,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    ).stdout.split()[-1]
    assert int(n) == count_tokens(text.encode())


FAKE_CLIENT = """#!/bin/sh
# inference-perf's part: the config given, a summary written in its folder (its cwd)
test "$1" = --config_file && grep -q "type: shareGPT" "$2" || exit 3
mkdir -p reports
echo '{"successes": {"count": '$(wc -l < requests.json)', "latency": {"time_to_first_token":
  {"median": 0.012}}}, "failures": {"count": 0}}' > reports/summary_lifecycle_metrics.json
"""


async def test_the_client_runs_on_our_requests_and_a_failure_says_where_to_look(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.harness.thirdparty import run_inference_perf

    monkeypatch.setattr(anchors, "ANCHORS_DIR", tmp_path / "anchors")
    bin_dir = PACKAGES["inference-perf"].venv / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").touch()
    (bin_dir.parent / "installed.json").write_text("{}")
    (bin_dir / "inference-perf").write_text(FAKE_CLIENT)
    (bin_dir / "inference-perf").chmod(0o755)
    prompts = [("hello", 3), ("world", 1)]
    r = await run_inference_perf("http://r", "m", prompts, 2.0, tmp_path / "run", timeout=30)
    assert (r["requests_ok"], r["ttft_p50_ms"], r["client_version"]) == (3, 12.0, "0.7.0")
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists()
    with pytest.raises(ValueError):  # 2 requests at 3 req/s: no whole second
        await run_inference_perf("http://r", "m", prompts, 3.0, tmp_path / "run", timeout=30)
    (bin_dir / "inference-perf").write_text("#!/bin/sh\necho no server >&2\nexit 2\n")
    with pytest.raises(RuntimeError, match=r"exited 2;.*inference-perf\.log:\nno server"):
        await run_inference_perf("http://r", "m", prompts, 2.0, tmp_path / "run2", timeout=30)
