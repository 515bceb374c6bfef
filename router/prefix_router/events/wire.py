"""vLLM's KV-event batches, decoded from either encoding (docs/kv-events.md).

A batch is `[ts, events]`, `[ts, events, data_parallel_rank]`, or, from a publisher with
vLLM's opt-in snapshot service (vLLM PR #57789), `[ts, events, rank, publisher_id]`; or the
same as a map by name (vLLM commit 0181ea3173e5's `EventBatch`). An event is a
tagged array, `[tag, field, ...]` by position (vLLM up to 0.23), or a map tagged by `type`
(vLLM 0.24 on), by name. Fields a release does not send are None; fields it adds later are
ignored. Hashes are ints (signed or unsigned 64-bit) or bytes; either is only ever compared
with itself. Every medium and every KV-cache group is decoded: what each means for a hit is
the index's business (index/tiers.py). Anything that does not decode is an error for the
caller to count, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

Hash = int | bytes

_DECODER = msgspec.msgpack.Decoder()

GPU = "GPU"  # vLLM's own block pool; offloading connectors send "CPU", "STORAGE", ...

# Field positions in the array encoding (after the tag at 0).
_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
           "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
           "kv_cache_spec_sliding_window")  # fmt: skip
_REMOVED = ("block_hashes", "medium", "group_idx")


class WireError(ValueError):
    """A batch that is not a KV-event batch."""


@dataclass(slots=True)
class Stored:
    hashes: list[Hash]
    parent: Hash | None
    token_ids: list[int]  # empty: an offloading connector's placeholder (hashes only)
    block_size: int
    lora_name: str | None
    extra_keys: list[Any] | None
    medium: str = GPU
    group: int = 0
    kind: str | None = None  # the group's kv_cache_spec_kind (vLLM >= 0.22), e.g. "mamba"
    window: int | None = None  # its sliding window in tokens, for a sliding-window group


@dataclass(slots=True)
class Removed:
    hashes: list[Hash]
    medium: str = GPU
    group: int = 0


@dataclass(slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event]
    rank: int | None
    publisher: bytes | None = None  # a snapshot-mode publisher's lifetime id (16 bytes)


def _fields(raw: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        return str(raw.get("type", "")), raw
    if isinstance(raw, list) and raw:
        return str(raw[0]), dict(zip(names, raw[1:], strict=False))
    raise WireError(f"an event is neither an array nor a map: {type(raw).__name__}")


def _medium(f: dict[str, Any]) -> str:
    m = f.get("medium")
    return m.upper() if isinstance(m, str) and m else GPU  # null: releases before 0.10.2


def _group(f: dict[str, Any]) -> int:
    g = f.get("group_idx")
    return g if isinstance(g, int) and g >= 0 else 0


def _hashes(value: Any) -> list[Hash]:
    if not isinstance(value, list) or not all(isinstance(h, (int, bytes)) for h in value):
        raise WireError("block_hashes is not a list of ints or bytes")
    return value


def _event(raw: Any) -> Event | None:
    tag = raw.get("type") if isinstance(raw, dict) else (raw[0] if raw else None)
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED)
        tokens = f.get("token_ids")
        size = f.get("block_size")
        parent = f.get("parent_block_hash")
        if not isinstance(tokens, list) or not isinstance(size, int) or size < 0:
            raise WireError("BlockStored without token_ids or block_size")
        if parent is not None and not isinstance(parent, (int, bytes)):
            raise WireError("parent_block_hash is not a hash")
        lora = f.get("lora_name")
        extra = f.get("extra_keys")
        kind = f.get("kv_cache_spec_kind")
        window = f.get("kv_cache_spec_sliding_window")
        return Stored(_hashes(f.get("block_hashes")), parent, tokens, size,
                      lora if isinstance(lora, str) else None,
                      extra if isinstance(extra, list) else None, _medium(f), _group(f),
                      kind if isinstance(kind, str) else None,
                      window if isinstance(window, int) and window > 0 else None)  # fmt: skip
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED)
        return Removed(_hashes(f.get("block_hashes")), _medium(f), _group(f))
    if tag == "AllBlocksCleared":
        return Cleared()
    return None  # an event type this router does not know: not its business


def decode_batch(payload: bytes) -> Batch:
    try:
        raw = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    publisher = None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
        publisher = raw.get("publisher_id")
    elif isinstance(raw, list) and len(raw) in (2, 3, 4):
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) >= 3 else None
        publisher = raw[3] if len(raw) == 4 else None
    else:
        raise WireError("a batch is neither [ts, events(, rank(, publisher_id))] nor a map")
    if not isinstance(events, list) or not isinstance(ts, (int, float)):
        raise WireError("a batch without a timestamp or a list of events")
    out = [e for e in map(_event, events) if e is not None]
    return Batch(float(ts), out, rank if isinstance(rank, int) else None,
                 publisher if isinstance(publisher, bytes) else None)  # fmt: skip


def salt_of(stored: Stored) -> str | None:
    """The cache salt the first block's hash covered. vLLM's extra keys for a block are, in
    order, the LoRA name, the multimodal items ((identifier, offset) pairs; a bare identifier
    in some releases), the cache salt (block 0 only) and prompt-embedding digests (bytes): so
    the salt is block 0's last string that is not the LoRA name."""
    keys = stored.extra_keys
    if not keys or not isinstance(keys[0], (list, tuple)):
        return None
    strings = [k for k in keys[0] if isinstance(k, str)]
    if strings and stored.lora_name is not None and strings[0] == stored.lora_name:
        strings = strings[1:]
    return strings[-1] if strings else None
