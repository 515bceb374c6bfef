"""The abuse run's bars and README, from its rounds' JSON (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.report import md_table

RSS_BUDGET_MB = 512.0  # the router's memory limit the CRD sets by default
HEALTHZ_P99_MS = 100.0  # issue 23: /healthz within 100 ms while large bodies come
Round = Mapping[str, Any]


def counts(c: Mapping[str, int]) -> str:
    """`400 x12, closed x3`: the most frequent first."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def grouped(r: Round, key: Callable[[Mapping[str, Any]], str]) -> dict[str, dict[str, Any]]:
    """The attack's outcomes by `key`: tried, statuses, off (not allowed), 5xx, problems, notes."""
    out: dict[str, dict[str, Any]] = {}
    for o in r["outcomes"]:
        g = out.setdefault(key(o), {"tried": 0, "statuses": Counter(), "off": 0, "5xx": 0,
                                    "problems": Counter(), "notes": Counter()})
        g["tried"] += 1
        g["statuses"][o["status"]] += 1
        g["off"] += not o["met"]
        g["5xx"] += o["status"].startswith("5")
        g["problems"].update(o["problems"])
        g["notes"].update(o["notes"])
    return out


def bars(r: Round) -> list[tuple[str, str, bool, bool]]:
    """(bar, measured, met, must): the must bars are what the command exists to show."""
    classes, cases = grouped(r, lambda o: o["cls"]).values(), grouped(r, lambda o: o["case"])
    five, tried = sum(c["5xx"] for c in classes), sum(c["tried"] for c in classes)
    problems = sum((c["problems"] for c in classes), Counter())
    off = {name: c["off"] for name, c in cases.items() if c["off"]}
    load, f, rt, log, hz = r["load"].values(), r["faults"], r["router"], r["log"], r["healthz"]
    failed, load5 = sum(p["failed"] for p in load), sum(p["five_xx"] for p in load)
    peak, lost = rt["after"]["peak_rss_mb"], r["redis_lost_in_attack"]
    want = ["engine hung", "engine killed", *(["redis killed"] if lost is not None else [])]
    out = [
        ("no 5xx answered to the attack", f"{five} of {tried}", five == 0, True),
        ("no 5xx to the faults' load but from a hung engine (504 by design)", str(load5),
         load5 == 0, True),
        ("no traceback in the router's log", str(log["tracebacks"]), log["tracebacks"] == 0, True),
        (f"router peak RSS within {RSS_BUDGET_MB:g} MB (the CRD's memory limit)",
         f"{peak} MB (before {rt['before']['rss_mb']}, after {rt['after']['rss_mb']})",
         peak <= RSS_BUDGET_MB, True),
        (f"/healthz p99 within {HEALTHZ_P99_MS:g} ms under the attack, none failed",
         f"p50 {hz['p50_ms']}, p99 {hz['p99_ms']}, max {hz['max_ms']} ms; {hz['failures']} "
         "failed", (hz["p99_ms"] or 1e9) <= HEALTHZ_P99_MS and hz["failures"] == 0, False),
        ("no ERROR line in the router's log, no prompt bytes (the marker in every prompt)",
         f"{log['error_lines']} ERROR lines, the marker {log['prompt_marker']} times",
         log["error_lines"] == log["prompt_marker"] == 0, False),
        ("every answer keeps the contract (no routing header, engine address, server version, "
         "second answer; slow clients closed in time; at the engine as it should be)",
         counts(problems) or "0", not problems, False),
        ("every case answered as it should", counts(off) or "all", not off, False),
        ("nothing in flight once the clients left (router and engines)",
         f"drained in {r['drained_s']} s", r["drained_s"] is not None, False),
        ("the index within its memory budget", f"{r['index']['entries']:.0f} entries, bound "
         f"{r['index']['bound']}", r["index"]["entries"] <= r["index"]["bound"], False),
        ("faults (engine hung, engine killed, Redis killed): each seen by the router and undone,"
         " no other request failed", "; ".join(f"{k}: seen in {v['seen_s']} s, undone in {v.get('back_s')} s"
                             for k, v in f.items()) + f"; {failed} failed",
         all(f.get(k, {}).get("back_s") is not None for k in want) and failed == 0, False),
        ("the router alive at the end, exits 0 on SIGTERM", f"alive {rt['alive_at_end']}, exit "
         f"{rt['exit_code']}", rt["alive_at_end"] and rt["exit_code"] == 0, False),
    ]
    if lost is not None:
        out.append(("Redis not lost for the router through the attack (the pool big enough)",
                    f"lost {lost} times", lost == 0, False))
    if r["errors"]:
        out.append(("the run itself completed", "; ".join(r["errors"]), False, False))
    return out


