"""`python -m bench <scenario>`: one subcommand per scenario of bench/scenarios.py, plus `run`
(one workload through one router setup) and `install` (the anchors' cached venvs)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from . import abuse, api, conversation, lifecycle, multimodal_key, response_map, tenants
from .harness.workloads import WORKLOADS
from .scenarios import SCENARIOS, SETUPS, Scenario, setup

ALIASES = {"overhead-all": ("overhead", "ours and every anchor router, one after the other",
                            ("prefix", "prefix-redis", "sglang-cache_aware", "vllm-cache_aware",
                             "vllm-consistent_hash"))}


def generic(p: argparse.ArgumentParser) -> None:
    """The flags every routing scenario takes, each over the scenario's declaration."""
    p.add_argument("--quick", action="store_true", help="the scenario's short variant")
    p.add_argument("--repeat", type=int, help="rounds (every setup once per round)")
    p.add_argument("--seconds", type=float, help="of load per rate")
    p.add_argument("--rate", "--rates", dest="rates", type=float, nargs="+", help="req/s")
    p.add_argument("--workload", "--workloads", dest="workloads", nargs="+", choices=WORKLOADS)
    p.add_argument("--setups", "--routers", dest="setups", nargs="+", metavar="SETUP",
                   help=f"{', '.join(SETUPS)}, or prefix,key=value[,key=value] (router settings)")
    p.add_argument("--requests", type=int, help="a fixed count of requests (single-turn)")
    p.add_argument("--tag", help="tells this run's points apart from others of the same points")
    p.add_argument("--router-kv-capacity-factor", dest="capacity_factor", type=float,
                   help="the routers are told F x the simulators' KV capacity (default 1)")
    p.add_argument("--out", type=lambda o: str(Path(o).relative_to("bench/results"))
                   if Path(o).is_relative_to("bench/results") else o,
                   help="results folder under bench/results (default: the scenario's)")
    p.add_argument("--report", action="store_true", help="only rebuild the report from its JSON")
    p.add_argument("--json", help="also write the last point's JSON here")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="scenario")
    r = sub.add_parser("run", help="one workload through one router setup; prints its JSON")
    generic(r)
    r.add_argument("--router", dest="setups", nargs=1, help="a setup, as --setups")
    r.add_argument("--replicas", type=int, default=8)
    r.add_argument("--router-replicas", type=int, default=1)
    r.add_argument("--profile", default="llama-3.1-70b-h100")
    r.add_argument("--time-scale", type=float, default=1.0)
    r.add_argument("--kv-capacity", type=int)
    r.add_argument("--seed", type=int, default=7)
    r.add_argument("--router-config", help="a router settings YAML given to every router")
    for name, sc in [*SCENARIOS.items(), *((a, SCENARIOS[s]) for a, (s, _, _) in ALIASES.items())]:
        one = sub.add_parser(name, help=ALIASES[name][1] if name in ALIASES else sc.help)
        if sc.kind == "autoscale":
            one.add_argument("--rate", type=float, default=4.0, help="requests per second")
            one.add_argument("--ramp-seconds", type=float, default=120.0)
            one.add_argument("--hold-seconds", type=float, default=30.0)
            one.add_argument("--stabilization-seconds", type=int, default=30)
            one.add_argument("--max-replicas", type=int, default=6)
            one.add_argument("--out", default="bench/results/autoscale")
            one.add_argument("--report", action="store_true", help="rebuild from its JSON")
            continue
        generic(one)
        if sc.parts:
            one.add_argument("--only", choices=sc.parts)
    for one in (r, sub.choices["overhead"]):
        one.add_argument("--store", choices=("local", "redis"), default="local")
    sub.add_parser("install", help="the anchors' and clients' pinned, cached venvs").add_argument(
        "names", nargs="*", metavar="name", help="default: every one")
    abuse.register(sub)
    tenants.register(sub)
    api.register(sub)
    conversation.register(sub)
    response_map.register(sub)
    multimodal_key.register(sub)
    lifecycle.register(sub)
    return p


