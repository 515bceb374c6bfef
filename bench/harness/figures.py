"""The figures of a step: the client's (of the requests it sent) beside the engines' (counter
deltas between snapshots of their /stats); and of a timeline of such windows. Pure."""

from collections.abc import Mapping, Sequence
from typing import Any

from .loadgen import Result, RunLog
from .stats import imbalance, ms, percentile, percentiles_ms, ratio

Snapshot = Mapping[str, Any]  # {"t": perf_counter, "stats": [each simulator's /stats]}


def _delta(after: Snapshot, before: Snapshot, key: str) -> list[int]:
    return [int(a.get(key, 0)) - int(b.get(key, 0))
            for a, b in zip(after["stats"], before["stats"], strict=True)]


def carried(snap: Snapshot, k: int, before_restart: Mapping[str, Any]) -> Snapshot:
    """`snap` with simulator k's counters from before its restart added to the new process's
    (which start at 0), so its deltas over the run are whole."""
    stats = [dict(s) for s in snap["stats"]]
    mine = stats[k]
    for key in ("requests", "prompt_tokens", "cached_tokens", "generation_tokens", "preemptions"):
        mine[key] = int(mine.get(key, 0)) + int(before_restart.get(key, 0))
    mine["ttft_s"] = [*before_restart.get("ttft_s", ()), *mine.get("ttft_s", ())]
    return {**snap, "stats": stats}


def step_figures(log: RunLog, before: Snapshot, after: Snapshot,
                 step_end: Snapshot | None = None) -> dict[str, Any]:
    """Client figures of `log`, engine figures between `before` and `after` (after the drain),
    the engines' output rate between `before` and `step_end` (default `after`)."""
    end = step_end or after
    ok = [r for r in log.results if r.ok]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    prompt, cached = _delta(after, before, "prompt_tokens"), _delta(after, before, "cached_tokens")
    served = _delta(after, before, "requests")
    # the engines' own TTFTs (arrival to first token) between the snapshots
    engine = [t for a, b in zip(after["stats"], before["stats"], strict=True)
              for t in a.get("ttft_s", ())[len(b.get("ttft_s", ())):]]
    window = end["t"] - before["t"]
    wall = log.finished - log.started
    out = {
        "requests_sent": len(log.sent),
        "requests_ok": len(ok),
        "errors": sum(1 for r in log.results if not r.ok),
        "unfinished": len(log.sent) - len(log.results),  # when the drain ended
        "unsent": log.planned - len(log.sent),  # turns after a failed turn
        "engine_hit_rate": ratio(sum(cached), sum(prompt)) or 0.0,
        # of those, the tokens loaded from the simulators' CPU tiers (--kv-offloading-tokens)
        "engine_cpu_hit_rate": ratio(sum(_delta(after, before, "cpu_cached_tokens")),
                                     sum(prompt)) or 0.0,
        **percentiles_ms([r.ttft for r in ok if r.ttft is not None]),
        "e2e_p50_ms": ms(percentile(e2es, 50)),
        "e2e_p99_ms": ms(percentile(e2es, 99)),
        # the client's TTFT less router, network and client
        **percentiles_ms(engine, "engine_ttft"),
        "engine_ttft_mean_ms": ms(sum(engine) / len(engine)) if engine else None,
        "throughput_rps": round(len(ok) / wall, 3) if wall > 0 else 0.0,
        "output_tokens_per_s": round(sum(_delta(end, before, "generation_tokens")) / window, 1)
        if window > 0 else 0.0,
        "imbalance": round(imbalance(served) or 0.0, 3),
        # requests preempted (recomputed later) for want of KV blocks
        "preemptions": sum(_delta(after, before, "preemptions")),
        "per_replica_requests": served,
        "per_replica_hit_rate": [ratio(c, p, 3) or 0.0
                                 for c, p in zip(cached, prompt, strict=True)],
        "queued_at_end": sum(int(s.get("waiting", 0)) for s in end["stats"]),
        "first_errors": sorted({r.error for r in log.results if not r.ok})[:3],
    }
    e, t = out.get("engine_ttft_p50_ms"), out.get("ttft_p50_ms")
    out["path_p50_ms"] = round(t - e, 2) if e is not None and t is not None else None
    return out


