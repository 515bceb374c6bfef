"""bench/suite.py's pure parts: a pair's row over repeated runs, and the acceptance checks."""

from __future__ import annotations

from bench.suite import checks, pair_row


def _run(router: str, workload: str, ttft: float, engine: float, hit: float = 0.84,
         imb: float = 1.2) -> dict:
    return {
        "workload": workload, "router": router, "replicas": 8, "rate": 24.0, "seconds": 90.0,
        "engine_hit_rate": hit, "oracle_hit_rate": 0.86, "ttft_p50_ms": ttft,
        "ttft_p90_ms": ttft * 2, "ttft_p99_ms": ttft * 4, "engine_ttft_p50_ms": engine,
        "imbalance": imb, "errors": 0, "per_replica_requests": [10, 12],
        "measured_at": "2026-12-04 14:00 UTC",
    }


def test_one_run_is_itself():
    row = pair_row([_run("prefix", "system-prompts", 45.0, 43.0)], "cmd", "m")
    assert row["ttft_p50_ms"] == 45.0 and "repeats" not in row and "runs" not in row
    assert row["command"] == "cmd" and row["machine"] == "m"


def test_repeats_give_medians_spreads_and_every_run():
    runs = [_run("prefix", "system-prompts", t, 40.0 + i, imb=1.1 + i / 10)
            for i, t in enumerate((47.0, 44.0, 45.0))]
    row = pair_row(runs, "cmd", "m")
    assert row["repeats"] == 3 and len(row["runs"]) == 3
    assert row["ttft_p50_ms"] == 45.0
    assert (row["ttft_p50_ms_min"], row["ttft_p50_ms_max"]) == (44.0, 47.0)
    assert row["imbalance"] == 1.2 and row["engine_ttft_p50_ms"] == 41.0
    assert [r["repeat"] for r in row["runs"]] == [1, 2, 3]
    assert row["workload"] == "system-prompts" and row["router"] == "prefix"


def test_checks_judge_medians_and_show_per_round_ratios():
    p = pair_row([_run("prefix", "system-prompts", t, 42.0) for t in (44.0, 47.0, 45.0)],
                 "c", "m")
    rr = pair_row([_run("round-robin", "system-prompts", t, 190.0, hit=0.47)
                   for t in (200.0, 196.0, 198.0)], "c", "m")
    got = {name: (text, ok) for name, text, ok in checks([p, rr], None)}
    text, ok = got["system-prompts: prefix TTFT p50 <= 0.23 x round-robin"]
    assert ok is True  # 45 / 198 = 0.227
    assert text.startswith("45.0 (44.0-47.0) / 198.0 (196.0-200.0) ms = 0.227")
    # per round: 44/200 = 0.220, 47/196 = 0.240, 45/198 = 0.227
    assert text.endswith("(per round 0.220-0.240)")
    assert got["system-prompts: prefix engine hit rate >= 0.80"] == ("0.840 (0.840-0.840)", True)
    slow = pair_row([_run("prefix", "system-prompts", t, 42.0) for t in (46.0, 47.0, 45.0)],
                    "c", "m")
    got = {name: ok for name, _, ok in checks([slow, rr], None)}
    assert got["system-prompts: prefix TTFT p50 <= 0.23 x round-robin"] is False  # 46/198


def test_split_medians_merge_key_by_key_and_show_as_a_diagnostic():
    def with_split(run: dict, to: float, back: float) -> dict:
        return {**run, "ttft_split_p50_ms": {"to_engine": to, "engine_parse": 0.1,
                                             "engine_ttft": 40.0, "engine_write": 0.2,
                                             "back": back}}

    p = pair_row([with_split(_run("prefix", "system-prompts", 45.0, 42.0), to, 0.4)
                  for to in (1.2, 1.4, 1.3)], "c", "m")
    assert p["ttft_split_p50_ms"]["to_engine"] == 1.3
    rr = pair_row([with_split(_run("round-robin", "system-prompts", 190.0, 188.0, hit=0.47),
                              1.25, 0.7)], "c", "m")
    rows = {c[0]: c[1] for c in checks([p, rr], None)}
    text = next(v for k, v in rows.items() if k.startswith("(diagnostic) the rest"))
    assert text == "prefix 1.30 + 0.30 + 0.40; round-robin 1.25 + 0.30 + 0.70"
