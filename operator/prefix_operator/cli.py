"""`prefix-operator`: run the PrefixRoutedModel operator (kopf) with our handlers."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import kopf

from .config import OperatorConfig
from .handlers import Runtime, register


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="prefix-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="watch this namespace (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch the whole cluster (the default when no --namespace)")
    p.add_argument("--standalone", action="store_true",
                   help="no peering: run even if another operator instance exists")
    p.add_argument("--peering", default=None,
                   help="kopf peering object name (several replicas, one active)")
    p.add_argument("--liveness", default="http://0.0.0.0:8081/healthz",
                   help="kopf liveness endpoint URL ('' to disable)")
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
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = OperatorConfig.from_env().with_overrides(
        router_image=args.router_image, vllm_image=args.vllm_image,
        sglang_image=args.sglang_image, redis_image=args.redis_image,
        resync_seconds=args.resync_seconds, figures_seconds=args.figures_seconds,
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
    kopf.run(
        registry=registry,
        standalone=args.standalone or not args.peering,
        peering_name=args.peering,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=args.liveness or None,
    )


if __name__ == "__main__":
    main()