def declared(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios asked for (a suite's parts, or the one): each its declaration, then
    --quick's overrides, then the flags'."""
    name = ALIASES[args.cmd][0] if args.cmd in ALIASES else args.cmd
    sc = SCENARIOS.get(name) or Scenario("run", "", fresh_fleet=True, out=".")
    over: dict[str, Any] = {k: getattr(args, k) for k in (
        "seconds", "requests", "tag", "capacity_factor") if getattr(args, k)}
    over.update({k: tuple(getattr(args, k)) for k in ("workloads", "rates", "setups")
                 if getattr(args, k)})
    if args.repeat:
        over["repeats"] = args.repeat
    if args.cmd in ALIASES:
        over.setdefault("setups", ALIASES[args.cmd][2])
    if getattr(args, "store", "") == "redis" and sc.kind == "overhead":
        over["setups"] = ("prefix-redis",)
    if name == "run":
        s = setup(over.get("setups", ("prefix",))[0])
        cfg = yaml.safe_load(Path(args.router_config).read_text()) if args.router_config else {}
        over.update(setups=(dataclasses.replace(s, settings={**s.settings, **cfg},
                                                replicas=args.router_replicas, store=args.store),),
                    replicas=args.replicas, profile=args.profile, time_scale=args.time_scale,
                    kv_capacity=args.kv_capacity, seed=args.seed,
                    rates=over.get("rates", (10.0,)),
                    workloads=over.get("workloads", ("system-prompts",))[:1])
    for s in over.get("setups", ()):
        setup(s)  # refuse a bad setup before anything starts
    out = []
    for part in [SCENARIOS[p] for p in sc.parts if getattr(args, "only", None) in (None, p)] \
            or [sc]:
        if args.out:
            over["out"] = str(Path(args.out) / part.out) if sc.parts else args.out
        out.append(dataclasses.replace(part, **{**(part.quick if args.quick else {}), **over}))
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    command = ".venv/bin/python -m bench " + shlex.join(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds as Ctrl-C does, which stops the fleet's processes
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        import uvloop

        uvloop.install()  # the load generator's own overhead is part of what it measures
    except ImportError:
        pass
    if args.cmd == "install":
        from .harness.anchors import check_names, install

        for n in check_names(args.names):
            print(n, install(n), flush=True)
    elif args.cmd == "autoscale":
        autoscale(args, command)
    elif args.cmd == "api":
        api.main(args, command)
    elif args.cmd == "conversation":
        conversation.main(args, command)
    elif args.cmd == "response-map":
        response_map.main(args, command)
    elif args.cmd == "multimodal-key":
        multimodal_key.main(args, command)
    elif args.cmd == "lifecycle":
        lifecycle.main(args, command)
    elif args.cmd == "abuse":
        abuse.main(args, command)
    elif args.cmd == "tenants":
        tenants.main(args, command)
    else:
        scenarios(args, command)


def scenarios(args: argparse.Namespace, command: str) -> None:
    from .report import demo_sentences, table, write
    from .runner import run_scenario

    rows: list[dict[str, Any]] = []
    scs = declared(args)
    for sc in [] if args.report else scs:
        rows = asyncio.run(run_scenario(sc, command, write=sc.name != "run"))
        if rows and (sc.name == "run" or args.json):
            print(text := json.dumps(rows[-1], indent=2))
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(text + "\n")
    sc = SCENARIOS[args.cmd] if SCENARIOS.get(args.cmd, scs[0]).parts else scs[0]
    if sc.name == "demo":
        print("\n".join(["", *table(sc.columns, rows)]))
        print(demo_sentences(rows))
    elif sc.name != "run":
        write(dataclasses.replace(sc, out=args.out) if args.out and sc.parts else sc)


def autoscale(args: argparse.Namespace, command: str) -> None:
    from .autoscale import Settings, main, rebuild

    out = Path(args.out)
    m = (rebuild(out) if args.report else main(
        Settings(rate=args.rate, ramp_s=args.ramp_seconds, hold_s=args.hold_seconds,
                 scale_down_stabilization_s=args.stabilization_seconds,
                 max_replicas=args.max_replicas), out, command))["summary"]
    print(f"peak cache pressure {m['peak_cache_pressure']}, max replicas "
          f"{m['max_spec_replicas']}, first scale-up {m['seconds_to_first_scale_up']} s after the "
          f"pressure went over target, back to min {m['seconds_load_stop_to_min']} s after the "
          "load stopped")


if __name__ == "__main__":
    main()
