"""`python -m bench hit-wait`: where a cache hit's time to first token goes, from `--requests-out`.

A hit's engine TTFT (arrival at the simulator to its first token) is the wait for the engine
step in progress to end, then one step that prefills its uncached tokens:
    engine TTFT = wait + step_base + prefill_per_token x uncached + (context read, co-prefill)
so the wait is read off each hit as engine TTFT - step_base - prefill_per_token x uncached,
with the profile's own numbers (sim/engine_sim/profiles.py). The rest of the client's TTFT is
the path (client, router, network: `to_engine` + `engine_parse` + `engine_write` + `back` of
`bench run`'s split). A hit is what the engine counted as one (it held half the prompt or
more), whichever router sent it; the share of the rest bounds how far down the median can
go. Pure arithmetic over the files: no process runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine_sim.profiles import PROFILES

PATH_PARTS = ("to_engine_ms", "engine_parse_ms", "engine_write_ms", "back_ms")


def _q(xs: Sequence[float], p: float) -> float:
    return xs[min(int(len(xs) * p), len(xs) - 1)]


def _uncached(r: dict[str, Any]) -> int:
    return r["prompt_tokens"] - (r.get("cached_tokens") or 0)


def is_hit(r: dict[str, Any]) -> bool:
    """A hit as the engine counted it (whatever the router said): it held at least half of
    the prompt, so what is left to prefill is the request's own part."""
    prompt = r.get("prompt_tokens") or 0
    return prompt > 0 and (r.get("cached_tokens") or 0) >= prompt / 2


def hit_wait(records: Iterable[dict[str, Any]], profile: str = "llama-3.1-70b-h100") -> dict:
    """Figures (ms) of one run's requests, each a `--requests-out` line."""
    prof = PROFILES[profile]
    ok = [r for r in records if r.get("ok") and r.get("engine_ttft_ms") is not None]
    if not ok:
        raise ValueError("no request with the simulators' timing (run with --requests-out)")
    hits = [r for r in ok if is_hit(r)]
    uncached = sorted(_uncached(r) for r in hits)
    step_ms = 1000 * prof.step_base_s
    per_token_ms = 1000 * prof.prefill_per_token_s
    waits = sorted(r["engine_ttft_ms"] - step_ms - per_token_ms * _uncached(r) for r in hits)
    ttft = sorted(1000 * r["ttft"] for r in ok)
    path = sorted(sum(r[k] for k in PATH_PARTS) for r in ok)
    out: dict[str, Any] = {
        "requests": len(ok),
        "ttft_p50_ms": round(_q(ttft, 0.5), 2),
        "engine_ttft_p50_ms": round(_q(sorted(r["engine_ttft_ms"] for r in ok), 0.5), 2),
        "path_p50_ms": round(_q(path, 0.5), 2),
        "miss_share": round(1 - len(hits) / len(ok), 4),
        "hits": len(hits),
    }
    if hits:
        out["hit_uncached_tokens_p50"] = _q(uncached, 0.5)
        out["hit_step_ms_p50"] = round(step_ms + per_token_ms * _q(uncached, 0.5), 2)
        out["hit_wait_ms"] = {
            f"p{int(100 * p)}": round(_q(waits, p), 2) for p in (0.1, 0.25, 0.5, 0.75, 0.9)
        }
        out["hit_wait_ms"]["mean"] = round(sum(waits) / len(waits), 2)
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(named: list[tuple[str, dict]]) -> str:
    head = (
        "| run | requests | TTFT p50 | engine TTFT p50 | path p50 | misses | hit uncached "
        "tokens p50 | its prefill step | hit wait p10 / p25 / p50 / p75 / p90 (mean) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for name, f in named:
        w = f.get("hit_wait_ms", {})
        rows.append(
            f"| {name} | {f['requests']} | {f['ttft_p50_ms']} | {f['engine_ttft_p50_ms']} | "
            f"{f['path_p50_ms']} | {f['miss_share']:.1%} | "
            f"{f.get('hit_uncached_tokens_p50', '-')} | {f.get('hit_step_ms_p50', '-')} | "
            + (
                " / ".join(str(w[k]) for k in ("p10", "p25", "p50", "p75", "p90"))
                + f" ({w['mean']})"
                if w
                else "-"
            )
            + " |"
        )
    return "\n".join([head, *rows])


def main(files: list[str], profile: str) -> str:
    return table([(Path(f).stem, hit_wait(read_jsonl(Path(f)), profile)) for f in files])
