"""The one report writer: a scenario's points (the JSON files under its results folder) become
its markdown report: how it was measured and where, the verdicts of its rules, one table per
group of points (median (min-max) over repeats) and its plots. Nothing in it is typed in."""

from __future__ import annotations

import glob
import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
    "within": lambda x, b: abs(x - 1.0) <= b}
SATURATED_TTFT_P50_MS = 1000.0
SATURATED_SHARE = 0.05


def label(key: str) -> str:
    return LABELS.get(key) or key.replace("_ms", " ms").replace("_", " ").replace("ttft", "TTFT")


def load(sc: Scenario) -> list[dict[str, Any]]:
    """The scenario's points (a suite's: its parts'); a JSON without `router` is not a point,
    and one of another scenario or client sharing the folder is left out."""
    if sc.parts:  # each part's folder, under the suite's
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
    """A markdown table of cells as `str` writes them (`fmt` or `cell` first for figures); a
    pipe inside a cell would end it."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in body)]


def _matches(row: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    return all(row.get(k) in v if isinstance(v, tuple) else row.get(k) == v
               for k, v in where.items())


def saturated(rows: Sequence[Mapping[str, Any]], at: Mapping[str, Any]) -> bool:
    """The fleet is past saturation at a point when every load balancer there is (every
    router, when none ran): TTFT p50 over 1 s, over 5% failed, or a request per replica
    queued at the engines when the step ended."""
    point = [r for r in rows if all(r.get(k) == at.get(k) for k in IDENTITY[:3])]
    lbs = [r for r in point if r["router"] in LOAD_BALANCERS] or point

    def one(r: Mapping[str, Any]) -> bool:
        p50, sent = r.get("ttft_p50_ms"), r.get("requests_sent") or 0
        return (p50 is None or p50 > SATURATED_TTFT_P50_MS
                or (sent > 0 and (r.get("errors") or 0) / sent > SATURATED_SHARE)
                or (r.get("queued_at_end") or 0) >= r.get("replicas", 8))

    return bool(lbs) and all(one(r) for r in lbs)


def judge(rule: Rule, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, bool | None]]:
    """(what, measured, met) of `rule` on each point it selects; met is None where it is not
    judged (a diagnostic, or past saturation)."""
    out = []
    for r in rows:
        if not _matches(r, rule.where) or r.get(rule.key) is None:
            continue
        key, value = rule.key, float(r[rule.key])
        text = cell(r, key)
        if rule.over and r.get(rule.over):
            value /= r[rule.over]
            text = f"{fmt(r[key])} / {fmt(r[rule.over])} = {value:.3f}"
        elif rule.vs is not None:
            same = {k: r.get(k) for k in IDENTITY if k not in rule.vs}
            others = [o for o in rows if o is not r and o.get(key) is not None
                      and _matches(o, {**same, **rule.vs})]
            if not others:
                continue
            pick = max if rule.high else min
            if rule.op == "best":
                beaten = [o for o in others if beats(o, r, key, rule.high)]
                ties = [o["router"] for o in others if tied(o, r, key)]
                top = pick([r, *others], key=lambda o: o[key])
                text += f"; best of all {top['router']} {fmt(top[key])}"
                text += f"; tied with {', '.join(ties)}" if ties else ""
                value = -1.0 if beaten else 0.0
                if beaten:
                    text += f"; beaten by {pick(beaten, key=lambda o: o[key])['router']}"
            else:
                best = pick(others, key=lambda o: o[key])
                value /= best[key]
                who = f" ({best['router']})" if len(others) > 1 else ""
                text = f"{cell(r, key)} / {cell(best, key)}{who} = {value:.3f}"
                per = round_ratios(r, best, key)
                if len(per) > 1:
                    text += f" (per round {min(per):.3f}-{max(per):.3f})"
        met = None if rule.bound is None else OPS.get(rule.op, operator.ge)(value, rule.bound)
        if rule.saturation and saturated(rows, r):
            met, text = None, text + " (past saturation: not judged)"
        if rule.below is not None and rule.bound is not None:
            ref = _reference(rule, r, rows)
            if ref is None:
                continue
            who, v = ref
            if v >= rule.bound:
                met, text = None, text + f" (not judged: {who} {v:.3f} is not below)"
            else:
                text += f" ({who} {v:.3f})"
        names = {k: r.get(k) for k in IDENTITY if r.get(k) is not None}
        out.append((rule.text.format(**names), text, met))
    return out


def _reference(rule: Rule, r: Mapping[str, Any],
               rows: Sequence[Mapping[str, Any]]) -> tuple[str, float] | None:
    """The point a `below` rule looks at (r with those fields changed): (its router, its
    figure over `over`); None if it did not run."""
    assert rule.below is not None
    same = {k: r.get(k) for k in IDENTITY if k not in rule.below}
    ref = next((o for o in rows if o.get(rule.key) is not None
                and _matches(o, {**same, **rule.below})), None)
    if ref is None or (rule.over and not ref.get(rule.over)):
        return None
    v = float(ref[rule.key]) / (float(ref[rule.over]) if rule.over else 1.0)
    return str(ref["router"]), v


def verdicts(rules: Sequence[Rule], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    body = [(what, text, "-" if met is None else "yes" if met else "NO")
            for rule in rules for what, text, met in judge(rule, rows) or
            [(rule.text.split(": ", 1)[-1] if "{" in rule.text else rule.text, "not measured",
              None)]]
    return ["## Acceptance", "", *md_table(("rule", "measured", "met"), body), ""] if body else []


def _order(sc: Scenario) -> Callable[[Mapping[str, Any]], tuple]:
    rank = {getattr(s, "name", s): i for i, s in enumerate(sc.setups)}  # a name or a Setup
    return lambda r: (r.get("rate") or 0, rank.get(r["router"], 99), r["router"],
                      r.get("client", ""))


def provenance(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """How each group of points was made, read from the points: commands, when, where."""
    def each(key: str) -> list[str]:
        return list(dict.fromkeys(str(r[key]) for r in rows if r.get(key)))

    stamps = sorted(each("measured_at"))
    loads = sorted(x for r in rows for x in values(r, "load_1m"))
    reps = sorted({int(r.get("repeats", 1)) for r in rows})
    lines = [f"- Command: `{c}`" for c in each("command")]
    lines += [f"- Measured {stamps[0]}" + (f" to {stamps[-1]}" if stamps[-1] != stamps[0] else "")
              + f" on {'; '.join(each('machine'))}" if stamps else ""]
    lines += [f"- Code: {', '.join(each('version'))}; seconds of load per rate: "
              f"{', '.join(each('seconds'))}" if each("version") else ""]
    lines += [f"- Load average (1 min) at the runs' start: {loads[0]:g}"
              + (f"-{loads[-1]:g}" if loads[-1] != loads[0] else "") if loads else ""]
    if reps != [1]:
        lines.append(f"- Each point ran {'/'.join(map(str, reps))} times, round after round over "
                     "the setups, on the same request sequence: cells are median (min-max) "
                     "over the rounds; a per-round ratio divides round i by round i")
    return [x + "." for x in lines if x] + [""]


def section(sc: Scenario, rows: list[dict[str, Any]], folder: Path,
            extra: Sequence[Mapping[str, Any]] = (), prefix: str = "") -> list[str]:
    """The scenario's groups of points: heading, plot, table."""
    lines = []
    columns = sc.columns or ("router", "engine_hit_rate", "ttft_p50_ms", "ttft_p99_ms")
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=_order(sc)):
        groups.setdefault(tuple(r.get(g) for g in sc.group_by), []).append(r)
    for key, sel in groups.items():
        name = " ".join(f"at {v:g} req/s" if g == "rate" else str(v)
                        for g, v in zip(sc.group_by, key, strict=True) if v not in (None, ""))
        lines += [f"### {name}", ""] if name else []
        lines += provenance(sel)
        if sc.plot:
            png = prefix + ("-".join(str(k) for k in key if k not in (None, "")) or "all") + ".png"
            more = [x for x in extra if x["router"] in sc.setups and x.get("workload") in key]
            plot(sel + more, sc, folder / png)
            lines += [f"![{name or sc.name}]({png})", ""]
            sel = sorted(sel + more, key=_order(sc)) if sc.plot == "rate" else sel
        lines += [*md_table([label(c) for c in columns],
                            [[cell(r, c) for c in columns] for r in sel]), ""]
    return lines


