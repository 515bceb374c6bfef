"""KV-event frames for the wire cases the release captures (capture-vllm-kv-events.py) miss:
an offloading tier's events, a hybrid model's KV-cache groups, multimodal keys before the cache
salt, map-encoded batches, and the frames of a publisher with vLLM's snapshot service.

Nothing of vLLM is in this file. The events of vLLM 0.34.0's structs are encoded by vLLM
0.34.0's own `vllm/distributed/kv_events.py` (unpacked from its wheel and imported with the
capture script's stand-ins, as capture-vllm-kv-events.py does). Two shapes no release has:
- the map-encoded batch of vLLM commit 0181ea3173e5 (its `EventBatch` without `array_like`):
  structs declared here with that commit's fields, names, order and options;
- the snapshot service of vLLM PR #57789: its first revision extends the sequence frame to 24
  bytes (the sequence, then the publisher's 16-byte lifetime id); its later one appends the id
  to the batch (`IdentifiedKVEventBatch`: vLLM 0.34.0's `KVEventBatch` and one more trailing
  element), both as the PR's docs/features/kv_event_snapshots.md describe them.
A live message is [topic, sequence, payload], as ZmqEventPublisher sends it.

    pip download vllm==0.34.0 --no-deps -d /tmp/vllm-whl
    unzip -q /tmp/vllm-whl/vllm-0.34.0-*.whl 'vllm/distributed/kv_events.py' \
        'vllm/_version.py' -d /tmp/vllm-src/0.34.0
    python hack/make-vllm-kv-event-gaps.py /tmp/vllm-src/0.34.0 \
        -o tests/fixtures/vllm-kv-events/gaps
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

TOPIC = b"kv@sim-0@sim-model"
B = 16
TS = 1_790_000_100.0
PUBLISHER_A = bytes.fromhex("5eed0000000000000000000000000a0a")
PUBLISHER_B = bytes.fromhex("5eed0000000000000000000000000b0b")


def _capture_module() -> Any:
    path = Path(__file__).with_name("capture-vllm-kv-events.py")
    spec = importlib.util.spec_from_file_location("capture_vllm_kv_events", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _vllm(src: Path) -> tuple[Any, str, str, str]:
    cap = _capture_module()
    work = Path(tempfile.mkdtemp(prefix="vllm-kv-gaps-"))
    cap._tree(src, work / "tree")
    sys.path.insert(0, str(work / "tree"))
    kv = importlib.import_module("vllm.distributed.kv_events")
    version, commit = cap._version(src)
    digest = hashlib.sha256((src / "vllm/distributed/kv_events.py").read_bytes()).hexdigest()
    return kv, version, commit, digest


# -- vLLM commit 0181ea3173e5's structs (map-encoded batch), as that commit declares them ------
class _Batch0181(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event0181(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _Stored0181(_Event0181, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _Removed0181(_Event0181, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _Cleared0181(_Event0181, tag="AllBlocksCleared"):
    pass


def _tokens(start: int, blocks: int) -> list[int]:
    return list(range(start, start + blocks * B))


def _plain(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {"hex": obj.hex()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _meaning(batch: Any) -> dict[str, Any]:
    events = []
    for ev in batch.events:
        d = {"type": ev.__struct_config__.tag}
        d.update({f: _plain(getattr(ev, f)) for f in ev.__struct_fields__})
        events.append(d)
    out = {"ts": batch.ts, "data_parallel_rank": batch.data_parallel_rank, "events": events}
    if hasattr(batch, "publisher_id"):
        out["publisher_id"] = {"hex": batch.publisher_id.hex()}
    return out


def _message(seq: int, batch: Any, seq_suffix: bytes = b"") -> dict[str, Any]:
    payload = msgspec.msgpack.Encoder().encode(batch)
    frames = [TOPIC, seq.to_bytes(8, "big") + seq_suffix, payload]
    return {"frames_hex": [f.hex() for f in frames], "seq": seq, "meaning": _meaning(batch)}


def cases(kv: Any) -> dict[str, dict[str, Any]]:
    S, R, C, Batch = kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared, kv.KVEventBatch

    def stored(hashes: list[int], parent: int | None, tokens: list[int], **kw: Any) -> Any:
        fields = dict(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                      block_size=B, lora_id=None, medium="GPU", lora_name=None,
                      extra_keys=[None] * len(hashes), group_idx=0,
                      kv_cache_spec_kind="full_attention")  # fmt: skip
        fields.update(kw)
        return S(**fields)

    def batch(i: int, *events: Any) -> Any:
        return Batch(ts=TS + i, events=list(events), data_parallel_rank=0)

    out: dict[str, dict[str, Any]] = {}

    # vLLM's OffloadingConnector (kv_connector/v1/offloading/events.py): "CPU" stores of the
    # blocks it offloaded, self-describing (hashes, parent, tokens: opt-in
    # self_describing_kv_events) or a placeholder (one hash, no tokens, block_size 0); GPU
    # evictions keep the CPU copy; AllBlocksCleared comes from the GPU block pool.
    a = [0xC0FFEE0000000001, 0xC0FFEE0000000002, 0xC0FFEE0000000003, 0xC0FFEE0000000004]
    ta = _tokens(3000, 4)
    out["cpu-offload"] = {"what": "GPU and CPU tiers of one engine", "messages": [
        _message(0, batch(0, stored(a, None, ta))),
        _message(1, batch(1, stored(a[:3], None, ta[: 3 * B], medium="CPU"),
                          stored([a[3]], None, [], block_size=0, medium="CPU",
                                 extra_keys=None, kv_cache_spec_kind=None))),
        _message(2, batch(2, R(block_hashes=[a[3]], medium="GPU", group_idx=0),
                          R(block_hashes=[a[2]], medium="GPU", group_idx=0),
                          R(block_hashes=[a[1]], medium="GPU", group_idx=0))),
        _message(3, batch(3, C())),
        _message(4, batch(4, R(block_hashes=[a[2]], medium="CPU", group_idx=0))),
    ]}

    # A hybrid model (one full-attention group, one sliding-window group of 32 tokens): each
    # group stores the same hashes; a sliding-window store leaves out the blocks outside its
    # window (null blocks: fewer hashes than its tokens cover, block_pool.cache_full_blocks).
    h = [0x5A5A000000000001, 0x5A5A000000000002, 0x5A5A000000000003, 0x5A5A000000000004]
    g = [0x6B6B000000000001, 0x6B6B000000000002, 0x6B6B000000000003, 0x6B6B000000000004]
    th, tg = _tokens(4000, 4), _tokens(5000, 4)
    sw = dict(group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=32)
    out["hybrid-sliding-window"] = {"what": "two KV-cache groups", "messages": [
        _message(0, batch(0, stored(h, None, th), stored(h, None, th, **sw))),
        _message(1, batch(1, R(block_hashes=[h[3]], medium="GPU", group_idx=1))),
        _message(2, batch(2, R(block_hashes=[h[1]], medium="GPU", group_idx=1))),
        _message(3, batch(3, stored(g, None, tg),
                          stored(g[2:], None, tg, extra_keys=[None, None], **sw))),
    ]}

    # Extra keys as vLLM 0.34.0 publishes them (kv_cache_utils.to_event_extra_keys): the LoRA
    # name, multimodal (identifier, offset) pairs, the cache salt (block 0), in that order; and
    # a bare multimodal identifier before the salt, as releases before the pairs sent it.
    m = [0x7C7C000000000001, 0x7C7C000000000002]
    tm = _tokens(6000, 2)
    out["multimodal-salt"] = {"what": "multimodal keys before the cache salt", "messages": [
        _message(0, batch(0, stored(m, None, tm, extra_keys=[
            (("img-5f1d", 3), "tenant-a"), (("img-5f1d", -13),)]))),
        _message(1, batch(1, stored([m[0] ^ 0xFF], None, tm[:B], extra_keys=[
            ("img-5f1d", "tenant-a")]))),
        _message(2, batch(2, stored([m[0] ^ 0xFFFF], None, tm[:B], lora_id=1,
                                    lora_name="sql-lora", extra_keys=[
            ("sql-lora", ("img-5f1d", 3), "tenant-b")]))),
    ]}

    # vLLM commit 0181ea3173e5: the batch a map too.
    def b0181(i: int, *events: Any) -> _Batch0181:
        return _Batch0181(ts=TS + i, events=list(events), data_parallel_rank=0)

    k = [0x8D8D000000000001, 0x8D8D000000000002]
    tk = _tokens(7000, 2)
    out["map-batch"] = {"what": "vLLM 0181ea3173e5: map-encoded batches", "messages": [
        _message(0, b0181(0, _Stored0181(
            block_hashes=k, parent_block_hash=None, token_ids=tk, block_size=B, lora_id=None,
            medium="GPU", lora_name=None, extra_keys=[None, None], group_idx=0,
            kv_cache_spec_kind="full_attention"))),
        _message(1, b0181(1, _Removed0181(block_hashes=[k[1]], medium="GPU", group_idx=0))),
        _message(2, b0181(2, _Cleared0181())),
    ]}

    # vLLM PR #57789, first revision: 24-byte sequence frames; an idle publisher's empty
    # batch every second. Publisher A, then B (restarted) whose sequence happens to go on.
    s = [0x9E9E000000000001, 0x9E9E000000000002]
    ts_ = _tokens(8000, 2)
    out["snapshot-sequence-frame"] = {
        "what": "vLLM PR #57789 (first revision): sequence + publisher id", "messages": [
            _message(0, batch(0, stored(s, None, ts_)), PUBLISHER_A),
            _message(1, batch(1), PUBLISHER_A),
            _message(2, batch(2, stored([s[0] ^ 1], None, ts_[:B])), PUBLISHER_B),
        ]}

    # vLLM PR #57789, later revision: the id a trailing element of the batch.
    class IdentifiedKVEventBatch(Batch):
        publisher_id: bytes = b""

    def ib(i: int, pid: bytes, *events: Any) -> Any:
        return IdentifiedKVEventBatch(ts=TS + i, events=list(events), data_parallel_rank=0,
                                      publisher_id=pid)  # fmt: skip

    out["snapshot-identified-batch"] = {
        "what": "vLLM PR #57789 (later revision): IdentifiedKVEventBatch", "messages": [
            _message(0, ib(0, PUBLISHER_A, stored(s, None, ts_))),
            _message(1, ib(1, PUBLISHER_A)),
            _message(2, ib(2, PUBLISHER_B, stored([s[0] ^ 1], None, ts_[:B]))),
        ]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vllm_src", type=Path, help="a directory holding vllm/distributed/kv_events.py")
    p.add_argument("-o", "--out", type=Path, required=True)
    args = p.parse_args()
    kv, version, commit, digest = _vllm(args.vllm_src)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, case in cases(kv).items():
        case.update(vllm_version=version, vllm_commit=commit, kv_events_py_sha256=digest,
                    msgspec_version=msgspec.__version__)  # fmt: skip
        (args.out / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
        print(f"{args.out / name}.json: {len(case['messages'])} messages")


if __name__ == "__main__":
    main()
