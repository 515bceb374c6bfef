"""bench/results/overhead/README.md: the router overhead table, from the JSON files that
`python -m bench overhead-all` writes (one per router). `readme` is pure; `load` and
`write_readme` are the file edges.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .compare import md_table

# The settings a row was measured with; rows of different settings are not comparable.
SETTINGS = ("rate", "seconds", "seed", "clients", "max_seconds")


def _num(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pair(row: Mapping[str, Any], a: str, b: str) -> str:
    return f"{_num(row.get(a))} / {_num(row.get(b))}"


def _notes(row: Mapping[str, Any]) -> str:
    if row.get("error"):
        # a pipe would end the table's cell
        return "not measured: " + " ".join(str(row["error"]).split()).replace("|", "/")
    notes = []
    failed = (row.get("errors") or 0) + (row.get("max_errors") or 0)
    if failed or row.get("direct_errors"):
        notes.append(
            f"{row.get('errors') or 0} open-loop + {row.get('max_errors') or 0} closed-loop "
            f"requests failed ({row.get('direct_errors') or 0} direct)"
        )
    if row.get("redis_rss_mb") is not None:
        notes.append(f"redis-server {_num(row['redis_rss_mb'], 1)} MB besides")
    if (row.get("processes") or 1) > 1:
        notes.append(f"RSS of {row['processes']} processes")
    return "; ".join(notes)


def _ordered(rows: Iterable[Mapping[str, Any]], order: Sequence[str]) -> list[Mapping[str, Any]]:
    rank = {r: i for i, r in enumerate(order)}
    return sorted(rows, key=lambda r: (rank.get(r["router"], len(rank)), r["router"]))


def overhead_table(rows: Iterable[Mapping[str, Any]], order: Sequence[str] = ()) -> str:
    """One line per router: what it adds to the p50 and p99 of a direct call, its max req/s,
    its RSS after the run and at its peak; the reason where it was not measured."""
    body = []
    for r in _ordered(rows, order):
        body.append(
            [
                r["router"],
                r.get("version") or "-",
                _num(r.get("added_p50_ms")),
                _num(r.get("added_p99_ms")),
                _pair(r, "direct_p50_ms", "direct_p99_ms"),
                _pair(r, "routed_p50_ms", "routed_p99_ms"),
                _num(r.get("max_rps"), 0),
                _num(r.get("rss_mb"), 1),
                _num(r.get("peak_rss_mb"), 1),
                _notes(r),
            ]
        )
    return md_table(
        [
            "router",
            "version",
            "added p50 ms",
            "added p99 ms",
            "direct p50 / p99 ms",
            "via router p50 / p99 ms",
            "max req/s",
            "RSS MB",
            "peak RSS MB",
            "notes",
        ],
        body,
    )


def settings_table(rows: Iterable[Mapping[str, Any]], order: Sequence[str] = ()) -> str:
    body = []
    for r in _ordered(rows, order):
        settings = r.get("settings") or []
        body.append(
            [
                r["router"],
                r.get("kind") or "-",
                r.get("version") or "-",
                "`" + " ".join(map(str, settings)) + "`" if settings else "-",
                r.get("settings_source") or "-",
            ]
        )
    return md_table(["router", "kind", "version", "settings", "documented in"], body)


def readme(rows: Sequence[Mapping[str, Any]], order: Sequence[str] = ()) -> str:
    """The whole README.md for `rows` (the per-router JSON objects), routers in `order`."""
    lines = [
        "# Router overhead: ours and the anchor routers (issue 5)",
        "",
        "Written by `python -m bench overhead-all` (`--report`: only this file, from the JSON",
        "files beside it, one per router). Method, in `bench/overhead.py`: ONE `engine-sim`",
        "with profile `zero` (no simulated time: an answer is the simulator's HTTP round trip)",
        "and each router in turn in front of it, no other router of the run started at the",
        "time. Per router: the simulator is reset, the router started, both paths",
        "warmed for 2 s; then the open loop (Poisson arrivals, non-streaming `/v1/completions`,",
        "`max_tokens` 1, prompts of 64-256 bytes) straight to the simulator and right after it",
        "the same arrivals and bodies (same seed) through the router, so a drift of the host",
        "between routers cancels out. Added p50 / p99: the router's percentile minus the direct",
        "one's (a difference of percentiles). Max req/s: answered requests per second through",
        "the router with a closed loop of concurrent clients (each sends its next request when",
        "its last is answered), the same bodies for every router. RSS / peak RSS: VmRSS and",
        "VmHWM of the router's process (its process tree) from /proc after the run.",
        "",
    ]
    if not rows:
        return "\n".join([*lines, "No results yet.", ""])
    kinds = {tuple(r.get(k) for k in SETTINGS) for r in rows}
    first = rows[0]
    if len(kinds) == 1:
        lines += [
            f"Open loop {first.get('rate'):g} req/s for {first.get('seconds'):g} s (seed "
            f"{first.get('seed')}); closed loop {first.get('clients')} clients for "
            f"{first.get('max_seconds'):g} s.",
            "",
        ]
    else:
        lines += [
            "**Rows measured with different settings (not comparable):** "
            + "; ".join(
                f"{r['router']}: " + ", ".join(f"{k} {r.get(k)}" for k in SETTINGS)
                for r in _ordered(rows, order)
            ),
            "",
        ]
    commands = sorted({r["command"] for r in rows if r.get("command")})
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    stamps = sorted(r["measured_at"] for r in rows if r.get("measured_at"))
    directs = sorted({r["direct_max_rps"] for r in rows if r.get("direct_max_rps") is not None})
    lines += [f"- Command: `{c}`" for c in commands]
    if machines:
        lines.append(f"- Machine: {'; '.join(machines)}.")
    if stamps:
        span = stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} to {stamps[-1]}"
        lines.append(f"- Measured: {span}.")
    if directs:
        lines.append(
            "- The simulator alone, same closed loop: "
            + ", ".join(f"{_num(d, 0)}" for d in directs)
            + " req/s."
        )
    lines += [
        "",
        overhead_table(rows, order),
        "",
        "Read with care:",
        "",
        "- The machine has 2 cores, shared by the router, the simulator and the load",
        "  generator: max req/s is what one router reaches beside them, not on a core of its",
        "  own; the Rust anchors' multi-threaded runtimes compete with the other two as well.",
        "- vllm-router `cache_aware` posts the request to every worker's `/v1/completions/render`",
        "  before forwarding it (bench/results/anchors/NOTES.md): one extra simulator round trip",
        "  per request here (one worker), N in a fleet of N. It is part of what it adds.",
        "- The anchors run in their Python launcher's process (the Rust router is an extension",
        "  module), so their RSS includes that interpreter, as ours includes CPython's.",
        "- `prefix-redis`: the RSS is the router's alone; the redis-server's is in the notes.",
        "  The RSS of our table holding 1,000,000 ownership entries is `bench overhead`'s",
        "  (bench/results/overhead.json), not measured here.",
        "",
        "## Versions and settings",
        "",
        settings_table(rows, order),
        "",
    ]
    return "\n".join(lines)


def load(d: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]


def write_readme(d: Path, order: Sequence[str] = ()) -> Path:
    path = d / "README.md"
    d.mkdir(parents=True, exist_ok=True)
    path.write_text(readme(load(d), order))
    return path
