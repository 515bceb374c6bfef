"""The one report writer: a scenario's points (the JSON files in its results folder) become its
markdown report: how and where it was measured, its rules' verdicts, a table per group of
points (median (min-max) over repeats) and plots. Nothing in it is typed in."""

from __future__ import annotations

import glob
import json
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .harness.stats import beats, round_ratios, spread, tied, values
from .scenarios import LOAD_BALANCERS, SCENARIOS, Rule, Scenario

RESULTS = Path("bench/results")
LABELS = {
    "hit_rate": "engine hit rate", "new_share": "share of requests on the replicas that joined",
    "oracle_hit_rate": "oracle", "throughput_rps": "req/s", "output_tokens_per_s": "out tok/s",
    "queued_at_end": "queued", "requests_sent": "sent", "requests_ok": "ok",
    "redis_round_trips_per_request": "round trips / req",
    "redis_timer_round_trips_per_request": "timer trips / req",
    "hit_over_oracle": "hit / oracle", "router_predicted_hit_rate": "router predicted",
    "index_corrections_over": "corrections over", "index_corrections_under": "corrections under",
    "prediction_error_mean_tokens": "mean pred. error tok",
}
IDENTITY = ("scenario", "workload", "rate", "router", "client", "tag")
OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
       "within": lambda x, b: abs(x - 1.0) <= b}


def label(key: str) -> str:
    return LABELS.get(key) or key.replace("_ms", " ms").replace("_", " ").replace("ttft", "TTFT")


def load(sc: Scenario) -> list[dict[str, Any]]:
    """The scenario's points (a suite's: its parts'); other JSON sharing the folder is left out."""
    if sc.parts:
        return [r for p in sc.parts for r in load(
            replace(SCENARIOS[p], out=str(Path(sc.out) / SCENARIOS[p].out)))]
    rows = []
    for path in sorted(glob.glob(str(RESULTS / re.sub(r"\{rate[^}]*\}", "*", sc.out) / "*.json"))):
        row = json.loads(Path(path).read_text())
        if isinstance(row, dict) and "router" in row:
            row.setdefault("scenario", sc.name)
            if row["scenario"] == sc.name and row.get("client", "loadgen") in sc.clients:
                rows.append(row)
    return sorted(rows, key=lambda r: (str(r.get("workload")), r.get("rate") or 0))


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def cell(row: Mapping[str, Any], key: str) -> str:
    """A figure, with the spread over the point's repeats: `median (min-max)`."""
    v = row.get(key)
    if key == "rate" and v is not None:
        return f"{v:g}"
    number = isinstance(v, int | float) and not isinstance(v, bool)
    s = spread(row, key) if number and row.get("repeats", 1) > 1 else None
    return fmt(v) if s is None or fmt(s[0]) == fmt(s[1]) else f"{fmt(v)} ({fmt(s[0])}-{fmt(s[1])})"


def md_table(headers: Sequence[str], body: Iterable[Iterable[Any]]) -> list[str]:
    """A markdown table of cells as `str` writes them (a pipe inside a cell would end it)."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in body)]


def table(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> list[str]:
    return [*md_table([label(c) for c in columns], [[cell(r, c) for c in columns] for r in rows]),
            ""]


def _matches(row: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    return all(row.get(k) in v if isinstance(v, tuple) else row.get(k) == v
               for k, v in where.items())


def _others(r: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], key: str,
            change: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The points like `r` but for the fields in `change`, that have `key`."""
    same = {k: r.get(k) for k in IDENTITY if k not in change}
    return [o for o in rows if o is not r and o.get(key) is not None
            and _matches(o, {**same, **change})]


def saturated(rows: Sequence[Mapping[str, Any]], at: Mapping[str, Any]) -> bool:
    """Every load balancer at this point (every router, if none ran) is past saturation: TTFT
    p50 over 1 s, over 5% failed, or a request per replica queued when the step ended."""
    point = [r for r in rows if all(r.get(k) == at.get(k) for k in IDENTITY[:3])]
    lbs = [r for r in point if r["router"] in LOAD_BALANCERS] or point
    return bool(lbs) and all(
        r.get("ttft_p50_ms") is None or r["ttft_p50_ms"] > 1000
        or (r.get("errors") or 0) > 0.05 * (r.get("requests_sent") or 0) > 0
        or (r.get("queued_at_end") or 0) >= r.get("replicas", 8) for r in lbs)