def render(sc: Scenario) -> str:
    rows = load(sc)
    # a suite's parts write no report of their own; points in one folder per rate: the
    # report and its plots beside those folders, named for the scenario
    templated = "{" in sc.out
    folder = RESULTS if templated else RESULTS / sc.out
    lines = [f"# {sc.title}", "", f"{sc.method}." if sc.method else "", "",
             f"Written by `python -m bench {sc.name}` from the JSON files beside it "
             f"(`--report`: only this file). Scenario: `bench/scenarios.py` ({sc.name}).", ""]
    # a suite's rules and its parts' (parts may share rules: each is judged once)
    rules = {repr(r): r for r in [*sc.rules, *(r for p in sc.parts for r in SCENARIOS[p].rules)]}
    lines += verdicts(list(rules.values()), rows)
    if sc.parts and sc.columns:  # one table of every part's points, in the parts' order
        rank = {p: i for i, p in enumerate(sc.parts)}
        body = sorted(rows, key=lambda r: (rank.get(r["scenario"], 99), _order(
            SCENARIOS.get(r["scenario"], sc))(r)))
        lines += ["## Summary", "", *md_table([label(c) for c in sc.columns],
                                              [[cell(r, c) for c in sc.columns] for r in body]),
                  ""]
    for part in [SCENARIOS[p] for p in sc.parts] or [sc]:
        mine = [r for r in rows if r["scenario"] == part.name]
        if sc.parts and mine:
            method = part.method not in sc.method and part.method
            lines += [f"## {part.title}", "", f"{method}." if method else "", ""]
        lines += section(part, mine, folder, [r for r in rows if r["scenario"] != part.name],
                         f"{part.name}-" if sc.parts or templated else "")
    return "\n".join(lines).replace("\n\n\n", "\n\n").rstrip() + "\n"


