"""bench first-chunk: its pieces against real processes (simulator, router, byte pipe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.first_chunk import PATHS, probe, write_readme
from bench.loadgen import Result
from bench.run import split_p50s, timings_by_id, write_requests
from bench.stats import histogram_sum_count

pytestmark = pytest.mark.slow


def test_histogram_sum_and_count_of_one_metric():
    text = "\n".join([
        "# TYPE prefix_router_ttft_seconds histogram",
        'prefix_router_ttft_seconds_bucket{le="0.005"} 3.0',
        "prefix_router_ttft_seconds_sum 0.012",
        "prefix_router_ttft_seconds_count 4.0",
        "prefix_router_decision_seconds_sum 9.0",
        "prefix_router_decision_seconds_count 9.0",
    ])
    assert histogram_sum_count(text, "prefix_router_ttft_seconds") == (0.012, 4.0)
    assert histogram_sum_count(text, "absent") == (0.0, 0.0)


async def test_probe_splits_every_path_and_the_parts_add_up(tmp_path: Path):
    res = await probe(4, 1, 4, 0.0, tmp_path / "logs", profile="fast")
    for p in PATHS:
        f = res["paths"][p]
        assert f["requests"] == 4
        parts = f["to_engine_p50_ms"] + f["engine_p50_ms"] + f["back_p50_ms"]
        # medians of parts need not add to the median of the whole; they must be close
        assert abs(parts - f["ttft_p50_ms"]) < 0.5 * f["ttft_p50_ms"], (p, f)
        # a fast-profile step (2 ms) sits between the simulator's receiving and its writing
        assert f["engine_p50_ms"] >= 1.5
    assert res["router_decision_mean_ms"] is not None
    res["tag"] = "t"
    write_readme(tmp_path, [res])
    text = (tmp_path / "README.md").read_text()
    assert "| t | router | 4 |" in text


def test_requests_out_splits_a_timed_request(tmp_path: Path):
    r = Result(0, 0, 10.0, 0.050, 0.5, True, 200, 8, 64, 100, "u", request_id="r0")
    untimed = Result(0, 1, 10.1, 0.060, 0.5, True, 200, 8, 0, 100, "u", request_id="r1")
    stats = [{"timings": [["r0", 10.001, 10.0012, 10.048, 10.0483]]}]
    out = tmp_path / "req.jsonl"
    write_requests([r, untimed], 9.0, timings_by_id(stats), str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["sent_at"] == 1.0
    assert rows[0]["to_engine_ms"] == 1.0
    assert rows[0]["engine_ttft_ms"] == pytest.approx(46.8)
    assert rows[0]["engine_parse_ms"] == pytest.approx(0.2)
    assert rows[0]["back_ms"] == pytest.approx(1.7)
    assert "to_engine_ms" not in rows[1]


def test_split_medians_over_the_timed_requests():
    rs = [Result(0, i, 10.0 + i, 0.040 + i / 1000, 0.5, True, 200, 8, 64, 100, "u",
                 request_id=f"r{i}") for i in range(3)]
    stats = [{"timings": [[f"r{i}", 10.001 + i, 10.0011 + i, 10.039 + i, 10.0392 + i]
                          for i in range(3)]}, {"timings": []}]
    got = split_p50s(rs, timings_by_id(stats))
    assert got["to_engine"] == 1.0 and got["engine_parse"] == 0.1
    assert got["engine_ttft"] == 37.9 and got["engine_write"] == 0.2
    assert got["back"] == 1.8  # r1: 11.041 - 11.0392
    assert split_p50s(rs, timings_by_id([{}])) == dict.fromkeys(got)
