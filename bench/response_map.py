"""`python -m bench response-map`: the memory of the router's response map (response_ids.py)
holding N ids, and the RSS of a router process built as `python -m prefix_router` builds it
(settings, the app and its core) with its map full. Measured in a fresh child process each,
from its RSS before and after the ids go in (the ids are made on the fly, none kept)."""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .harness.fleet import memory_of
from .provenance import now_utc, stamp

OUT = Path("bench/results/api")


def _rss_mb() -> float:
    import os

    return memory_of(os.getpid())["rss_mb"]


def child(ids: int) -> dict[str, Any]:
    """In this process: a router app (not serving) whose map is filled with `ids` ids."""
    from prefix_router.app import CORE, build_app
    from prefix_router.config import RouterSettings

    backends = [f"http://198.18.0.{i}:8000" for i in range(1, 9)]
    settings = RouterSettings.model_validate(
        {"discovery": {"backends": backends}, "max_response_ids": ids}
    )
    app = build_app(settings)
    core = app[CORE]
    gc.collect()
    before = _rss_mb()
    t0 = time.perf_counter()
    for i in range(ids):
        # vLLM's ids: "resp_" and a uuid4's 32 hex digits
        core.responses.remember(f"resp_{i:032x}", backends[i % len(backends)])
    seconds = time.perf_counter() - t0
    gc.collect()
    after = _rss_mb()
    assert len(core.responses) == ids
    t0 = time.perf_counter()
    for i in range(0, ids, max(1, ids // 100_000)):
        assert core.responses.holder(f"resp_{i:032x}") == backends[i % len(backends)]
    lookups = min(ids, 100_000)
    return {
        "ids": ids,
        "rss_before_mb": before,
        "rss_after_mb": after,
        "map_mb": round(after - before, 1),
        "bytes_per_id": round((after - before) * 1024 * 1024 / ids, 1),
        "remember_us": round(seconds / ids * 1e6, 3),
        "holder_us": round((time.perf_counter() - t0) / lookups * 1e6, 3),
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("response-map", help="memory of the response id map with N ids, and "
                       "the router's RSS with it full")  # fmt: skip
    p.add_argument("--ids", type=int, default=1_000_000)
    p.add_argument("--out", default=str(OUT), help="results folder")
    p.add_argument("--name", default="response-map", help="the JSON's name in --out")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def main(args: argparse.Namespace, command: str) -> None:
    if args.child:
        print(json.dumps(child(args.ids)))
        return
    got = subprocess.run([sys.executable, "-m", "bench", "response-map", "--child", "--ids",
                          str(args.ids)], capture_output=True, text=True, check=True)  # fmt: skip
    result = {**stamp(command), "date": now_utc(), **json.loads(got.stdout)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
