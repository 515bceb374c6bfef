"""`engine-sim`: run one simulated vLLM replica.

    engine-sim --host 127.0.0.1 --port 8001 --model sim-model --kv-capacity-tokens 32768 \\
        --block-size 16 --max-num-seqs 64 --profile fast --time-scale 1.0 \\
        --replica-id sim0 --max-model-len 32768

--time-scale multiplies every simulated duration before the engine sleeps it: 1.0 is real
time for the profile, 0.1 runs ten times faster than real time, 0 disables waiting (like the
`zero` profile). Latency metrics are wall-clock, so they scale with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from .profiles import PROFILES, get_profile
from .server import ENGINE, SimConfig, make_app

log = logging.getLogger("engine_sim")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="engine-sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="sim-model", help="model name served (as vLLM's --model)")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="names the model is served under instead of --model (the first one is reported)",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=None,
        help="KV cache size in tokens (default: the profile's)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--profile", choices=sorted(PROFILES), default="fast")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every simulated duration (0.1 = ten times faster than real time)",
    )
    p.add_argument("--replica-id", default=None, help="reported in /stats and x-replica-id")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    for name in ("kv_capacity_tokens", "block_size", "max_num_seqs", "max_model_len"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.time_scale < 0:
        p.error("--time-scale must be >= 0")
    if args.kv_capacity_tokens is not None and args.kv_capacity_tokens < args.block_size:
        p.error("--kv-capacity-tokens must hold at least one block")
    return args


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        model=args.model,
        served_model_names=list(args.served_model_name or []),
        profile=get_profile(args.profile),
        kv_capacity_tokens=args.kv_capacity_tokens,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        time_scale=args.time_scale,
        replica_id=args.replica_id or f"{args.host}:{args.port}",
        max_model_len=args.max_model_len,
    )


async def serve(cfg: SimConfig, host: str, port: int) -> None:
    app = make_app(cfg)
    # Cancel a handler whose client disconnected, so its slot and KV blocks are freed at
    # once instead of when the simulated generation would have ended.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    engine = app[ENGINE]
    log.info(
        "engine-sim %s listening on http://%s:%d (model=%s, profile=%s, time_scale=%g, "
        "kv_capacity_tokens=%d, block_size=%d, max_num_seqs=%d)",
        cfg.replica_id,
        host,
        port,
        cfg.served[0],
        cfg.profile.name if cfg.profile else "?",
        cfg.time_scale,
        engine.cache.capacity_tokens,
        cfg.block_size,
        cfg.max_num_seqs,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = config_from_args(args)
    profile = get_profile(args.profile)
    if cfg.max_model_len > (cfg.kv_capacity_tokens or profile.default_kv_capacity_tokens):
        log.warning("max_model_len exceeds the KV cache: the longest requests will be refused")
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(cfg, args.host, args.port))
    else:
        uvloop.run(serve(cfg, args.host, args.port))
