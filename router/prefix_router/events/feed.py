"""One engine's KV events applied to the prefix index, under the router's own keys. Pure.

The router keys a block by its own chained hash of the block's token ids, seeded with the
model (or LoRA) and the cache salt: the key a request's prompt gets with token-aligned blocks
(tokens.py, prefix.py). vLLM's own block hash is kept only to find a stored block's parent and
to apply removals, so nothing depends on vLLM's hash algorithm or its hash seed.

Sequence numbers: a batch right after the last applied one is applied; one further on is a
gap (the caller asks the replay socket, and drops this engine's entries when replay cannot
cover it); one at or before the last means the engine restarted (a new process: its cache is
empty), so this engine's entries go and the stream starts again.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable

import xxhash

from ..index.events import EventsIndex
from ..prefix import chain_seed
from .wire import Batch, Cleared, Hash, Removed, Stored, salt_of

log = logging.getLogger("prefix_router.events")

_xxh = xxhash.xxh3_64_intdigest


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
        # (model, own keys) the engine stored or removed: the router's own claims of them
        # (speculative entries of its decisions) yield to what the engine said
        self._on_settled = on_settled
        # engine hash -> own key; a million blocks an engine fleet holds cost ~100 MB here, so
        # the rare parts live apart: the model of a block not of the engine's base model (a
        # LoRA's), and the count of further blocks stored under one hash
        self._keys: dict[Hash, int] = {}
        self._lora: dict[Hash, str] = {}
        self._dups: dict[Hash, int] = {}
        self.last_seq: int | None = None
        self.applied = 0  # events applied
        self.skipped = 0  # stored blocks whose parent was not known, or of another size

    def __len__(self) -> int:
        return len(self._keys)

    def expects(self, seq: int) -> str:
        """'next', 'gap' (events were missed), 'restart' (the publisher started over) or
        'first' (nothing applied yet)."""
        if self.last_seq is None:
            return "first"
        if seq == self.last_seq + 1:
            return "next"
        return "gap" if seq > self.last_seq else "restart"

    def apply(self, seq: int, batch: Batch) -> None:
        for event in batch.events:
            if isinstance(event, Stored):
                self._stored_blocks(event)
            elif isinstance(event, Removed):
                self._index.evicting(self.backend)  # before the blocks go: it was full
                self._removed(event.hashes)
            elif isinstance(event, Cleared):
                self.reset()
            self.applied += 1
        self.last_seq = seq

    def reset(self) -> None:
        """Forget everything this engine held (cleared, restarted, or events lost)."""
        self._index.drop_backend(self.backend)
        self._on_reset(self.backend)
        self._keys.clear()
        self._lora.clear()
        self._dups.clear()

    def _stored_blocks(self, e: Stored) -> None:
        size = self._block_size
        if e.block_size != size or len(e.token_ids) != size * len(e.hashes):
            self.skipped += len(e.hashes)
            return
        base = self._model_of(None)
        if e.parent is None:
            model = self._model_of(e.lora_name)
            if model is None:
                self.skipped += len(e.hashes)
                return
            prev = chain_seed(model, salt_of(e))
        else:
            parent = self._keys.get(e.parent)
            if parent is None:  # stored before we listened, or its parent evicted: unplaceable
                self.skipped += len(e.hashes)
                return
            model, prev = self._lora.get(e.parent, base), parent
            if model is None:
                self.skipped += len(e.hashes)
                return
        keys = []
        tokens = e.token_ids
        keys_of, dups = self._keys, self._dups
        for i, h in enumerate(e.hashes):
            prev = _xxh(array("I", tokens[i * size : (i + 1) * size]).tobytes(), prev)
            keys.append(prev)
            if h in keys_of:
                dups[h] = dups.get(h, 0) + 1
            keys_of[h] = prev
            if model != base:
                self._lora[h] = model
        self._index.record(model, keys, self.backend)
        self._on_settled(model, keys)

    def _removed(self, hashes: list[Hash]) -> None:
        base = self._model_of(None)
        for h in hashes:
            n = self._dups.get(h)
            if n is not None:  # vLLM can hold two blocks with one hash: gone when both are
                if n > 1:
                    self._dups[h] = n - 1
                else:
                    del self._dups[h]
                continue
            key = self._keys.pop(h, None)
            model = self._lora.pop(h, base)
            if key is not None and model is not None:
                self._index.truncate(model, [key], self.backend, 0)
                self._on_settled(model, [key])