def preface(old: str) -> list[str]:
    """The hand-written note under a report's title (its `> ` lines: why a run was made,
    what it replaced), carried over when the report is written again from its points."""
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
    # points in one folder per rate: the report beside those folders
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
    """One panel per figure, one line per router: against the rate (`plot` "rate"), or over
    the run (a timeline's windows, the first round's, with the scenario's events)."""
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
    for name, pts in lines.items():
        for ax, key in zip(axes, keys, strict=True):
            ax.plot([x for x, _ in pts], [nan if p.get(key) is None else p[key] for _, p in pts],
                    marker="o", ms=3, label=name)
    for ax, key in zip(axes, keys, strict=True):
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
    cut = 1 - p["ttft_p50_ms"] / rr["ttft_p50_ms"]
    oracle = p.get("oracle_hit_rate") or 0.0
    return (f"prefix cut the median time to first token by {cut:.0%} against round-robin "
            f"({p['ttft_p50_ms']:.0f} ms against {rr['ttft_p50_ms']:.0f} ms): it sends each "
            "request to a replica that already holds its system prompt in KV cache.\n"
            f"Its engines served {p['engine_hit_rate']:.1%} of prompt tokens from cache, "
            f"{p['engine_hit_rate'] / oracle if oracle else 0:.2f} of the {oracle:.1%} that one "
            "cache as large as the whole fleet (the oracle) would have, on the same requests.")
