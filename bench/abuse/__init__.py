"""`python -m bench abuse`: hostile clients, slow clients and sick engines against one router
(local store, then Redis; run.py), judged here into bars and bench/results/abuse/README.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.report import md_table

OUT = Path("bench/results/abuse")
RSS_BUDGET_MB = 512.0  # the router's memory limit the CRD sets by default
HEALTHZ_P99_MS = 100.0  # issue 23: /healthz within 100 ms while large bodies come


def counts(c: Mapping[str, int]) -> str:
    """`400 x12, closed x3`: the most frequent first."""
    return ", ".join(f"{k} x{v}" for k, v in Counter(c).most_common())


def by_class(r: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The attack's outcomes by class: tried, statuses, cases off (a status not allowed)..."""
    out: dict[str, dict[str, Any]] = {}
    for o in r["outcomes"]:
        g = out.setdefault(o["cls"], {"tried": 0, "statuses": Counter(), "off": Counter(),
                                      "5xx": 0, "problems": Counter(), "notes": Counter(),
                                      "known": Counter()})
        g["tried"] += 1
        g["statuses"][o["status"]] += 1
        g["off"].update([f"{o['case']}: {o['status']}"] * (not o["met"]))
        g["5xx"] += o["status"].startswith("5")
        g["problems"].update(o["problems"])
        g["notes"].update(o["notes"])
        g["known"].update([o["case"]] * bool(o.get("known")))  # rounds before it: none
    return out


def bars(r: Mapping[str, Any]) -> list[tuple[str, str, bool, bool]]:
    """(bar, measured, met, must): the must bars are what the command exists to show."""
    classes, load, f = by_class(r).values(), r["load"].values(), r["faults"]
    five, tried = sum(c["5xx"] for c in classes), sum(c["tried"] for c in classes)
    problems, off, known = (sum((c[k] for c in classes), Counter())
                            for k in ("problems", "off", "known"))
    rt, log, hz = r["router"], r["log"], r["healthz"]
    failed, load5 = sum(p["failed"] for p in load), sum(p["five_xx"] for p in load)
    peak, index = rt["after"]["peak_rss_mb"], r["index"]
    return [
        ("no 5xx answered to the attack", f"{five} of {tried}", five == 0, True),
        ("no 5xx to the faults' load but from a hung engine (504 by design)", str(load5),
         load5 == 0, True),
        ("no traceback in the router's log", str(log["tracebacks"]), log["tracebacks"] == 0, True),
        (f"router peak RSS within {RSS_BUDGET_MB:g} MB (the CRD's memory limit)",
         f"{peak} MB (before {rt['before']['rss_mb']}, after {rt['after']['rss_mb']}); open "
         f"descriptors {rt['before']['fds']} before, {hz['most_fds']} at most, "
         f"{rt['after']['fds']} after", peak <= RSS_BUDGET_MB, True),
        (f"/healthz p99 within {HEALTHZ_P99_MS:g} ms under the attack, none failed",
         f"p50 {hz['p50_ms']}, p99 {hz['p99_ms']}, max {hz['max_ms']} ms; {hz['failures']} "
         "failed", (hz["p99_ms"] or 1e9) <= HEALTHZ_P99_MS and hz["failures"] == 0, False),
        ("no ERROR line in the router's log, no client bytes (the markers in every prompt and "
         "header trick)", f"{log['error_lines']} ERROR lines, the markers {log['markers']} times",
         log["error_lines"] == log["markers"] == 0, False),
        ("every answer keeps the contract (no routing header, engine address, server version, "
         "traceback; slow clients closed in time; at the engine as it should be)",
         counts(problems) or "0", not problems, False),
        ("every case answered as it should", counts(off) or "all", not off, False),
        ("the known exception, counted apart: requests aiohttp's HTTP parser refuses get "
         "aiohttp's own text/plain 400 naming its version (no public hook; "
         "docs/router-http.md)", counts(known) or "none", True, False),
        ("no client made the router connect to another host (CONNECT, absolute URI, Host)",
         f"{r['canary_connections']} connections", r["canary_connections"] == 0, False),
        ("the index within its memory budget", f"{index['entries']:.0f} entries, bound "
         f"{index['bound']}", index["entries"] <= index["bound"], False),
        ("faults (engine hung, engine killed, Redis killed), each seen by the router and undone:"
         " no other request failed", "; ".join(f"{k}: seen in {v['seen_s']} s, undone in "
                                              f"{v['back_s']} s" for k, v in f.items())
         + f"; {failed} failed", failed == 0, False),
    ]