def judge(rule: Rule, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """(what, measured, met) of `rule` on each point it selects; met None: not judged."""
    out = []
    key = rule.key
    for r in (r for r in rows if _matches(r, rule.where) and r.get(key) is not None):
        value, text = float(r[key]), cell(r, key)
        pick = max if rule.high else min
        if rule.over and r.get(rule.over):
            value /= r[rule.over]
            text = f"{fmt(r[key])} / {fmt(r[rule.over])} = {value:.3f}"
        elif rule.vs is not None:
            if not (others := _others(r, rows, key, rule.vs)):
                continue
            if rule.op == "best":
                beaten = [o for o in others if beats(o, r, key, rule.high)]
                ties = [o["router"] for o in others if tied(o, r, key)]
                top = pick([r, *others], key=lambda o: o[key])
                text += f"; best of all {top['router']} {fmt(top[key])}"
                text += f"; tied with {', '.join(ties)}" if ties else ""
                text += f"; beaten by {pick(beaten, key=lambda o: o[key])['router']}" \
                    if beaten else ""
                value = -1.0 if beaten else 0.0
            else:
                best = pick(others, key=lambda o: o[key])
                value /= best[key]
                who = f" ({best['router']})" if len(others) > 1 else ""
                text = f"{cell(r, key)} / {cell(best, key)}{who} = {value:.3f}"
                if len(per := round_ratios(r, best, key)) > 1:
                    text += f" (per round {min(per):.3f}-{max(per):.3f})"
        met = None if rule.bound is None else OPS.get(rule.op, operator.ge)(value, rule.bound)
        if rule.saturation and saturated(rows, r):
            met, text = None, text + " (past saturation: not judged)"
        names = {k: r.get(k) for k in IDENTITY if r.get(k) is not None}
        out.append((rule.text.format(**names), text, met))
    return out


def verdicts(rules: Sequence[Rule], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    body = [(what, text, "-" if met is None else "yes" if met else "NO")
            for rule in rules for what, text, met in judge(rule, rows) or
            [(rule.text.split(": ", 1)[-1] if "{" in rule.text else rule.text, "not measured",
              None)]]
    return ["## Acceptance", "", *md_table(("rule", "measured", "met"), body), ""] if body else []


def _order(sc: Scenario) -> Any:
    rank = {getattr(s, "name", s): i for i, s in enumerate(sc.setups)}  # a name or a Setup
    return lambda r: (r.get("rate") or 0, rank.get(r["router"], 99), r["router"],
                      r.get("client", ""))


def provenance(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """How a group of points was made, read from the points: commands, when, where."""
    def each(key: str) -> list[str]:
        return list(dict.fromkeys(str(r[key]) for r in rows if r.get(key)))

    def span(xs: Sequence[Any], sep: str) -> str:
        return f"{xs[0]}" + (f"{sep}{xs[-1]}" if xs[-1] != xs[0] else "")

    stamps, reps = sorted(each("measured_at")), sorted({int(r.get("repeats", 1)) for r in rows})
    loads = sorted(f"{x:g}" for r in rows for x in values(r, "load_1m"))
    lines = [f"- Command: `{c}`" for c in each("command")]
    if stamps:
        lines.append(f"- Measured {span(stamps, ' to ')} on {'; '.join(each('machine'))}")
    if each("version"):
        lines.append(f"- Code: {', '.join(each('version'))}; seconds of load per rate: "
                     f"{', '.join(each('seconds'))}")
    if loads:
        lines.append(f"- Load average (1 min) at the runs' start: {span(loads, '-')}")
    if reps != [1]:
        lines.append(f"- Each point ran {'/'.join(map(str, reps))} times, round after round over "
                     "the setups, on the same request sequence: cells are median (min-max) "
                     "over the rounds; a per-round ratio divides round i by round i")
    return [x + "." for x in lines] + [""]


def section(sc: Scenario, rows: list[dict[str, Any]], folder: Path,
            extra: Sequence[Mapping[str, Any]] = (), prefix: str = "") -> list[str]:
    """The scenario's groups of points: heading, provenance, plot, table."""
    lines: list[str] = []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=_order(sc)):
        groups.setdefault(tuple(r.get(g) for g in sc.group_by), []).append(r)
    for key, sel in groups.items():
        name = " ".join(f"at {v:g} req/s" if g == "rate" else str(v)
                        for g, v in zip(sc.group_by, key, strict=True) if v not in (None, ""))
        lines += [f"### {name}", "", *provenance(sel)] if name else provenance(sel)
        if sc.plot:
            png = prefix + ("-".join(str(k) for k in key if k not in (None, "")) or "all") + ".png"
            more = [x for x in extra if x["router"] in sc.setups and x.get("workload") in key]
            plot(sel + more, sc, folder / png)
            lines += [f"![{name or sc.name}]({png})", ""]
            sel = sorted(sel + more, key=_order(sc)) if sc.plot == "rate" else sel
        lines += table(sc.columns or ("router", "engine_hit_rate", "ttft_p50_ms", "ttft_p99_ms"),
                       sel)
    return lines


def render(sc: Scenario) -> str:
    rows, templated = load(sc), "{" in sc.out  # templated: plots beside the per-rate folders
    lines = [f"# {sc.title}", "", f"{sc.method}." if sc.method else "", "",
             f"Written by `python -m bench {sc.name}` from the JSON files beside it "
             f"(`--report`: only this file). Scenario: `bench/scenarios.py` ({sc.name}).", ""]
    # a suite's rules and its parts' (parts may share rules: each is judged once)
    rules = {repr(r): r for r in [*sc.rules, *(r for p in sc.parts for r in SCENARIOS[p].rules)]}
    lines += verdicts(list(rules.values()), rows)
    if sc.parts and sc.columns:  # one table of every part's points, in the parts' order
        rank = {p: i for i, p in enumerate(sc.parts)}
        lines += ["## Summary", "", *table(sc.columns, sorted(rows, key=lambda r: (
            rank.get(r["scenario"], 99), _order(SCENARIOS.get(r["scenario"], sc))(r))))]
    for part in [SCENARIOS[p] for p in sc.parts] or [sc]:
        mine = [r for r in rows if r["scenario"] == part.name]
        if sc.parts and mine:
            method = part.method not in sc.method and part.method
            lines += [f"## {part.title}", "", f"{method}." if method else "", ""]
        lines += section(part, mine, RESULTS if templated else RESULTS / sc.out,
                         [r for r in rows if r["scenario"] != part.name],
                         f"{part.name}-" if sc.parts or templated else "")
    return "\n".join(lines).replace("\n\n\n", "\n\n").rstrip() + "\n"


def preface(old: str) -> list[str]:
    """The hand-written note under a report's title (its `> ` lines: why a run was made, what
    it replaced), kept when the report is written again."""
    kept: list[str] = []
    blank = 0  # blank lines between quoted paragraphs belong to the note
    for line in old.splitlines()[1:]:
        if not line.strip():
            blank += 1
        elif line.startswith(">"):
            kept += [""] * blank * bool(kept) + [line]
            blank = 0
        else:
            break
    return [*kept, ""] if kept else []


def write(sc: Scenario) -> Path:
    path = RESULTS / f"{sc.name}.md" if "{" in sc.out else RESULTS / sc.out / sc.report
    path.parent.mkdir(parents=True, exist_ok=True)
    title, _, body = render(sc).partition("\n\n")
    note = preface(path.read_text()) if path.exists() else []
    path.write_text("\n".join([title, "", *note, body]))
    print(f"wrote {path}")
    return path


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(rows: Sequence[Mapping[str, Any]], sc: Scenario, out: Path) -> None:
    """A panel per figure, a line per router: against the rate, or over the run (the first
    round's windows, with the scenario's events)."""
    plt, nan, rate = pyplot(), float("nan"), sc.plot == "rate"
    if rate:
        keys = ("ttft_p50_ms", "ttft_p99_ms", "engine_hit_rate")
        lines = {n: sorted(((r["rate"], r) for r in rows if r["router"] == n), key=lambda x: x[0])
                 for n in dict.fromkeys(r["router"] for r in rows)}
    else:
        keys = ("new_share",) * (sc.join_at is not None) + ("hit_rate", "ttft_p50_ms")
        lines = {r["router"]: [(w["t"], w) for w in r.get("series") or (
            r.get("runs") or [{}])[0].get("series") or []] for r in rows}
    seconds = rows[0]["seconds"] if rows else sc.seconds
    events = [] if rate else [f * seconds for f in (
        [sc.join_at] if sc.join_at is not None else list(sc.redis_down or ()))]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.2))
    for ax, key in zip(axes, keys, strict=True):
        for name, pts in lines.items():
            ax.plot([x for x, _ in pts], [nan if p.get(key) is None else p[key] for _, p in pts],
                    marker="o", ms=3, label=name)
        ax.set_title(label(key).replace("_", " "), fontsize=10)
        ax.set_xlabel("request rate (req/s)" if rate else "seconds into the run")
        ax.grid(alpha=0.3)
        for at in events:
            ax.axvline(at, color="grey", ls="--")
        if key.endswith("_ms") and rate:
            ax.set_yscale("log")
        elif not key.endswith("_ms"):
            ax.set_ylim(0, 1)
    axes[-1].legend(fontsize=8)
    save_figure(plt, fig, out)


def save_figure(plt: Any, fig: Any, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def demo_sentences(rows: Sequence[Mapping[str, Any]]) -> str:
    """What the demo's table means, in two sentences."""
    by = {r["router"]: r for r in rows}
    p, rr = by.get("prefix"), by.get("round-robin")
    if not p or not rr or not p.get("ttft_p50_ms") or not rr.get("ttft_p50_ms"):
        return "prefix or round-robin has no TTFT figure: see the errors above."
    oracle = p.get("oracle_hit_rate") or 0.0
    return (f"prefix cut the median time to first token by "
            f"{1 - p['ttft_p50_ms'] / rr['ttft_p50_ms']:.0%} against round-robin "
            f"({p['ttft_p50_ms']:.0f} ms against {rr['ttft_p50_ms']:.0f} ms): it sends each "
            "request to a replica that already holds its system prompt in KV cache.\n"
            f"Its engines served {p['engine_hit_rate']:.1%} of prompt tokens from cache, "
            f"{p['engine_hit_rate'] / oracle if oracle else 0:.2f} of the {oracle:.1%} that one "
            "cache as large as the whole fleet (the oracle) would have, on the same requests.")