def render(rounds: Sequence[Round], stamp: Mapping[str, str]) -> str:
    verdicts = [{bar: (m, ok, must) for bar, m, ok, must in bars(r)} for r in rounds]
    order = list(dict.fromkeys(bar for v in verdicts for bar in v))
    lines = [
        "# Abuse: hostile clients and sick engines against one router", "",
        "Written by `python -m bench abuse` from the JSON beside it (one file per store); what "
        "the failures are, and why, is in [FINDINGS.md](FINDINGS.md).", "",
        f"Command: `{stamp['command']}`  ",
        f"Machine: {stamp['machine']}, host `{stamp['host']}`; code: {stamp['version']}  ",
        *(f"{r['store']} store: started {r['started']}; load average before "
          f"{r['load_before'][0]:.2f}, after {r['load_after'][0]:.2f}  " for r in rounds), "",
        "Each round: 3 engine simulators (profile fast, max_model_len 32768), each behind the "
        "tap (bench/abuse/tap.py), and one `prefix-router` with its defaults but for:", "",
        "```yaml", *(f"{k}: {v}" for k, v in rounds[0]["settings"].items() if k != "discovery"),
        "```", "", "The attack: the cases of bench/abuse/cases.py, class by class, with slow "
        "clients and 800 silent connections all the while, /healthz asked every 50 ms; then "
        "the faults under ordinary load (8 req/s, half streamed). `closed`: the router ended "
        "the connection unanswered; `left`: the client left on purpose; `off`: answers the case "
        "does not allow.", "", "## Bars", "", *md_table(["bar", *(r["store"] for r in rounds)], [
            [("**must** " if any(v[b][2] for v in verdicts if b in v) else "") + b, *(
                f"{'yes' if v[b][1] else '**no**'}: {v[b][0]}" if b in v else "-"
                for v in verdicts)] for b in order])]
    for r in rounds:
        rt, log, cases = r["router"], r["log"], grouped(r, lambda o: f"{o['cls']}: {o['case']}")
        lines += ["", f"## {r['store']} store", "", *md_table(
            ["class", "tried", "statuses", "off", "5xx", "problems"],
            [[k, g["tried"], counts(g["statuses"]), g["off"], g["5xx"], sum(g["problems"].values())]
             for k, g in grouped(r, lambda o: o["cls"]).items()]), "", *md_table(
            ["case with problems or notes", "statuses", "problems", "notes"],
            [[k, counts(g["statuses"]), counts(g["problems"]), counts(g["notes"])]
             for k, g in cases.items() if g["problems"] or g["notes"]]), "", *md_table(
            ["faults' load", "sent", "whole", "failed as the fault allows", "failed", "statuses"],
            [[k, p["sent"], p["whole"], p["allowed"], p["failed"], counts(p["statuses"])]
             for k, p in r["load"].items()]), "", *md_table(
            ["router", "RSS MB", "open descriptors"],
            [["before the attack", rt["before"]["rss_mb"], rt["before"]["fds"]],
             ["peak (RSS: VmHWM; descriptors: the attack's)", rt["after"]["peak_rss_mb"],
              r["healthz"]["most_fds"]], ["after", rt["after"]["rss_mb"], rt["after"]["fds"]]]),
            "", f"The router's log: {log['lines']} lines, {log['tracebacks']} tracebacks, "
            f"{log['error_lines']} ERROR lines; the prompt marker {log['prompt_marker']} times, "
            f"the header/path marker {log['tag_marker']} times.",
            *(f"    {e}" for e in log["first_errors"])]
    return "\n".join(lines) + "\n"
