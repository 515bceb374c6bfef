"""`prefix-operator`: run the PrefixRoutedModel operator (kopf) with our handlers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import kopf

from . import leader
from .config import OperatorConfig
from .handlers import Runtime, register


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="prefix-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; glob patterns allowed)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch the whole cluster (the default when no --namespace)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: run even if another operator instance exists",
    )
    p.add_argument(
        "--peering", default=None, help="kopf peering object name (several replicas, one active)"
    )
    elect = p.add_argument_group(
        "leader election",
        "several replicas, one active: the process that holds a "
        "coordination.k8s.io Lease runs the operator, the others wait for it to expire",
    )
    elect.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("PREFIX_OPERATOR_LEADER_ELECTION"),
        help="hold a Lease before reconciling (implies no kopf peering; "
        "default: $PREFIX_OPERATOR_LEADER_ELECTION, else off)",
    )
    elect.add_argument("--lease-name", default=leader.DEFAULT_LEASE_NAME)
    elect.add_argument(
        "--lease-namespace",
        default=None,
        help="default: $POD_NAMESPACE, else the pod's namespace, else default",
    )
    elect.add_argument(
        "--lease-identity",
        default=None,
        help="this candidate's name in the Lease (default: $POD_ID, else "
        "hostname-pid); unique per process",
    )
    elect.add_argument(
        "--lease-duration",
        type=int,
        default=15,
        metavar="SECONDS",
        help="how long a standby waits after the last renewal it saw",
    )
    elect.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="the leader exits when it has not renewed for this long",
    )
    elect.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="between attempts to acquire or renew",
    )
    p.add_argument(
        "--liveness",
        default="http://0.0.0.0:8081/healthz",
        help="kopf liveness endpoint URL ('' to disable)",
    )
    p.add_argument("--router-image", default=None)
    p.add_argument("--vllm-image", default=None)
    p.add_argument("--sglang-image", default=None)
    p.add_argument("--redis-image", default=None)
    p.add_argument("--resync-seconds", type=float, default=None)
    p.add_argument("--figures-seconds", type=float, default=None)
    p.add_argument("--cleanup-attempts", type=int, default=None)
    p.add_argument("--cleanup-backoff-seconds", type=float, default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    if args.leader_election:
        if args.peering:
            # A killed leader's keep-alive would pause its successor until it ages out, and
            # two live peers of one priority pause each other: the Lease alone decides.
            p.error("--peering and --leader-election exclude each other")
        problems = lease_settings(args).problems()
        if problems:
            p.error("leader election: " + "; ".join(problems))
    return args


def lease_settings(args: argparse.Namespace) -> leader.LeaseSettings:
    return leader.LeaseSettings(
        name=args.lease_name,
        namespace=args.lease_namespace or leader.default_namespace(),
        identity=args.lease_identity or leader.default_identity(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = OperatorConfig.from_env().with_overrides(
        router_image=args.router_image,
        vllm_image=args.vllm_image,
        sglang_image=args.sglang_image,
        redis_image=args.redis_image,
        resync_seconds=args.resync_seconds,
        figures_seconds=args.figures_seconds,
        cleanup_attempts=args.cleanup_attempts,
        cleanup_backoff_seconds=args.cleanup_backoff_seconds,
    )
    kopf.configure(verbose=args.verbose, debug=args.debug)
    if not args.verbose and not args.debug:
        logging.getLogger().setLevel(logging.INFO)
        # kopf logs every handler and timer success at INFO: with watched children and
        # timers that is a line per event per second. Our Events carry what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()
    register(registry, Runtime(cfg))
    namespaces = args.namespace
    if not args.leader_election:
        kopf.run(
            registry=registry,
            standalone=args.standalone or not args.peering,
            peering_name=args.peering,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=args.liveness or None,
        )
        return

    def operator() -> Coroutine[Any, Any, None]:
        # Standalone: while it holds the Lease this is the only operator.
        return kopf.operator(
            registry=registry,
            standalone=True,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=args.liveness or None,
        )

    sys.exit(
        asyncio.run(
            leader.run_elected(lease_settings(args), operator, health_url=args.liveness or None)
        )
    )


if __name__ == "__main__":
    main()
