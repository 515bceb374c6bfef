"""Capture the exact ZMQ frames a vLLM KV-event subscriber receives, from vLLM's own code.

Nothing of vLLM is in this file or in the repository: it imports `vllm/distributed/kv_events.py`
from an unpacked vLLM wheel, with tiny stand-ins for the three vLLM modules that file imports
(config, logger, the ExternalBlockHash alias), runs vLLM's ZmqEventPublisher on ipc:// sockets
and records, for a fixed set of events:
  - the live frames a SUB socket receives: [topic, seq (8 bytes big-endian), msgpack payload];
  - the frames a DEALER socket receives from the replay ROUTER socket after asking for a replay
    from sequence 1, including the end-of-replay marker.

Usage (see tests/fixtures/vllm-kv-events/README.md for the full recipe):
    pip download vllm==0.34.0 --no-deps -d /tmp/vllm-whl
    unzip -q /tmp/vllm-whl/vllm-0.34.0-*.whl 'vllm/distributed/kv_events.py' \
        'vllm/_version.py' -d /tmp/vllm-src/0.34.0
    python hack/capture-vllm-kv-events.py /tmp/vllm-src/0.34.0 \
        -o tests/fixtures/vllm-kv-events/0.34.0-map.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

TOPIC = "kv@sim-0@sim-model"
BLOCK_SIZE = 16
# Hashes as vLLM publishes them by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the low 64
# bits of the block's digest, unsigned. Two of them are >= 2**63 on purpose: a decoder that
# reads them as signed 64-bit integers is wrong.
PARENT = 0x0123456789ABCDEF
CHAIN = [0xF00DFACE00000001, 0x1BADB00200000002, 0x8000000000000003]
LORA_CHAIN = [0x7EADBEEF00000010, 0xCAFEBABE00000011]
# With VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 vLLM publishes the raw digest (32 bytes of sha256).
BYTES_PARENT = hashlib.sha256(b"parent").digest()
BYTES_BLOCK = hashlib.sha256(b"block").digest()
TOKENS = list(range(1000, 1000 + 3 * BLOCK_SIZE))
LORA_TOKENS = list(range(2000, 2000 + 2 * BLOCK_SIZE))
TS = [1_790_000_000.25, 1_790_000_000.5, 1_790_000_000.75, 1_790_000_001.0, 1_790_000_001.25]

_STUBS = {
    "vllm/__init__.py": "",
    "vllm/config/__init__.py": "from .kv_events import KVEventsConfig\n",
    # Only the type name is used by kv_events.py (annotations and the factory); the fields
    # are vLLM's documented KVEventsConfig fields with their defaults.
    "vllm/config/kv_events.py": (
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class KVEventsConfig:\n"
        "    enable_kv_cache_events: bool = False\n"
        "    publisher: str = 'null'\n"
        "    endpoint: str = 'tcp://*:5557'\n"
        "    replay_endpoint: str | None = None\n"
        "    buffer_steps: int = 10_000\n"
        "    hwm: int = 100_000\n"
        "    max_queue_size: int = 100_000\n"
        "    topic: str = ''\n"
    ),
    "vllm/logger.py": "import logging\ninit_logger = logging.getLogger\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/kv_cache_utils.py": (
        "from typing import Union\nExternalBlockHash = Union[bytes, int]\n"
    ),
    "vllm/distributed/__init__.py": "",
    "vllm/utils/__init__.py": "",
    # Used only when an endpoint is tcp://*:0 (not here).
    "vllm/utils/network_utils.py": (
        "def get_ip(): raise RuntimeError('not used')\n"
        "def get_tcp_uri(ip, port): return f'tcp://{ip}:{port}'\n"
        "def is_valid_ipv6_address(ip): return ':' in ip\n"
        "def split_zmq_path(path): raise RuntimeError('not used')\n"
    ),
}


def _tree(src: Path, into: Path) -> None:
    for rel, text in _STUBS.items():
        p = into / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    shutil.copy(src / "vllm/distributed/kv_events.py", into / "vllm/distributed/kv_events.py")


def _version(src: Path) -> tuple[str, str]:
    text = (src / "vllm/_version.py").read_text()
    version = re.search(r"__version__ = version = '([^']+)'", text)
    commit = re.search(r"__commit_id__ = commit_id = '([^']+)'", text)
    return (version.group(1) if version else "?", commit.group(1) if commit else "?")


def _make(cls: type, **fields: Any) -> Any:
    """Build a vLLM struct from the fields this version declares (older versions lack some)."""
    declared = set(cls.__struct_fields__)
    return cls(**{k: v for k, v in fields.items() if k in declared})


def _batches(kv: Any) -> list[Any]:
    stored = _make(
        kv.BlockStored,
        block_hashes=CHAIN,
        parent_block_hash=PARENT,
        token_ids=TOKENS,
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None, None, None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    stored_lora = _make(
        kv.BlockStored,
        block_hashes=LORA_CHAIN,
        parent_block_hash=None,
        token_ids=LORA_TOKENS,
        block_size=BLOCK_SIZE,
        lora_id=1,
        medium="GPU",
        lora_name="sql-lora",
        # vLLM's event extra keys: the LoRA name on every block, the cache salt on block 0 only
        extra_keys=[("sql-lora", "tenant-a"), ("sql-lora",)],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    removed = _make(kv.BlockRemoved, block_hashes=[CHAIN[2]], medium="GPU", group_idx=0)
    removed_lora = _make(kv.BlockRemoved, block_hashes=[LORA_CHAIN[1]], medium="GPU", group_idx=0)
    stored_bytes = _make(
        kv.BlockStored,
        block_hashes=[BYTES_BLOCK],
        parent_block_hash=BYTES_PARENT,
        token_ids=TOKENS[:BLOCK_SIZE],
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    events = [[stored], [stored_lora], [removed, removed_lora], [kv.AllBlocksCleared()]]
    if hasattr(kv, "ExternalBlockHash"):  # bytes hashes exist from vLLM 0.10.2 on
        events.append([stored_bytes])
    return [kv.KVEventBatch(ts=TS[i], events=e) for i, e in enumerate(events)]


def _plain(obj: Any) -> Any:
    """msgpack-decoded value -> JSON (bytes as {"hex": ...}, so nothing is lost)."""
    if isinstance(obj, bytes):
        return {"hex": obj.hex()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _logical(batch: Any) -> dict[str, Any]:
    """What the batch means, the same for every version and encoding."""
    events = []
    for ev in batch.events:
        d = {"type": type(ev).__name__}
        for f in ev.__struct_fields__:
            d[f] = _plain(getattr(ev, f))
        events.append(d)
    return {"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank, "events": events}


def capture(src: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="vllm-kv-"))
    _tree(src, work / "tree")
    sys.path.insert(0, str(work / "tree"))
    kv = importlib.import_module("vllm.distributed.kv_events")
    version, commit = _version(src)
    pub_ep, replay_ep = f"ipc://{work}/pub.sock", f"ipc://{work}/replay.sock"
    kwargs = dict(endpoint=pub_ep, replay_endpoint=replay_ep, buffer_steps=100, topic=TOPIC)
    if "data_parallel_rank" in inspect.signature(kv.ZmqEventPublisher.__init__).parameters:
        kwargs["data_parallel_rank"] = 0
    publisher = kv.ZmqEventPublisher(**kwargs)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
    sub.connect(pub_ep)
    time.sleep(1.0)  # PUB/SUB joins late; a throwaway capture can afford to wait
    batches = _batches(kv)
    logical = []
    for b in batches:
        publisher.publish(b)
        logical.append(_logical(b))
    live = []
    for _ in batches:
        if not sub.poll(10_000):
            raise SystemExit("no live frame within 10 s")
        live.append(sub.recv_multipart())
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_ep)
    request = [b"", (1).to_bytes(8, "big")]
    dealer.send_multipart(request)
    replay = []
    while True:
        if not dealer.poll(10_000):
            raise SystemExit("replay did not end within 10 s")
        frames = dealer.recv_multipart()
        replay.append(frames)
        if frames[-2] == (-1).to_bytes(8, "big", signed=True):
            break
    publisher.shutdown()
    for s in (sub, dealer):
        s.close(linger=0)
    array_events = bool(kv.KVCacheEvent.__struct_config__.array_like)
    return {
        "vllm_version": version,
        "vllm_commit": commit,
        "kv_events_py_sha256": hashlib.sha256(
            (src / "vllm/distributed/kv_events.py").read_bytes()
        ).hexdigest(),
        "msgspec_version": msgspec.__version__,
        "pyzmq_version": zmq.__version__,
        "event_encoding": "array" if array_events else "map",
        "batch_encoding": "array" if kv.EventBatch.__struct_config__.array_like else "map",
        "topic": TOPIC,
        "live": [
            {
                "frames_hex": [f.hex() for f in frames],
                "seq": int.from_bytes(frames[1], "big"),
                "msgpack": _plain(msgspec.msgpack.decode(frames[2])),
                "meaning": logical[i],
            }
            for i, frames in enumerate(live)
        ],
        "replay_request_frames_hex": [f.hex() for f in request],
        "replay_frames_hex": [[f.hex() for f in frames] for frames in replay],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vllm_src", type=Path, help="a directory holding vllm/distributed/kv_events.py")
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    out = capture(args.vllm_src)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(
        f"{args.out}: vLLM {out['vllm_version']} events={out['event_encoding']}, "
        f"{len(out['live'])} live messages, {len(out['replay_frames_hex'])} replay messages"
    )


if __name__ == "__main__":
    main()