def render(rounds: Sequence[Mapping[str, Any]], stamp: Mapping[str, str]) -> str:
    verdicts = [{bar: (m, ok, must) for bar, m, ok, must in bars(r)} for r in rounds]
    lines = [
        "# Abuse: hostile clients and sick engines against one router", "",
        "Written by `python -m bench abuse` from the JSON beside it; what the failures are, and "
        "why, is in [FINDINGS.md](FINDINGS.md).", "",
        f"Command: `{stamp['command']}`  ",
        f"Machine: {stamp['machine']}, host `{stamp['host']}`; code: {stamp['version']}  ",
        *(f"{r['store']} store: started {r['started']}  " for r in rounds), "",
        "Each round: 3 engine simulators (profile fast, max_model_len 32768) behind the tap "
        "(bench/abuse/tap.py), one `prefix-router` with its defaults but for "
        f"`{rounds[0]['settings']}`. The attack: the cases of bench/abuse/cases.py, class by "
        "class, with slow clients and 800 silent connections all the while, /healthz asked "
        "every 50 ms; then the faults under ordinary load (8 req/s, half streamed). `closed`: "
        "the router ended the connection unanswered; `left`: the client left on purpose.", "",
        "## Bars", "",
        *md_table(["bar", *(r["store"] for r in rounds)], [
            [("**must** " if any(v[b][2] for v in verdicts if b in v) else "") + b, *(
                f"{'yes' if v[b][1] else '**no**'}: {v[b][0]}" if b in v else "-"
                for v in verdicts)] for b in dict.fromkeys(b for v in verdicts for b in v)])]
    for r in rounds:
        log = r["log"]
        lines += ["", f"## {r['store']} store", "", *md_table(
            ["class", "tried", "statuses", "5xx", "cases off", "problems", "notes"],
            [[k, g["tried"], counts(g["statuses"]), g["5xx"], counts(g["off"]),
              counts(g["problems"]), counts(g["notes"])] for k, g in by_class(r).items()]), "",
            *md_table(["faults' load", "sent", "whole", "failed as the fault allows", "failed",
                       "statuses"], [[k, sum(p["statuses"].values()), p["whole"], p["allowed"],
                                      p["failed"], counts(p["statuses"])]
                                     for k, p in r["load"].items()]),
            "", f"The router's log: {log['lines']} lines, {log['tracebacks']} tracebacks, "
            f"{log['error_lines']} ERROR lines", *log["first_errors"]]
    return "\n".join(lines) + "\n"


def register(sub: Any) -> None:
    p = sub.add_parser("abuse", help="hostile clients, slow clients, sick engines vs one router")
    p.add_argument("--stores", nargs="+", choices=("local", "redis"), default=["local", "redis"])
    p.add_argument("--out", default=str(OUT), help=f"results folder (default {OUT})")
    p.add_argument("--logs", help="where the processes' logs go (default: a temporary folder)")
    p.add_argument("--report", action="store_true", help="only rebuild the README from its JSON")


def main(args: argparse.Namespace, command: str) -> None:
    from bench.provenance import stamp

    out = Path(args.out)
    if args.report:
        rounds = [json.loads((out / f"{s}.json").read_text()) for s in ("local", "redis")
                  if (out / f"{s}.json").exists()]
        meta = json.loads((out / "stamp.json").read_text())
    else:
        from .run import run_round

        logs = Path(args.logs or tempfile.mkdtemp(prefix="abuse-"))
        print(f"abuse: logs in {logs}; stores {', '.join(args.stores)}", flush=True)
        rounds = [asyncio.run(run_round(store, logs)) for store in args.stores]
        meta = {**stamp(command), "host": socket.gethostname()}
        out.mkdir(parents=True, exist_ok=True)
        for name, data in [*((r["store"], r) for r in rounds), ("stamp", meta)]:
            (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "README.md").write_text(render(rounds, meta))
    verdicts = [(r["store"], *bar) for r in rounds for bar in bars(r)]
    for store, bar, measured, ok, must in verdicts:
        print(f"{store}: {'ok ' if ok else 'NO '}{'(must) ' if must else ''}{bar}: {measured}")
    print(f"written: {out / 'README.md'}")
    if not all(ok for *_b, ok, must in verdicts if must):
        sys.exit(1)