def router_figures(after: Mapping[str, Any], before: Mapping[str, Any], sent: int,
                   redis_calls: int | None) -> dict[str, Any]:
    """Our routers' view of the step (engines.router_figures before and after it)."""

    def d(name: str) -> float:
        return after["counters"].get(name, 0.0) - before["counters"].get(name, 0.0)

    out: dict[str, Any] = {
        "decisions": {k: v - before["decisions"].get(k, 0.0)
                      for k, v in after["decisions"].items()},
        "router_predicted_hit_rate": ratio(d("prefix_router_predicted_cached_tokens_total"),
                                           d("prefix_router_prompt_tokens_total")),
        "engine_reported_hit_rate": ratio(d("prefix_router_reported_cached_tokens_total"),
                                          d("prefix_router_reported_prompt_tokens_total")),
        # answers whose cached tokens missed the prediction by a block or more (over: less)
        "index_corrections_over": int(d(
            'prefix_router_index_corrections_total{direction="over"}')),
        "index_corrections_under": int(d(
            'prefix_router_index_corrections_total{direction="under"}')),
        "prediction_error_mean_tokens": ratio(
            d("prefix_router_cache_prediction_error_tokens_sum"),
            d("prefix_router_cache_prediction_error_tokens_count"), 1),
    }
    if redis_calls is not None and sent:
        # slow lookups: over the budget, routed on the local table
        out.update({f"redis_{k}": round(v / sent, 4) for k, v in (
            ("round_trips_per_request", d('prefix_router_store_round_trips{kind="request"}')),
            ("timer_round_trips_per_request", d('prefix_router_store_round_trips{kind="timer"}')),
            ("commands_per_request", redis_calls),
            ("slow_lookup_share", d("prefix_router_store_slow_lookups")))})
    return out


def time_to_share(series: Sequence[Mapping[str, Any]], join_at: float,
                  share: float) -> float | None:
    """Seconds from the join to the first window where the new replicas served `share`."""
    return next((round(w["t"] - join_at, 1) for w in series
                 if w["t"] > join_at and w["new_share"] >= share), None)


def after_join(series: Sequence[Mapping[str, Any]], join_at: float,
               span: float) -> dict[str, float | None]:
    """Means over the windows that end within `span` seconds after the join."""
    ws = [w for w in series if join_at < w["t"] <= join_at + span]
    if not ws:
        return {}
    ttfts = [w["ttft_p50_ms"] for w in ws if w["ttft_p50_ms"] is not None]
    return {
        "after_join_hit_rate": round(sum(w["hit_rate"] for w in ws) / len(ws), 4),
        "after_join_new_share": round(sum(w["new_share"] for w in ws) / len(ws), 4),
        "after_join_ttft_p50_ms": round(sum(ttfts) / len(ttfts), 1) if ttfts else None,
    }


def recovery_seconds(series: Sequence[Mapping[str, Any]], kill_at: float, restart_at: float,
                     frac: float = 0.9) -> float | None:
    """Seconds from `restart_at` to the first window whose hit rate is back to `frac` x the
    mean before the kill (None if it never is); the first 10 s are a cold start."""
    before = [w["hit_rate"] for w in series if 10.0 <= w["t"] <= kill_at]
    if not before:
        return None
    level = frac * sum(before) / len(before)
    return next((round(w["t"] - restart_at, 1) for w in series
                 if w["t"] > restart_at and w["hit_rate"] >= level), None)


def window_ttfts(series: list[dict[str, Any]], results: Sequence[Result], started: float,
                 sample_s: float) -> None:
    """Each window's TTFT p50, of the requests sent in it (by the client's own clock)."""
    by: dict[float, list[float]] = {}
    for r in results:
        if r.ok and r.ttft is not None:
            at = r.sent_at - started
            for w in series:
                if w["t"] - sample_s < at <= w["t"]:
                    by.setdefault(w["t"], []).append(r.ttft)
                    break
    for w in series:
        w["ttft_p50_ms"] = ms(percentile(by.get(w["t"], []), 50))
