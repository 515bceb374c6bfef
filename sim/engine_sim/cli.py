"""`engine-sim`: one simulated vLLM replica."""

from __future__ import annotations

import argparse
import asyncio
import logging

from aiohttp import web

from .engine import Engine
from .profiles import PROFILES
from .server import build_app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="engine-sim", description="vLLM-compatible engine simulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="sim-model")
    p.add_argument("--served-model-name", action="append", default=None)
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="KV-cache capacity in tokens (default: the profile's)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated duration (0.1 = ten times faster)",
    )
    p.add_argument("--replica-id", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    profile = PROFILES[args.profile]
    kv = args.kv_capacity_tokens or profile.default_kv_capacity_tokens
    served = args.served_model_name or [args.model]
    replica = args.replica_id or f"{args.host}:{args.port}"

    async def run() -> None:
        engine = Engine(profile, kv, args.block_size, args.max_num_seqs, args.time_scale)
        app = build_app(
            model=args.model,
            served=served,
            engine=engine,
            max_model_len=args.max_model_len,
            replica_id=replica,
        )
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port, backlog=1024).start()
        logging.info(
            "engine-sim %s listening on %s:%d profile=%s kv=%d tokens",
            replica,
            args.host,
            args.port,
            profile.name,
            kv,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
