"""The abuse run's figures and verdicts, from its rounds' JSON (pure): what was tried by class,
what came back, the bars and whether each held, and the README that shows them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.report import md_table

RSS_BUDGET_MB = 512.0  # the router's memory limit the CRD sets by default
HEALTHZ_MAX_MS = 2000.0  # a liveness probe's timeout in the chart
HEALTHZ_P99_MS = 100.0  # issue 23's figure for /healthz under large bodies


def is_5xx(status: object) -> bool:
    s = str(status)
    return len(s) == 3 and s.isdigit() and s[0] == "5"


def statuses(counts: Mapping[str, int]) -> str:
    """`400 x12, closed x3`: most frequent first."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                   kv[0])))


def by_case(outcomes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: how often tried, its statuses, how many missed what the case allows,
    its problems and notes (counted), its longest time."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for o in outcomes:
        r = rows.setdefault((o["cls"], o["case"]), {
            "cls": o["cls"], "case": o["case"], "tried": 0, "statuses": Counter(),
            "unmet": 0, "problems": Counter(), "notes": Counter(), "max_seconds": 0.0})
        r["tried"] += 1
        r["statuses"][o["status"]] += 1
        r["unmet"] += 0 if o["met"] else 1
        r["problems"].update(o["problems"])
        r["notes"].update(o["notes"])
        r["max_seconds"] = max(r["max_seconds"], o["seconds"])
    return list(rows.values())


def by_class(outcomes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for c in by_case(outcomes):
        r = rows.setdefault(c["cls"], {"cls": c["cls"], "cases": 0, "tried": 0,
                                       "statuses": Counter(), "unmet": 0, "problems": 0,
                                       "five_xx": 0})
        r["cases"] += 1
        r["tried"] += c["tried"]
        r["statuses"].update(c["statuses"])
        r["unmet"] += c["unmet"]
        r["problems"] += sum(n for p, n in c["problems"].items() if "from the router" not in p)
        r["five_xx"] += sum(n for s, n in c["statuses"].items() if is_5xx(s))
    return list(rows.values())


def bars(r: Mapping[str, Any]) -> list[tuple[str, str, bool, bool]]:
    """(bar, measured, held, must): `must` are the three the command exists to show."""
    cases = by_case(r["outcomes"])
    five = sum(n for c in cases for s, n in c["statuses"].items() if is_5xx(s))
    load = r["faults"].get("load", {})
    lfail = sum(p["failures"] for p in load.values())
    l5 = sum(p["five_xx"] for p in load.values())
    l5_allowed = sum(n for p in load.values() for s, n in p["statuses"].items()
                     if is_5xx(s.split()[0])) - l5
    log = r["log"]
    rt = r["router"]
    hz = r["healthz"]
    attack, faults = hz.get("attack", {}), hz.get("faults", {})
    problems = Counter(p for c in cases for p, n in c["problems"].items()
                       for _ in range(n) if "from the router" not in p)
    unmet = [c for c in cases if c["unmet"]]
    hz_max = max((v.get("max_ms") or 0 for v in hz.values()), default=0)
    hz_fail = sum(v.get("failures", 0) for v in hz.values())
    fault = r["faults"]
    out = [
        ("no 5xx answered to the attack", f"{five} of {sum(c['tried'] for c in cases)}",
         five == 0, True),
        ("no 5xx to the faults' load but where the engine took the request and hung (504 by "
         "design)", f"{l5} ({l5_allowed} allowed)", l5 == 0, True),
        ("no traceback in the router's log", str(log["tracebacks"]), log["tracebacks"] == 0,
         True),
        (f"router peak RSS within {RSS_BUDGET_MB:g} MB (the CRD's memory limit)",
         f"{rt['peak_rss_mb']} MB (before {rt['before']['rss_mb']}, after "
         f"{rt['after'].get('rss_mb')})", rt["peak_rss_mb"] <= RSS_BUDGET_MB, True),
        ("no ERROR or CRITICAL line in the router's log", str(log["error_lines"]),
         log["error_lines"] == 0, False),
        ("no prompt bytes in the log (the marker planted in every prompt)",
         str(log["markers"]["prompt marker"]), log["markers"]["prompt marker"] == 0, False),
        (f"/healthz within {HEALTHZ_MAX_MS:g} ms throughout, none failed",
         f"max {hz_max} ms, {hz_fail} failed", hz_max < HEALTHZ_MAX_MS and hz_fail == 0, False),
        (f"/healthz p99 within {HEALTHZ_P99_MS:g} ms under the attack",
         f"p50 {attack.get('p50_ms')} / p99 {attack.get('p99_ms')} ms "
         f"(faults: p99 {faults.get('p99_ms')})",
         (attack.get("p99_ms") or 1e9) <= HEALTHZ_P99_MS, False),
        ("every answer keeps the contract (no routing details, engine address, server "
         "version, second answer; slow connections closed in time; probes at the engine)",
         "; ".join(f"{p} x{n}" for p, n in problems.most_common(6)) or "0",
         not problems, False),
        ("every case answered as it should", f"{len(unmet)} cases off: " + "; ".join(
            f"{c['case']} ({statuses(c['statuses'])})" for c in unmet[:8]) if unmet else "all",
         not unmet, False),
        ("no client makes the router connect elsewhere", f"{r['canary_connections']} "
         "connections to the canary port", r["canary_connections"] == 0, False),
        ("nothing left in flight once clients left (router and engines)",
         f"drained in {r['leak_check']['seconds']} s" if r["leak_check"]["drained"]
         else "not drained in 30 s", r["leak_check"]["drained"], False),
        ("every client connection closed after the attack (open descriptors: the idle "
         "pool to the engines stays 60 s by design)",
         f"in {r['settle']['seconds']} s; descriptors {rt['before']['fds']} before, "
         f"{rt['max_fds']} at most, {rt['after'].get('fds')} after"
         if r["settle"]["seconds"] is not None else "not within 30 s",
         r["settle"]["seconds"] is not None, False),
        ("the index within its memory budget", f"{r['index']['entries']:.0f} entries, bound "
         f"{r['index']['bound']}", r["index"]["entries"] <= r["index"]["bound"], False),
        ("faults: every request answered whole but those the fault took",
         f"{lfail} failed", lfail == 0 and bool(load), False),
        ("faults: a hung engine (its /health fine) ejected",
         f"in {fault['engine hung']['seconds_to_eject']} s" if "engine hung" in fault
         else "not ejected", "engine hung" in fault, False),
        ("faults: a killed engine ejected and taken back", "in {seconds_to_eject} s, back in "
         "{seconds_to_readmit} s".format(**fault["engine killed"]) if "engine killed" in fault
         else "no", "engine killed" in fault, False),
        ("the router alive at the end, and exits 0 on SIGTERM",
         f"alive {rt['alive_at_end']}, exit {rt['sigterm']['exit_code']} in "
         f"{rt['sigterm']['seconds']} s", rt["alive_at_end"] and rt["sigterm"]["exit_code"] == 0,
         False),
    ]
    if r["store"] == "redis":
        rd = r["redis"]
        after = rd["after the attack"] or {}
        lost = rd["store lost during the attack"]
        out.insert(-1, ("Redis stays up for the router through the attack (no `shared store "
                        "unavailable` before Redis is killed)", f"{len(lost)} times: "
                        + "; ".join(sorted({x.split(' (', 1)[-1][:60] for x in lost}))
                        if lost else "0", not lost, False))
        out.insert(-1, ("no Redis command over 100 ms (one Redis serves every router)",
                        f"{after.get('commands_over_10ms')} over 10 ms, {after.get('over_50ms')}"
                        f" over 50 ms, slowest {after.get('slowest_ms')} ms; "
                        f"{after.get('keys')} keys, {after.get('used_memory_mb')} MB",
                        (after.get("slowest_ms") or 0) <= 100, False))
        red = fault.get("redis killed")
        out.insert(-1, ("faults: Redis killed and back, nothing failed",
                        "degraded in {seconds_to_degraded} s, reconnected in "
                        "{seconds_to_reconnect} s".format(**red) if red else "no",
                        bool(red), False))
    if r["errors"]:
        out.append(("the run itself completed", "; ".join(r["errors"]), False, False))
    return out


def held(r: Mapping[str, Any], must_only: bool = False) -> bool:
    return all(ok for _b, _m, ok, must in bars(r) if must or not must_only)


def render(rounds: Sequence[Mapping[str, Any]], stamp: Mapping[str, str]) -> str:
    lines = [
        "# Abuse: hostile clients and sick engines against one router", "",
        "Written by `python -m bench abuse` from the JSON beside it (one file per store); "
        "what the failures are, and why, is in [FINDINGS.md](FINDINGS.md).", "",
        f"Command: `{stamp['command']}`  ",
        f"Machine: {stamp['machine']}, host `{stamp['host']}`; code: {stamp['version']}  ",
        *(f"{r['store']} store: started {r['started']}; load before: `{r['load_before']}`; "
          f"after: `{r['load_after']}`  " for r in rounds), "",
        "Each round starts 3 engine simulators (profile fast, max_model_len 32768), each behind "
        "the tap (bench/abuse/tap.py: records what reaches an engine, and hangs one on "
        "demand), and one `prefix-router` (a process of its own, log level debug) with its "
        "defaults but for:", "", "```yaml",
        *(f"{k}: {v}" for k, v in rounds[0]["settings"].items() if k != "discovery"), "```",
        "The attack: every case of bench/abuse/cases.py (slow clients and 800 silent "
        "connections all the while, in the background, beside one ordinary request every "
        "0.5 s), then the faults under ordinary load (8 req/s, half streamed), then the "
        "figures. Every prompt holds the run's marker; the log is searched for it.", "",
        "## Verdicts", "", "The first four bars are the ones the command must show (`must`).", ""]
    verdicts = [{bar: (measured, ok, must) for bar, measured, ok, must in bars(r)}
                for r in rounds]
    order = list(dict.fromkeys(bar for v in verdicts for bar in v))  # first round's order first
    lines += md_table(["bar", *(r["store"] for r in rounds)], [
        [("**must** " if next(v[bar][2] for v in verdicts if bar in v) else "") + bar,
         *(f"{'yes' if v[bar][1] else '**no**'}: {v[bar][0]}" if bar in v else "-"
           for v in verdicts)] for bar in order])
    for r in rounds:
        lines += section(r)
    return "\n".join(lines) + "\n"


def section(r: Mapping[str, Any]) -> list[str]:
    classes = by_class(r["outcomes"])
    out = ["", f"## {r['store']} store", "", "### Requests tried, by class", "", *md_table(
        ["class", "cases", "tried", "statuses", "off", "5xx", "problems"],
        [[c["cls"], c["cases"], c["tried"], statuses(c["statuses"]), c["unmet"], c["five_xx"],
          c["problems"]] for c in classes]),
        f"\n{sum(c['tried'] for c in classes)} requests and connections in all. "
        "`closed`: the router ended the connection without an answer; `left`: the "
        "client left on purpose; `off`: answers the case does not allow."]
    if off := [c for c in by_case(r["outcomes"]) if c["unmet"] or c["problems"] or c["notes"]]:
        out += ["", "### Cases off, with problems or notes", "", *md_table(
            ["class", "case", "statuses", "off", "problems", "notes"],
            [[c["cls"], c["case"], statuses(c["statuses"]), c["unmet"], statuses(c["problems"]),
              statuses(c["notes"])] for c in off])]
    f, rt, log = r["faults"], r["router"], r["log"]
    out += ["", "### Faults under load", "", *md_table(["fault", "figures"], [
        [k, ", ".join(f"{a} {b}" for a, b in v.items())] for k, v in f.items() if k != "load"]),
        "", *md_table(["phase", "sent", "whole", "failed as the fault allows", "failed",
                       "statuses"], [[p, v["sent"], v["whole"], v["allowed_failures"],
                                      v["failures"], statuses(v["statuses"])]
                                     for p, v in f.get("load", {}).items()]),
        "", "### /healthz latency (its own connection, every 50 ms)", "",
        *md_table(["phase", "answers", "failed", "p50 ms", "p99 ms", "max ms"],
                  [[p, v["n"], v["failures"], v["p50_ms"], v["p99_ms"], v["max_ms"]]
                   for p, v in r["healthz"].items()]),
        "", "### The router process", "",
        *md_table(["", "RSS MB", "peak RSS MB", "open descriptors"], [
            ["before the attack", rt["before"]["rss_mb"], rt["before"]["peak_rss_mb"],
             rt["before"]["fds"]],
            ["most during the run", rt["peak_rss_mb"], "", rt["max_fds"]],
            ["after (descriptors settled)", rt["after"].get("rss_mb"),
             rt["after"].get("peak_rss_mb"), rt["after"].get("fds")]]),
        "", "Descriptors by kind: " + "; ".join(f"{when} " + ", ".join(
            f"{k} {v}" for k, v in rt[when].get("fd_kinds", {}).items())
            for when in ("before", "after")) + "."]
    if r.get("redis"):
        out += ["", "Redis: " + "; ".join(f"{k}: {v}" for k, v in r["redis"].items())]
    out += ["", "### The router's log", "",
            f"{log['lines']} lines ({', '.join(f'{k} {v}' for k, v in log['levels'].items())}); "
            f"tracebacks {log['tracebacks']}; ERROR lines {log['error_lines']}; markers: "
            + ", ".join(f"{k} {v}" for k, v in log["markers"].items()), "",
            *md_table(["lines", "kind (INFO and above; numbers and quoted values blanked)"],
                      [[n, k] for k, n in log["kinds"].items()])]
    for e in [*log["first_errors"], *log.get("traceback_excerpts", [])]:
        out += ["", "```", e, "```"]
    return [*out, "", "Timings (s): " + ", ".join(f"{k} {v}" for k, v in r["timings_s"].items())]
