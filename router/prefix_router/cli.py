"""`prefix-router`: flags and config file -> settings -> serve."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from .app import serve
from .config import POLICIES, load_settings
from .tokens import fetch_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Each flag's dest is the (dotted) key of the setting it overrides."""
    p = argparse.ArgumentParser(
        prog="prefix-router", description="Prefix-aware router for LLM inference"
    )
    p.add_argument(
        "--config", default=os.environ.get("PREFIX_ROUTER_CONFIG"), help="YAML settings file"
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--metrics-port", type=int, dest="metrics_port",
                   help="port of /metrics (default 9090; 0: any free port)")
    p.add_argument("--backend", action="append", dest="discovery.backends", metavar="URL",
                   help="a backend base URL (repeatable); comma-separated lists are accepted")
    p.add_argument("--policy", choices=POLICIES)
    p.add_argument("--model", action="append", dest="models", help="served model name (repeatable)")
    p.add_argument("--block-size", type=int, help="hash block size in tokens")
    p.add_argument("--load-bound", type=float, help="bounded-load epsilon")
    p.add_argument("--kv-capacity-tokens", type=int, help="per-backend KV capacity in tokens")
    p.add_argument("--ttl-seconds", type=float)
    p.add_argument("--discovery", dest="discovery.mode", choices=("static", "file", "kubernetes"),
                   help="where backends come from")
    p.add_argument("--backends-file", dest="discovery.file", metavar="BACKENDS_FILE",
                   help="file discovery: base URLs, one per line, re-read")
    p.add_argument("--service", dest="discovery.service", metavar="SERVICE",
                   help="kubernetes discovery: the model-server Service")
    p.add_argument("--namespace", dest="discovery.namespace", metavar="NAMESPACE",
                   help="kubernetes discovery: its namespace")
    p.add_argument("--backend-port", type=int, dest="discovery.port", metavar="BACKEND_PORT",
                   help="kubernetes discovery: the engine port")
    p.add_argument("--kubeconfig", dest="discovery.kubeconfig", metavar="KUBECONFIG",
                   help="kubernetes discovery: kubeconfig (default: in-cluster)")
    p.add_argument("--store", dest="store.mode", choices=("local", "redis"))
    p.add_argument("--redis-url", dest="store.url", metavar="REDIS_URL")
    p.add_argument("--model-key", help="key namespace of this model in the shared store")
    p.add_argument("--log-level")
    p.add_argument("--expose-routing", action="store_true", default=None,
                   help="tell clients where each request went (x-routed-to, x-route-reason)")
    p.add_argument("--log-decisions", action="store_true", default=None,
                   help="log one line per routing decision, with its reason")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    overrides = vars(parse_args(argv))
    config = overrides.pop("config")
    backends = overrides["discovery.backends"]
    if backends:
        overrides["discovery.backends"] = [u for item in backends for u in item.split(",")
                                           if u.strip()]  # fmt: skip
    try:
        settings = load_settings(config, overrides)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"prefix-router: invalid settings: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if settings.tokenizer:
        cache = Path(os.environ.get("PREFIX_ROUTER_CACHE", Path.home() / ".cache/prefix-router"))
        try:
            local = fetch_tokenizer(settings.tokenizer, cache / "tokenizers")
        except OSError as exc:
            print(f"prefix-router: cannot fetch the tokenizer {settings.tokenizer}: {exc}",
                  file=sys.stderr)
            sys.exit(2)
        settings = settings.model_copy(update={"tokenizer": str(local)})
    if settings.discovery.mode == "static" and not settings.discovery.backends:
        logging.getLogger("prefix_router").warning("no backends configured: every request gets 503")
    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        log = logging.getLogger("prefix_router")

        def on_signal(name: str) -> None:
            # The first signal drains (app.serve); more signals do not cut the drain short:
            # a second SIGTERM must not turn a graceful stop into cut streams.
            if stop.is_set():
                log.info("%s again: already draining", name)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)
        await serve(settings, stop, ready=settle_gc)

    # Large requests are parsed and hashed in a worker thread (offload.py): the event loop gets
    # the GIL back every switch interval, 1 ms instead of the default 5, so probes and streams
    # wait less behind them.
    sys.setswitchinterval(0.001)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(run())


def settle_gc(_port: int) -> None:
    """Once serving: what start-up made (modules, the tokenizer, the app) is never scanned
    again, and collections come less often: a full collection over a large index stalls every
    request in flight (measured in bench/results/gc-ab/)."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


if __name__ == "__main__":
    main()
