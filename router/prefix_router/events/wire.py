"""vLLM's KV-event batches, decoded from either encoding (docs/kv-events.md).

A batch is `[ts, events]` or `[ts, events, data_parallel_rank]` (a map in one unreleased
commit: accepted too). An event is a tagged array, `[tag, field, ...]` by position (vLLM up
to 0.23), or a map tagged by `type` (vLLM 0.24 on), by name. Fields a release does not send
are None; fields it adds later are ignored. Hashes are ints (signed or unsigned 64-bit) or
bytes; either is only ever compared with itself. Anything that does not decode is an error
for the caller to count, never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

Hash = int | bytes

_DECODER = msgspec.msgpack.Decoder()

# Field positions in the array encoding (after the tag at 0).
_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
           "medium", "lora_name", "extra_keys", "group_idx")  # fmt: skip
_REMOVED = ("block_hashes", "medium", "group_idx")


class WireError(ValueError):
    """A batch that is not a KV-event batch."""


@dataclass(slots=True)
class Stored:
    hashes: list[Hash]
    parent: Hash | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None
    extra_keys: list[Any] | None


@dataclass(slots=True)
class Removed:
    hashes: list[Hash]


@dataclass(slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event]
    rank: int | None


def _fields(raw: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        return str(raw.get("type", "")), raw
    if isinstance(raw, list) and raw:
        return str(raw[0]), dict(zip(names, raw[1:], strict=False))
    raise WireError(f"an event is neither an array nor a map: {type(raw).__name__}")


def _is_main_cache(f: dict[str, Any]) -> bool:
    """vLLM's own GPU cache, first KV group: offloading tiers and other groups are not it."""
    return f.get("medium") in (None, "GPU") and f.get("group_idx") in (None, 0)


def _hashes(value: Any) -> list[Hash]:
    if not isinstance(value, list) or not all(isinstance(h, (int, bytes)) for h in value):
        raise WireError("block_hashes is not a list of ints or bytes")
    return value


def _event(raw: Any) -> Event | None:
    tag = raw.get("type") if isinstance(raw, dict) else (raw[0] if raw else None)
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED)
        if not _is_main_cache(f):
            return None
        tokens = f.get("token_ids")
        size = f.get("block_size")
        parent = f.get("parent_block_hash")
        if not isinstance(tokens, list) or not isinstance(size, int) or size <= 0:
            raise WireError("BlockStored without token_ids or block_size")
        if parent is not None and not isinstance(parent, (int, bytes)):
            raise WireError("parent_block_hash is not a hash")
        lora = f.get("lora_name")
        extra = f.get("extra_keys")
        return Stored(_hashes(f.get("block_hashes")), parent, tokens, size,
                      lora if isinstance(lora, str) else None,
                      extra if isinstance(extra, list) else None)  # fmt: skip
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED)
        return Removed(_hashes(f.get("block_hashes"))) if _is_main_cache(f) else None
    if tag == "AllBlocksCleared":
        return Cleared()
    return None  # an event type this router does not know: not its business


def decode_batch(payload: bytes) -> Batch:
    try:
        raw = _DECODER.decode(payload)
    except msgspec.DecodeError as exc:
        raise WireError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) in (2, 3):
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) == 3 else None
    else:
        raise WireError("a batch is neither [ts, events(, rank)] nor a map")
    if not isinstance(events, list) or not isinstance(ts, (int, float)):
        raise WireError("a batch without a timestamp or a list of events")
    out = [e for e in map(_event, events) if e is not None]
    return Batch(float(ts), out, rank if isinstance(rank, int) else None)


def salt_of(stored: Stored) -> str | None:
    """The cache salt the first block's hash covered: vLLM puts it in that block's extra keys
    (after the LoRA name, when there is one)."""
    keys = stored.extra_keys
    if not keys or not isinstance(keys[0], (list, tuple)):
        return None
    for item in keys[0]:
        if isinstance(item, str) and item != stored.lora_name:
            return item
    return None
