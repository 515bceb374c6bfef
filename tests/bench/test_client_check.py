"""bench/client_check.py and the shareGPT-file parts of bench/thirdparty.py: the request file,
the config, the figures and the verdict (pure), and the load generator's completions mode against
a real simulator (the engine must see the same prompt bytes as from a chat request)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.client_check import added, engine_figures, readme, requests_of, verdict
from bench.fleet import Fleet
from bench.loadgen import run_load
from bench.thirdparty import (
    SHAREGPT_PLACEHOLDER,
    _prepare_file,
    inference_perf_file_config,
    sharegpt_records,
)
from bench.workloads import build
from engine_sim.chat import render_chat


def test_sharegpt_records_put_a_placeholder_first_and_answers_of_max_tokens():
    recs = sharegpt_records([("p1", 3), ("p2", 1)])
    assert recs[0] == SHAREGPT_PLACEHOLDER  # inference-perf 0.7.0 throws the first record away
    assert recs[1]["conversations"][0] == {"from": "human", "value": "p1"}
    assert recs[1]["conversations"][1]["value"] == "abcdabcdabcd"  # 3 tokens of 4 characters
    assert recs[2]["conversations"][1]["value"] == "abcd"
    with pytest.raises(ValueError):
        sharegpt_records([("p", 0)])


def test_file_config_reads_the_file_and_sends_rate_times_seconds(tmp_path: Path):
    cfg = inference_perf_file_config("http://127.0.0.1:1", "m", tmp_path / "r.json", 8.0, 30,
                                     tmp_path / "tok", tmp_path / "out")
    assert cfg["data"] == {"type": "shareGPT", "path": str(tmp_path / "r.json")}
    assert cfg["api"] == {"type": "completion", "streaming": True}
    assert cfg["load"]["stages"] == [{"rate": 8.0, "duration": 30}]
    assert cfg["load"]["type"] == "poisson" and cfg["load"]["num_workers"] >= 1
    assert cfg["load"]["worker_max_concurrency"] >= 240


def test_prepare_file_refuses_a_count_that_is_not_whole_seconds(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("bench.thirdparty.build_tokenizer", lambda *a, **k: tmp_path / "tok")
    with pytest.raises(ValueError, match="whole second"):
        _prepare_file("http://x", "m", [("p", 1)] * 10, 3.0, tmp_path / "a")
    out, cfg_path, _reports, _log = _prepare_file("http://x", "m", [("p", 2)] * 12, 3.0,
                                                  tmp_path / "b")
    recs = [json.loads(line) for line in (out / "requests.json").read_text().splitlines()]
    assert len(recs) == 13 and recs[1]["conversations"][0]["value"] == "p"
    assert "duration: 4" in cfg_path.read_text()


def test_requests_of_takes_single_turn_sessions_in_order():
    wl, prompts = requests_of(build("system-prompts", 20), 10)
    assert len(wl.sessions) == 10 and len(prompts) == 10
    s = wl.sessions[3]
    msgs = [{"role": "system", "content": s.system}, {"role": "user", "content": s.turns[0].user}]
    assert prompts[3] == (render_chat(msgs), s.turns[0].max_tokens)
    with pytest.raises(ValueError, match="single-turn"):
        requests_of(build("multi-turn", 20), 10)
    with pytest.raises(ValueError, match="asked for"):
        requests_of(build("unique", 5), 10)


def test_engine_figures_added_and_verdicts():
    stats = [{"requests": 2, "prompt_tokens": 100, "cached_tokens": 80,
              "ttft_s": [0.040, 0.050]},
             {"requests": 1, "prompt_tokens": 100, "cached_tokens": 0, "ttft_s": [0.200]}]
    e = engine_figures(stats)
    assert e["engine_requests"] == 3 and e["engine_hit_rate"] == 0.4
    assert e["engine_ttft_p50_ms"] == 50.0
    row = {"ttft_p50_ms": 52.5, "engine_ttft_p50_ms": 50.0, "ttft_p90_ms": None}
    assert added(row)["added_p50_ms"] == 2.5 and added(row)["added_p90_ms"] is None
    ours = {"ttft_p50_ms": 50.0, "engine_ttft_p50_ms": 48.0, "added_p50_ms": 2.0}
    assert verdict(ours, {**ours, "ttft_p50_ms": 51.0}).startswith("agree")
    # the engines moved as much as the clients: different work, not different clients
    moved = {"ttft_p50_ms": 60.0, "engine_ttft_p50_ms": 58.0, "added_p50_ms": 2.0}
    assert "so do the engines" in verdict(ours, moved)
    slow = {"ttft_p50_ms": 60.0, "engine_ttft_p50_ms": 48.0, "added_p50_ms": 12.0}
    assert "clients add different time" in verdict(ours, slow)
    assert verdict({}, ours) == "no figures to compare"


def test_readme_has_a_row_per_run_and_the_verdicts():
    rows = [{"router": "prefix", "client": c, "requests_ok": 10, "engine_requests": 10,
             "engine_hit_rate": 0.8, "ttft_p50_ms": 50.0, "engine_ttft_p50_ms": 48.0,
             "added_p50_ms": 2.0} for c in ("loadgen", "inference-perf")]
    text = readme({"command": "cmd", "measured_at": "now", "machine": "m", "requests": 10,
                   "workload": "system-prompts", "rate": 8.0, "rows": rows,
                   "verdicts": {"prefix": "agree: x"}, "inference_perf": "0.7.0"})
    assert "| prefix | loadgen | 10 | 10 | 0.8 | 50.0 |" in text
    assert "| prefix | inference-perf |" in text
    assert "- `prefix`: agree: x" in text


async def test_completions_mode_gives_the_engine_the_chat_prompt(fleet: Fleet):
    sim = await fleet.start_sim("sim", model="m", kv_capacity=200_000, profile="fast",
                                time_scale=1.0)
    wl, prompts = requests_of(build("system-prompts", 4), 4)
    wl = dataclasses.replace(wl, sessions=wl.sessions[:2])
    for api in ("chat", "completions"):
        log = await run_load(wl, [sim.url], "m", 50.0, 5.0, progress=False, api=api)
        results = sorted(log.results, key=lambda r: r.session)  # in the order they finished
        assert [r.ok for r in results] == [True, True], results
        assert [r.output_tokens for r in results] == [
            s.turns[0].max_tokens for s in wl.sessions]
        # prompt_tokens as the engine counted them: the chat template's bytes / 4, either way
        assert [r.prompt_tokens for r in results] == [
            -(-len(p.encode()) // 4) for p, _ in prompts[:2]]


def test_ratio_lines_divide_the_first_router_by_each_other_per_client():
    from bench.client_check import ratio_lines

    rows = [
        {"router": "prefix", "client": "loadgen", "ttft_p50_ms": 45.0, "engine_ttft_p50_ms": 42.0},
        {"router": "prefix", "client": "ip", "ttft_p50_ms": 44.0, "engine_ttft_p50_ms": 41.0},
        {"router": "rr", "client": "loadgen", "ttft_p50_ms": 180.0, "engine_ttft_p50_ms": 168.0},
        {"router": "rr", "client": "ip", "ttft_p50_ms": None, "engine_ttft_p50_ms": 170.0},
    ]
    assert ratio_lines(rows) == [
        "- loadgen: `prefix` / `rr` = 0.250 at the client, 0.250 at the engines"]
