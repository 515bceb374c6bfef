"""One engine's KV events applied to the prefix index, under the router's own keys. Pure.

The router keys a block by its own chained hash of the block's token ids (and the media items
the event's extra keys name for it), seeded with the model (or LoRA) and the cache salt: the
key a request's prompt gets with token-aligned blocks (keying.py, prefix.py). vLLM's own block
hash is kept only to find a stored block's parent, to place a store that carries no tokens, and
to apply removals, so nothing depends on vLLM's hash algorithm or its hash seed.

Every store and removal belongs to a scope: (medium, KV-cache group). The GPU blocks of the
full-attention group are the index's table; a lower medium (an offloading connector's "CPU",
"STORAGE") and a hybrid model's sliding-window and Mamba groups are kept beside it
(index/tiers.py says what each means for a hit). A block's hash is the same in every scope
(vLLM's hash inputs do not depend on the group or the medium), so a store that lists hashes
without their tokens (an offloading connector's placeholder, a sliding-window group that skips
the blocks outside its window) is placed by hash, on blocks a store with tokens taught.
Residency is counted per scope and hash (vLLM can hold two blocks with one hash): a hash is
forgotten when no scope holds it.

Sequence numbers: a batch right after the last applied one is applied; one further on is a
gap (the caller asks the replay socket, and drops this engine's entries when replay cannot
cover it); one at or before the last means the engine restarted (a new process: its cache is
empty), so this engine's entries go and the stream starts again.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from typing import Any

import xxhash

from ..index.events import EventsIndex
from ..index.tiers import FULL_KINDS, GPU, GroupNeed, need_of
from ..prefix import chain_seed, media_keys
from .wire import Batch, Cleared, Hash, Removed, Stored, salt_of

log = logging.getLogger("prefix_router.events")

_xxh = xxhash.xxh3_64_intdigest
_MAIN = "main"  # a full-attention group: the index's table
Scope = tuple[str, int]  # (medium, KV-cache group)


def _media_items(keys: Any) -> list[tuple[str, int]]:
    """A block's media items in vLLM's extra keys: (identifier, offset of the item's first
    token relative to the block's), the offset in canonical bytes as the request's key has it
    (4 a token id). LoRA name, salt and prompt-embedding digests are not pairs."""
    if not isinstance(keys, (list, tuple)):
        return []
    return [(k[0], k[1] * 4) for k in keys
            if isinstance(k, (list, tuple)) and len(k) == 2 and isinstance(k[0], str)
            and isinstance(k[1], int) and not isinstance(k[1], bool)]  # fmt: skip


class EngineFeed:
    def __init__(
        self,
        backend: str,
        index: EventsIndex,
        block_size: int,
        model_of: Callable[[str | None], str | None],
        on_reset: Callable[[str], None] = lambda backend: None,
        on_settled: Callable[[str, list[int]], None] = lambda model, keys: None,
    ) -> None:
        self.backend = backend
        self._index = index
        self._block_size = block_size
        # a block's model: its LoRA's name, else the engine's model (None: not known yet)
        self._model_of = model_of
        self._on_reset = on_reset  # what else the router believes of this engine goes too
        # (model, own keys) the engine stored or removed in its GPU table: the router's own
        # claims of them (speculative entries of its decisions) yield to what the engine said
        self._on_settled = on_settled
        # engine hash -> own key, while any scope holds it; the model of a block not of the
        # engine's base model (a LoRA's) apart, as it is rare
        self._keys: dict[Hash, int] = {}
        self._lora: dict[Hash, str] = {}
        self._held: dict[Scope, dict[Hash, int]] = {}  # stores not yet removed, per scope
        # KV-cache group -> _MAIN or what a hit needs of it, as its stores said
        self._groups: dict[int, GroupNeed | str] = {}
        self.last_seq: int | None = None
        self.publisher: bytes | None = None  # a snapshot-mode publisher's lifetime id
        self.applied = 0  # events applied
        self.skipped = 0  # stored blocks that could not be placed, or of a kind not modelled

    def __len__(self) -> int:
        return len(self._keys)

    def expects(self, seq: int, publisher: bytes | None = None) -> str:
        """'next', 'gap' (events were missed), 'restart' (the publisher started over: its
        sequence went back, or its lifetime id changed) or 'first' (nothing applied yet)."""
        if self.last_seq is None:
            return "first"
        if publisher is not None and self.publisher is not None and publisher != self.publisher:
            return "restart"
        if seq == self.last_seq + 1:
            return "next"
        return "gap" if seq > self.last_seq else "restart"

    def apply(self, seq: int, batch: Batch, publisher: bytes | None = None) -> None:
        for event in batch.events:
            if isinstance(event, Stored):
                self._stored(event)
            elif isinstance(event, Removed):
                self._removed(event)
            elif isinstance(event, Cleared):
                self._cleared()
            self.applied += 1
        self.last_seq = seq
        self.publisher = publisher or batch.publisher or self.publisher

    def reset(self) -> None:
        """Forget everything this engine held (restarted, or events lost)."""
        self._index.drop_backend(self.backend)
        self._on_reset(self.backend)
        self._keys.clear()
        self._lora.clear()
        self._held.clear()
        self._groups.clear()
        self.publisher = None

    def _cleared(self) -> None:
        """AllBlocksCleared comes from vLLM's GPU block pool: its GPU blocks went, what an
        offloading tier holds stays."""
        self._index.clear_gpu(self.backend)
        self._on_reset(self.backend)
        for scope in [s for s in self._held if s[0] == GPU]:
            del self._held[scope]
        self._forget_unheld()

    def _forget_unheld(self) -> None:
        held = self._held.values()
        for h in [h for h in self._keys if not any(h in d for d in held)]:
            del self._keys[h]
            self._lora.pop(h, None)

    # -- stores -----------------------------------------------------------------------------
    def _role(self, e: Stored) -> GroupNeed | str | None:
        """What the store's group is: the main table, a group a hit needs some blocks of, or
        None (a kind not modelled). Learned from the stores' kv_cache_spec_kind; a release
        before it (or a removal) goes by what the group's stores said, group 0 being the
        main one."""
        if e.kind is None:
            return self._groups.get(e.group, _MAIN if e.group == 0 else None)
        role: GroupNeed | str | None = (
            _MAIN if e.kind in FULL_KINDS else need_of(e.kind, e.window, self._block_size)
        )
        if role is not None:
            self._groups[e.group] = role
        return role

    def _stored(self, e: Stored) -> None:
        role = self._role(e)
        if role is None or (role != _MAIN and e.medium != GPU):
            # another tier of a hybrid model's other groups: not modelled (docs/kv-events.md)
            self.skipped += len(e.hashes)
            return
        placed = self._teach(e) if self._complete(e) else self._by_hash(e)
        if placed is None:
            self.skipped += len(e.hashes)
            return
        model, keys, hashes = placed
        self.skipped += len(e.hashes) - len(hashes)
        held = self._held.setdefault((e.medium, e.group), {})
        for h in hashes:
            held[h] = held.get(h, 0) + 1
        if e.medium != GPU:
            self._index.store_lower(e.medium, model, keys, self.backend)
        elif role == _MAIN:
            self._index.record(model, keys, self.backend)
            self._on_settled(model, keys)
        else:
            assert isinstance(role, GroupNeed)
            self._index.store_group(e.group, role, model, keys, self.backend)

    def _complete(self, e: Stored) -> bool:
        """A store that carries each of its blocks' tokens at the router's block size."""
        return (
            bool(e.token_ids)
            and e.block_size == self._block_size
            and len(e.token_ids) == e.block_size * len(e.hashes)
        )

    def _teach(self, e: Stored) -> tuple[str, list[int], list[Hash]] | None:
        """Own keys chained over the store's tokens from its parent's key (or the model's
        seed at the root); None when the parent is unknown (stored before this router
        listened, or evicted everywhere)."""
        size = self._block_size
        base = self._model_of(None)
        if e.parent is None:
            model = self._model_of(e.lora_name)
            if model is None:
                return None
            prev = chain_seed(model, salt_of(e))
        else:
            parent = self._keys.get(e.parent)
            model = self._lora.get(e.parent, base)
            if parent is None or model is None:
                return None
            prev = parent
        keys = []
        tokens = e.token_ids
        keys_of = self._keys
        extra = e.extra_keys if e.extra_keys and len(e.extra_keys) == len(e.hashes) else None
        for i, h in enumerate(e.hashes):
            block = array("I", tokens[i * size : (i + 1) * size]).tobytes()
            if extra is not None and extra[i]:
                block += media_keys(_media_items(extra[i]))
            prev = _xxh(block, prev)
            keys.append(prev)
            keys_of[h] = prev
            if model != base:
                self._lora[h] = model
        return model, keys, e.hashes

    def _by_hash(self, e: Stored) -> tuple[str, list[int], list[Hash]] | None:
        """A store without its tokens: the blocks another store taught, by hash."""
        base = self._model_of(None)
        known = [h for h in e.hashes if h in self._keys]
        if not known:
            return None
        model = self._lora.get(known[0], base)
        if model is None:
            return None
        return model, [self._keys[h] for h in known], known

    # -- removals ---------------------------------------------------------------------------
    def _removed(self, e: Removed) -> None:
        scope = (e.medium, e.group)
        held = self._held.get(scope)
        if held is None:
            return
        main = self._groups.get(e.group, _MAIN if e.group == 0 else None) == _MAIN
        if e.medium == GPU and main:
            self._index.evicting(self.backend)  # before the blocks go: it was full
        base = self._model_of(None)
        for h in e.hashes:
            n = held.get(h)
            if n is None:
                continue
            if n > 1:  # vLLM can hold two blocks with one hash: gone when both are
                held[h] = n - 1
                continue
            del held[h]
            key = self._keys.get(h)
            model = self._lora.get(h, base)
            if key is not None and model is not None:
                if e.medium != GPU:
                    self._index.remove_lower(e.medium, model, [key], self.backend)
                elif main:
                    self._index.truncate(model, [key], self.backend, 0)
                    self._on_settled(model, [key])
                else:
                    self._index.remove_group(e.group, model, [key], self.backend)
            if not any(h in d for d in self._held.values()):
                self._keys.pop(h, None)
                self._lora.pop(h, None)
