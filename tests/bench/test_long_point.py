"""bench/long_point.py's pure parts: setups, one run's figures, the summary and the README."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.long_point import figures, parse_setup, readme, summary


def test_parse_setup():
    assert parse_setup("prefix") == ("prefix", {})
    assert parse_setup("prefix,load_slack=64,evict_weight=0") == (
        "prefix", {"load_slack": 64, "evict_weight": 0})
    assert parse_setup("sglang-cache_aware") == ("sglang-cache_aware", {})
    with pytest.raises(ValueError, match="key=value"):
        parse_setup("prefix,load_slack")
    with pytest.raises(ValueError, match="our router only"):
        parse_setup("sglang-cache_aware,x=1")


def test_figures_and_summary():
    res = [SimpleNamespace(ok=True, ttft=t / 1000) for t in (40, 50, 60)]
    res.append(SimpleNamespace(ok=False, ttft=None))
    stats = [{"prompt_tokens": 100, "cached_tokens": 90, "requests": 3},
             {"prompt_tokens": 100, "cached_tokens": 70, "requests": 1}]
    f = figures(res, stats)
    assert f["requests_ok"] == 3 and f["errors"] == 1
    assert f["engine_hit_rate"] == 0.8 and f["ttft_p50_ms"] == 50.0 and f["imbalance"] == 1.5
    s = summary([f, {**f, "ttft_p99_ms": 70.0}, {**f, "ttft_p99_ms": 90.0}])
    assert s["ttft_p99_ms"]["median"] == 70.0 and s["ttft_p99_ms"]["max"] == 90.0


def test_readme_rows():
    run = {"requests_ok": 10, "engine_hit_rate": 0.9, "ttft_p50_ms": 50.0, "ttft_p90_ms": 60.0,
           "ttft_p99_ms": 80.0, "imbalance": 1.2}
    point = {"workload": "multi-turn", "rate": 32.0, "seconds": 30.0, "repeats": 1,
             "command": "cmd", "measured_at": "now", "machine": "m",
             "runs": {"prefix": [run]}, "summary": {"prefix": summary([run])}}
    text = readme({"points": [point]})
    assert "## multi-turn at 32 req/s for 30 s, 1 rounds" in text
    assert "| prefix | 0.9 (0.9-0.9) | 50.0 (50.0-50.0) | 60.0 (60.0-60.0) | 80.0 (80.0-80.0) " \
           "| 1.2 (1.2-1.2) | 10 |" in text
