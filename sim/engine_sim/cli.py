"""`engine-sim`: one simulated vLLM replica."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path

from aiohttp import web

from .engine import PREEMPTION, Engine
from .kvevents import ENCODINGS, KVEventPublisher, KVEventsConfig
from .profiles import PROFILES
from .sequences import LoRA
from .server import build_app


def _lora_modules(values: list[str]) -> list[LoRA]:
    """vLLM's --lora-modules: name=path, or JSON {"name": ..., "path": ...}; ids from 1."""
    out = []
    for i, v in enumerate(values, start=1):
        if v.lstrip().startswith("{"):
            d = json.loads(v)
            name, path = d["name"], d["path"]
        else:
            name, _, path = v.partition("=")
        if not name or not path:
            raise SystemExit(f"--lora-modules: {v!r} is not name=path")
        out.append(LoRA(i, name, path))
    return out


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
    p.add_argument(
        "--tokenizer",
        default=None,
        help="a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with a "
        "chat_template), or 'tiny' for the one shipped here; default: 4 bytes a token",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        help='vLLM\'s JSON, e.g. \'{"enable_kv_cache_events": true, "endpoint": '
        '"tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558"}\'',
    )
    p.add_argument(
        "--kv-events-encoding",
        choices=ENCODINGS,
        default="map",
        help="events as maps tagged by type (vLLM >= 0.24) or tagged arrays (vLLM <= 0.23)",
    )
    p.add_argument(
        "--block-hash-seed",
        default=None,
        help="seed of the engine's block hashes (default: PYTHONHASHSEED, else random)",
    )
    p.add_argument(
        "--preemption",
        choices=PREEMPTION,
        default=None,
        help="when a sequence cannot grow: preempt as vLLM v1 (recompute; the default with "
        "--tokenizer) or over-commit the cache briefly (off; the default without)",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens as vLLM does with this flag "
        "(without --tokenizer the simulator always reports it)",
    )
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH")
    p.add_argument(
        "--enable-responses-api-store",
        action="store_true",
        default=os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in ("", "0"),
        help="keep Responses API responses in this process (as vLLM with "
        "VLLM_ENABLE_RESPONSES_API_STORE=1, which sets this too)",
    )
    p.add_argument(
        "--responses-store-max-bytes",
        type=int,
        default=256 * 1024 * 1024,
        help="memory bound of the response store; least recently used responses go past it",
    )
    p.add_argument("--embedding-dim", type=int, default=256, help="pooling vectors' dimension")
    p.add_argument(
        "--max-audio-filesize-mb",
        type=float,
        default=float(os.environ.get("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "25")),
        help="largest audio upload (vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)",
    )
    p.add_argument(
        "--kv-offloading-tokens",
        type=int,
        default=0,
        help="a CPU tier of this many tokens behind the GPU cache (vLLM's CPU offloading): "
        "GPU evictions move there, with KV events for both media; 0: none",
    )
    p.add_argument(
        "--sliding-window",
        type=int,
        default=0,
        help="run a hybrid model: a second KV-cache group with a sliding window of this many "
        "tokens (KV events of group_idx 1), in a pool of --sliding-window-capacity tokens",
    )
    p.add_argument("--sliding-window-capacity", type=int, default=0)
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

    loras = _lora_modules(args.lora_modules)
    events_conf = KVEventsConfig.from_json(args.kv_events_config or "{}")

    async def run() -> None:
        tokenizer = sequences = None
        if args.tokenizer is not None:
            from .hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
            from .kvcache import TokenBlockHasher
            from .sequences import TokenSequences

            path = TINY_TOKENIZER if args.tokenizer == "tiny" else Path(args.tokenizer)
            tokenizer = ChatTokenizer(path)
            sequences = TokenSequences(
                tokenizer, TokenBlockHasher(args.block_size, args.block_hash_seed)
            )
        preemption = args.preemption or ("recompute" if tokenizer else "off")
        events = None
        if events_conf.active:
            events = KVEventPublisher(events_conf, args.kv_events_encoding, args.block_size)
            logging.info(
                "KV events (%s) on %s, replay %s",
                args.kv_events_encoding,
                events.endpoint,
                events.replay_endpoint,
            )
        engine = Engine(
            profile,
            kv,
            args.block_size,
            args.max_num_seqs,
            args.time_scale,
            sequences=sequences,
            preemption=preemption,
            events=events,
            cpu_offload_tokens=args.kv_offloading_tokens,
            window_tokens=args.sliding_window,
            window_capacity_tokens=args.sliding_window_capacity,
        )
        app = build_app(
            model=args.model,
            served=served,
            engine=engine,
            max_model_len=args.max_model_len,
            replica_id=replica,
            tokenizer=tokenizer,
            loras=loras,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
            responses_store=args.enable_responses_api_store,
            responses_store_max_bytes=args.responses_store_max_bytes,
            embedding_dim=args.embedding_dim,
            max_audio_bytes=int(args.max_audio_filesize_mb * 1024 * 1024),
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
