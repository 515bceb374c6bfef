"""`python -m bench abuse`: hostile clients, slow clients and sick engines against one router
(local store, then Redis), and what it cost the router; writes bench/results/abuse/.
cases.py: the requests, as data; client.py: sends them, judges the answers; tap.py: what
reaches the engines, hangs one; run.py: one round; report.py: the bars and the README."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT = Path("bench/results/abuse")


def register(sub: Any) -> None:
    p = sub.add_parser("abuse", help="hostile clients, slow clients and sick engines against "
                       "one router (local and Redis stores): bench/results/abuse")
    p.add_argument("--stores", nargs="+", choices=("local", "redis"), default=["local", "redis"])
    p.add_argument("--out", default=str(OUT), help=f"results folder (default {OUT})")
    p.add_argument("--logs", help="where the processes' logs go (default: a temporary folder)")
    p.add_argument("--report", action="store_true", help="only rebuild the README from its JSON")


def main(args: argparse.Namespace, command: str) -> None:
    from bench.provenance import stamp

    from .report import bars, render

    out = Path(args.out)
    if args.report:
        rounds = [json.loads((out / f"{s}.json").read_text()) for s in ("local", "redis")
                  if (out / f"{s}.json").exists()]
        meta = json.loads((out / "stamp.json").read_text())
    else:
        from .run import run_all

        logs = Path(args.logs or tempfile.mkdtemp(prefix="abuse-"))
        print(f"abuse: logs in {logs}", flush=True)
        rounds = asyncio.run(run_all(args.stores, logs))
        meta = {**stamp(command), "host": socket.gethostname()}
        out.mkdir(parents=True, exist_ok=True)
        for r in rounds:
            (out / f"{r['store']}.json").write_text(json.dumps(r, indent=1) + "\n")
        (out / "stamp.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "README.md").write_text(render(rounds, meta))
    verdicts = [(r["store"], *bar) for r in rounds for bar in bars(r)]
    for store, bar, measured, ok, must in verdicts:
        print(f"{store}: {'ok ' if ok else 'NO '}{'(must) ' if must else ''}{bar}: {measured}")
    print(f"written: {out / 'README.md'}")
    if not all(ok for *_b, ok, must in verdicts if must):
        sys.exit(1)
