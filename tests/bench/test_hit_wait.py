"""bench hit-wait: a hit's engine TTFT split into step wait and its own prefill step."""

from __future__ import annotations

import pytest

from bench.hit_wait import hit_wait, is_hit, table


def rec(engine_ms: float, prompt: int, cached: int, ttft_ms: float) -> dict:
    return {
        "ok": True, "ttft": ttft_ms / 1000, "prompt_tokens": prompt, "cached_tokens": cached,
        "engine_ttft_ms": engine_ms, "to_engine_ms": 1.0, "engine_parse_ms": 0.2,
        "engine_write_ms": 0.3, "back_ms": 0.5, "reason": "balanced",
    }


def test_the_wait_is_what_the_prefill_step_does_not_explain() -> None:
    # 70B profile: a step is 15 ms + 79 us a prefilled token; 200 uncached tokens = 30.8 ms
    hits = [rec(30.8 + w, 2200, 2000, 33.0 + w) for w in (1.0, 5.0, 9.0, 13.0)]
    miss = rec(190.0, 2200, 0, 192.0)
    f = hit_wait([*hits, miss, {"ok": False}])
    assert f["requests"] == 5 and f["hits"] == 4
    assert f["miss_share"] == pytest.approx(0.2)
    assert f["hit_uncached_tokens_p50"] == 200
    assert f["hit_step_ms_p50"] == pytest.approx(30.8)
    assert f["hit_wait_ms"]["p50"] == pytest.approx(9.0)
    assert f["hit_wait_ms"]["mean"] == pytest.approx(7.0)
    assert f["path_p50_ms"] == pytest.approx(2.0)
    assert "| x | 5 |" in table([("x", f)])


def test_a_hit_is_what_the_engine_counted_whatever_the_router_said() -> None:
    assert is_hit(rec(40, 2200, 1104, 42)) and not is_hit(rec(40, 2200, 1000, 42))
    assert not is_hit({"ok": True, "prompt_tokens": 0, "cached_tokens": 0})
    with pytest.raises(ValueError):
        hit_wait([{"ok": True, "ttft": 0.1}])  # no simulator timing: run with --requests-out
