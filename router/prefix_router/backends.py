"""The backend set: membership from discovery, health from probes and passive error counts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger("prefix_router.backends")


@dataclass(slots=True)
class Backend:
    url: str
    healthy: bool = True
    failures: int = 0
    ejected_at: float | None = None
    models: frozenset[str] = field(default_factory=frozenset)
    max_model_len: int | None = None  # as its /v1/models says (vLLM's model cards do)
    request_failures: int = 0  # in a row; a successful probe does not reset them
    # Re-admitted and not yet through a real request: one at a time (the trial), and the
    # first failure ejects it again. Probes pass on an engine that hangs every request.
    probation: bool = False
    trial: bool = False
    # Its pod is terminating: no new requests, those in flight finish (scheduling/filters.py)
    leaving: bool = False


class BackendSet:
    """Which backends exist and which may take traffic.

    A backend is ejected once its probe failures in a row and its request failures in a row
    reach `eject_after` together (a successful probe ends only the probes' run, a served
    request only the requests'), and is re-admitted by a successful probe once
    `readmit_after` seconds have passed, on probation: it takes one request at a time until
    it answers one, and its first failure ejects it again. One that made no progress while
    requests waited on it (report_hung) is ejected at once. Listeners hear of every backend
    that stops taking traffic (left or ejected), so its table entries go, and of every hung
    one (on_hung), so the requests waiting there are cut and go to another.
    """

    def __init__(
        self,
        eject_after: int = 3,
        readmit_after: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._eject_after = eject_after
        self._readmit_after = readmit_after
        self._clock = clock
        self._by_url: dict[str, Backend] = {}
        self._healthy: list[Backend] = []
        self._on_gone: list[Callable[[str], None]] = []
        self._on_join: list[Callable[[str], None]] = []
        self._on_hung: list[Callable[[str, str], None]] = []
        self._on_leaving: list[Callable[[str], None]] = []

    def on_hung(self, fn: Callable[[str, str], None]) -> None:
        """`fn(url, why)`: the backend hangs; nothing in flight there will be answered."""
        self._on_hung.append(fn)

    def on_gone(self, fn: Callable[[str], None]) -> None:
        self._on_gone.append(fn)

    def on_join(self, fn: Callable[[str], None]) -> None:
        self._on_join.append(fn)

    def on_leaving(self, fn: Callable[[str], None]) -> None:
        """Hear of a backend about to go (terminating, or removed without warning), before
        its table entries are dropped: its prefixes can still be handed on."""
        self._on_leaving.append(fn)

    def mark_leaving(self, urls: Iterable[str]) -> None:
        """These members, and only these, are leaving (their pods terminate): they take no
        new request. Level-triggered: a member no longer named (its address ready again,
        for a new pod) takes requests again."""
        wanted = {u.rstrip("/") for u in urls}
        for b in self._by_url.values():
            if b.leaving and b.url not in wanted:
                b.leaving = False
                log.info("backend no longer leaving: %s", b.url)
        for u in sorted(wanted):
            b = self._by_url.get(u)
            if b is None or b.leaving:
                continue
            b.leaving = True
            log.info("backend leaving: %s", u)
            for fn in self._on_leaving:
                fn(u)

    def _refresh(self) -> None:
        healthy = [b for b in self._by_url.values() if b.healthy]
        # a backend on trial takes no more until its trial ends, unless it is all there is
        free = [b for b in healthy if not b.trial]
        self._healthy = free or healthy

    def set_members(self, urls: Iterable[str]) -> None:
        wanted = {u.rstrip("/") for u in urls}
        added = [u for u in wanted if u not in self._by_url]
        removed = [u for u in self._by_url if u not in wanted]
        unannounced = [u for u in removed if not self._by_url[u].leaving]
        for u in removed:
            del self._by_url[u]
        for u in sorted(added):
            self._by_url[u] = Backend(u)
        self._refresh()
        for u in unannounced:
            for fn in self._on_leaving:
                fn(u)
        for u in removed:
            log.info("backend left: %s", u)
            for fn in self._on_gone:
                fn(u)
        for u in added:
            log.info("backend joined: %s", u)
            for fn in self._on_join:
                fn(u)

    def get(self, url: str) -> Backend | None:
        return self._by_url.get(url)

    def all(self) -> list[Backend]:
        return list(self._by_url.values())

    def healthy(self) -> list[Backend]:
        """The backends that may take a request now."""
        return self._healthy

    def takes(self, url: str) -> bool:
        b = self._by_url.get(url)
        return b is not None and b.healthy and (
            not b.trial or any(x is b for x in self._healthy))

    @contextmanager
    def trying(self, url: str) -> Iterator[None]:
        """A request sent to `url` within the block: a backend on probation takes no other
        until it ends (served, failed or abandoned)."""
        b = self._by_url.get(url)
        trial = b is not None and b.probation and not b.trial
        if trial:
            assert b is not None
            b.trial = True
            self._refresh()
        try:
            yield
        finally:
            if trial and b is not None and b.trial:
                b.trial = False
                self._refresh()

    def report_success(self, url: str) -> None:
        """A request it served: its run of request failures ends, and its probation."""
        b = self._by_url.get(url)
        if b is not None and b.healthy:
            b.request_failures = 0
            self.answered(url)

    def answered(self, url: str) -> None:
        """It answers (a stream's first token will do): its probation ends."""
        b = self._by_url.get(url)
        if b is not None and b.healthy and b.probation:
            b.probation = b.trial = False
            self._refresh()
            log.info("backend answered after its re-admission: off probation: %s", url)

    def report_failure(self, url: str, why: str, probe: bool = False) -> bool:
        """Count a failure of a request (or, `probe`, of a health probe); returns True when
        this one ejected the backend. Each kind's run ends only with a success of its own
        kind: an engine that answers its probes and hangs every request still leaves."""
        b = self._by_url.get(url)
        if b is None or not b.healthy:
            return False
        if probe:
            b.failures += 1
        else:
            b.request_failures += 1
        if b.failures + b.request_failures < self._eject_after and not b.probation:
            return False
        self._eject(b, f"after {b.failures} probe and {b.request_failures} request failures "
                       f"in a row{' on probation' if b.probation else ''}", why)  # fmt: skip
        return True

    def report_hung(self, url: str, why: str) -> None:
        """It made no progress while requests waited on it: out at once (however its probes
        fare), and the listeners cut what waits there."""
        b = self._by_url.get(url)
        if b is None:
            return
        if b.healthy:
            self._eject(b, "as hung", why)
        for fn in self._on_hung:
            fn(url, why)

    def _eject(self, b: Backend, how: str, why: str) -> None:
        b.healthy = False
        b.probation = b.trial = False
        b.ejected_at = self._clock()
        self._refresh()
        log.warning("backend ejected %s: %s (%s)", how, b.url, why)
        for fn in self._on_gone:
            fn(b.url)

    def probe_result(self, url: str, ok: bool, why: str = "") -> None:
        b = self._by_url.get(url)
        if b is None:
            return
        if not ok:
            self.report_failure(url, why or "probe failed", probe=True)
            return
        if b.healthy:
            b.failures = 0
            return
        assert b.ejected_at is not None
        if self._clock() - b.ejected_at >= self._readmit_after:
            b.healthy = True
            b.probation = True
            b.failures = 0
            b.request_failures = 0
            b.ejected_at = None
            self._refresh()
            log.info("backend re-admitted on probation: %s", url)
            for fn in self._on_join:
                fn(url)

    def set_models(self, url: str, models: Iterable[str], max_model_len: int | None = None) -> None:
        b = self._by_url.get(url)
        if b is not None:
            b.models = frozenset(models)
            b.max_model_len = max_model_len

    def served_models(self) -> set[str]:
        out: set[str] = set()
        for b in self._healthy:
            out |= b.models
        return out
