"""`python -m bench`: run | overhead | demo | suite | stream-cpu | anchors-smoke | ..."""

from __future__ import annotations

import argparse
import asyncio
import sys

from .provenance import stamp
from .run import RunConfig, run, write_json
from .workloads import WORKLOADS

POLICIES = ("prefix", "round-robin", "random", "least-loaded", "chwbl")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one workload through one router configuration")
    r.add_argument("--workload", choices=WORKLOADS, required=True)
    r.add_argument("--router", choices=POLICIES, default="prefix")
    r.add_argument("--replicas", type=int, default=8)
    r.add_argument("--rate", type=float, default=10.0, help="requests per second")
    r.add_argument("--seconds", type=float, default=60.0)
    r.add_argument("--router-replicas", type=int, default=1)
    r.add_argument("--store", choices=("local", "redis"), default="local")
    r.add_argument("--redis-url")
    r.add_argument("--profile", default="llama-3.1-70b-h100")
    r.add_argument("--time-scale", type=float, default=1.0)
    r.add_argument("--kv-capacity", type=int)
    r.add_argument("--seed", type=int, default=7)
    r.add_argument("--router-config", help="a router settings YAML passed to every router")
    r.add_argument("--json", dest="json_out")
    r.add_argument("--requests-out", help="JSON Lines of every request (TTFT, cached tokens, ...)")
    o = sub.add_parser("overhead", help="router overhead vs direct calls to a zero-latency sim")
    o.add_argument("--rate", type=float, default=500)
    o.add_argument("--seconds", type=float, default=20)
    o.add_argument("--store", choices=("local", "redis"), default="local")
    o.add_argument("--json", dest="json_out")
    from .overhead import add_arguments as overhead_all_arguments

    overhead_all_arguments(
        sub.add_parser("overhead-all", help="overhead of ours and of each anchor router")
    )
    d = sub.add_parser("demo", help="system-prompts through prefix, round-robin, least-loaded")
    d.add_argument("--seconds", type=float, default=45)
    d.add_argument("--rate", type=float, default=None)
    s = sub.add_parser("suite", help="the committed results of bench/results")
    s.add_argument("--quick", action="store_true")
    s.add_argument("--only", choices=("routing", "sweep", "overhead"))
    s.add_argument("--repeat", type=int, default=3,
                   help="runs of each routing pair (medians and spreads are reported)")
    f = sub.add_parser("fault", help="kill redis-server mid-run under 3 routers; plot recovery")
    f.add_argument("--rate", type=float, default=24.0)
    f.add_argument("--seconds", type=float, default=120.0)
    sub.add_parser("redis-memory", help="Redis memory per million ownership entries")
    so = sub.add_parser("scale-out", help="4 replicas become 8 mid-run, warm start on/off")
    so.add_argument("--rate", type=float, default=16.0)
    so.add_argument("--seconds", type=float, default=90.0)
    ss = sub.add_parser("shared-store", help="1 router vs 3 on Redis vs 3 local (issue 4)")
    ss.add_argument("--workloads", nargs="+", default=["system-prompts", "customers"])
    ss.add_argument("--rate", type=float, default=24.0)
    ss.add_argument("--seconds", type=float, default=60.0)
    sub.add_parser("report", help="rebuild bench/results/README.md from the JSON files")
    from .compare import ROUTERS as CHECK_ROUTERS

    lp = sub.add_parser("long-point", help="one workload and rate, long, through router setups")
    lp.add_argument("--workload", default="multi-turn", choices=WORKLOADS)
    lp.add_argument("--rate", type=float, default=32.0)
    lp.add_argument("--seconds", type=float, default=30.0)
    lp.add_argument("--repeat", type=int, default=2)
    lp.add_argument("--setups", nargs="+", default=["prefix", "sglang-cache_aware"],
                    help="router names, or prefix,key=value[,key=value] (router settings)")
    lp.add_argument("--tag", default="", help="suffix of the result file (keeps other runs)")
    hw = sub.add_parser("hit-wait", help="where a hit's TTFT goes, from --requests-out files")
    hw.add_argument("files", nargs="+")
    hw.add_argument("--profile", default="llama-3.1-70b-h100")
    from .first_chunk import add_arguments as first_chunk_arguments

    first_chunk_arguments(sub.add_parser(
        "first-chunk", help="client-to-engine time to the first chunk: direct, pipe, router"))
    from .stream_cpu import add_arguments as stream_cpu_arguments

    stream_cpu_arguments(sub.add_parser(
        "stream-cpu", help="CPU per streamed token of the simulator and the load generator"))
    cc = sub.add_parser("client-check",
                        help="the same requests from our load generator and inference-perf")
    cc.add_argument("--workload", default="system-prompts",
                    choices=[w for w in WORKLOADS if w != "multi-turn"])
    cc.add_argument("--routers", nargs="+", default=["prefix", "round-robin"],
                    choices=CHECK_ROUTERS)
    cc.add_argument("--rate", type=float, default=8.0)
    cc.add_argument("--requests", type=int, default=240)
    a = sub.add_parser("anchors-smoke", help="anchor routers, then third-party clients")
    a.add_argument("--sims", type=int, default=3)
    a.add_argument("--rate", type=float, default=5.0)
    a.add_argument("--seconds", type=float, default=10.0)
    a.add_argument("--no-client", action="store_true", help="skip the third-party clients")
    from .compare import add_arguments as compare_arguments

    compare_arguments(sub.add_parser("compare", help="every router and anchor side by side"))
    au = sub.add_parser("autoscale", help="cache pressure -> real HPA -> operator -> kwok pods")
    au.add_argument("--rate", type=float, default=4.0, help="requests per second")
    au.add_argument("--ramp-seconds", type=float, default=120.0)
    au.add_argument("--hold-seconds", type=float, default=30.0)
    au.add_argument("--stabilization-seconds", type=int, default=30)
    au.add_argument("--max-replicas", type=int, default=6)
    au.add_argument("--out", default="bench/results/autoscale")
    au.add_argument("--report-only", action="store_true",
                    help="rebuild summary, plot and README from the out dir's autoscale.json")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()  # the load generator's own overhead is part of what it measures
    except ImportError:
        pass

    if args.cmd == "run":
        cfg = RunConfig(
            workload=args.workload,
            router=args.router,
            replicas=args.replicas,
            rate=args.rate,
            seconds=args.seconds,
            router_replicas=args.router_replicas,
            store=args.store,
            profile=args.profile,
            time_scale=args.time_scale,
            kv_capacity=args.kv_capacity,
            seed=args.seed,
            redis_url=args.redis_url,
            router_args=("--config", args.router_config) if args.router_config else (),
            requests_out=args.requests_out,
        )
        # host and time: the same code measured differently on the hosts sessions ran on
        write_json({**asyncio.run(run(cfg)), **stamp()}, args.json_out)
    elif args.cmd == "overhead":
        from .overhead import measure

        write_json(asyncio.run(measure(args.rate, args.seconds, store=args.store)), args.json_out)
    elif args.cmd == "overhead-all":
        from .overhead import main_all

        main_all(args)
    elif args.cmd == "demo":
        from .demo import demo

        demo(args.seconds, args.rate)
    elif args.cmd == "suite":
        from .suite import suite

        suite(quick=args.quick, only=args.only, repeat=1 if args.quick else args.repeat)
    elif args.cmd == "long-point":
        from .long_point import main as long_point_main

        r = long_point_main(args.workload, args.rate, args.seconds, args.repeat, args.setups,
                            args.tag)
        for setup, fig in r["summary"].items():
            print(setup, fig)
    elif args.cmd == "hit-wait":
        from .hit_wait import main as hit_wait_main

        print(hit_wait_main(args.files, args.profile))
    elif args.cmd == "first-chunk":
        from .first_chunk import main as first_chunk_main

        first_chunk_main(args)
    elif args.cmd == "stream-cpu":
        from .stream_cpu import main as stream_cpu_main

        r = stream_cpu_main(args)
        print(f"simulator {r['sim_us_per_token']} us/token, "
              f"load generator {r['client_us_per_token']} us/token")
    elif args.cmd == "client-check":
        from .client_check import main as client_check_main

        r = client_check_main(args.workload, args.routers, args.rate, args.requests)
        for router, v in r["verdicts"].items():
            print(f"{router}: {v}")
    elif args.cmd == "fault":
        from .fault import main as fault_main

        r = fault_main(args.rate, args.seconds)
        print(f"failed requests {r['failed_requests']}, recovery {r['recovery_s']} s")
    elif args.cmd == "scale-out":
        from .scale_out import main as scale_main

        r = scale_main(args.rate, args.seconds)
        for one in r["runs"]:
            print(f"warm_start={one['warm_start']}: 40% share after {one['seconds_to_40pct']} s; "
                  f"first 30 s after the join {one['first_30s_after_join']}; "
                  f"failed {one['failed_requests']}")
    elif args.cmd == "shared-store":
        from .shared_store import main as shared_main

        print(shared_main(args.workloads, args.rate, args.seconds))
    elif args.cmd == "redis-memory":
        from .redis_memory import main as memory_main

        print(memory_main())
    elif args.cmd == "report":
        from .suite import write_readme

        write_readme()
    elif args.cmd == "anchors-smoke":
        from .anchors import smoke

        asyncio.run(smoke(args.sims, args.rate, args.seconds, client=not args.no_client))
    elif args.cmd == "compare":
        from .compare import main as compare_main

        compare_main(args)
    elif args.cmd == "autoscale":
        from pathlib import Path

        from .autoscale import Settings, rebuild
        from .autoscale import main as autoscale_main

        if args.report_only:
            r = rebuild(Path(args.out))
        else:
            r = autoscale_main(Settings(rate=args.rate, ramp_s=args.ramp_seconds,
                                        hold_s=args.hold_seconds,
                                        scale_down_stabilization_s=args.stabilization_seconds,
                                        max_replicas=args.max_replicas), Path(args.out))
        m = r["summary"]
        print(f"peak cache pressure {m['peak_cache_pressure']}, max replicas "
              f"{m['max_spec_replicas']}, first scale-up {m['seconds_to_first_scale_up']} s "
              f"after the pressure went over target, back to min "
              f"{m['seconds_load_stop_to_min']} s after the load stopped")
    else:  # pragma: no cover
        sys.exit(2)


if __name__ == "__main__":
    main()
