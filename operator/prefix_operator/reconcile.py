"""One reconcile of one PrefixRoutedModel: read it, render, apply, prune, observe, write status.

Idempotent by construction: every step starts from the live model and the live children, so a
run interrupted anywhere (operator restart, API error) is completed by the next one. Runs for
the same model are serialised; bursts of child events coalesce into one run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from prefix_router.contract import store_prefix

from . import cachestore, children, figures, kinds
from . import conditions as c
from .children import Ref, possible_refs, ref_of, render_all
from .config import OperatorConfig
from .cost_writer import CostWriter
from .kube import Kube, KubeError
from .naming import store_url
from .spec import Model
from .status import Observed, compute_status, significant_changes
from .validation import Problem, check_store_secret, validate

log = logging.getLogger(__name__)

# (body, type "Normal"|"Warning", reason, message): kopf.event in the operator, a list in tests.
EventSink = Callable[[dict[str, Any], str, str, str], None]


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    status: dict[str, Any] | None = None
    skipped: str = ""


def _label(ref: Ref) -> str:
    return f"{ref.kind.kind}/{ref.name}"


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])


def _changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Did our apply change the object? Kinds with a generation count only spec changes
    (a Deployment's status moves its resourceVersion all the time)."""
    b, a = before["metadata"], after["metadata"]
    if b.get("resourceVersion") == a.get("resourceVersion"):
        return False
    if "generation" in a:
        return b.get("generation") != a.get("generation")
    return True


def _status_differs(prev: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(prev.get(k) != v for k, v in new.items())


class Reconciler:
    def __init__(self, kube: Kube, cfg: OperatorConfig, events: EventSink,
                 clock: Callable[[], str] = c.timestamp) -> None:
        self.kube = kube
        self.cfg = cfg
        self.events = events
        self.clock = clock
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._poked: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._again: set[tuple[str, str]] = set()
        self.runs = 0  # kopf's liveness probe reports it
        self.costs = CostWriter(kube, cfg)

    # ----------------------------------------------------------------- entry points

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        lock = self._locks.setdefault((namespace, name), asyncio.Lock())
        async with lock:
            try:
                return await self._reconcile(namespace, name)
            finally:
                self.runs += 1

    def poke(self, namespace: str, name: str) -> None:
        """Reconcile soon, in the background: a child object changed or vanished."""
        key = (namespace, name)
        if key in self._poked:
            self._again.add(key)
            return
        self._poked[key] = asyncio.create_task(self._run_poked(key))

    async def _run_poked(self, key: tuple[str, str]) -> None:
        try:
            while True:
                self._again.discard(key)
                # A rollout produces a burst of child events: one run answers them all.
                await asyncio.sleep(0.3)
                try:
                    await self.reconcile(*key)
                except Exception as e:  # the periodic resync retries; never kill the loop
                    log.warning("reconcile of %s/%s after a child event failed: %s", *key, e)
                if key not in self._again:
                    return
        finally:
            self._poked.pop(key, None)

    async def close(self) -> None:
        for task in list(self._poked.values()):
            task.cancel()
        await asyncio.gather(*self._poked.values(), return_exceptions=True)

    # ----------------------------------------------------------------- the reconcile

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        body = await self.kube.get_model(namespace, name)
        if body is None:
            return Outcome(skipped="gone")
        if body["metadata"].get("deletionTimestamp"):
            # Children go with the model through garbage collection; recreating them now
            # would only race the collector.
            return Outcome(skipped="deleting")
        prev_status: dict[str, Any] = body.get("status") or {}
        try:
            model = Model.from_body(body)
        except ValidationError as e:  # the schema should make this impossible
            self.events(body, "Warning", "InvalidSpec", str(e)[:1000])
            return Outcome(skipped="unparseable")

        observed = Observed(spec_problems=validate(model))
        outcome = Outcome()
        secret_password = await self._check_store_secret(model, observed)

        # A missing store Secret does not hold the rollout back: the router pods wait for it
        # and start as soon as it exists.
        if not observed.spec_problems:
            await self._apply_children(model, body, prev_status, observed, outcome)
        else:
            await self._observe_children(model, observed)

        if model.spec.cache_store.type == "external" and observed.store_problem is None:
            ok, err = await cachestore.ping(store_url(model), secret_password,
                                            self.cfg.store_timeout_seconds)
            observed.store_reachable, observed.store_error = ok, err

        status = compute_status(model, observed, prev_status, self.clock())
        if _status_differs(prev_status, status):
            await self.kube.patch_model_status(namespace, name, status)
        self._announce(body, prev_status.get("conditions"), status["conditions"])
        outcome.status = status
        return outcome

    async def _check_store_secret(self, model: Model, observed: Observed) -> str | None:
        ref = model.spec.cache_store.password_secret_ref
        if model.spec.cache_store.type != "external" or ref is None:
            return None
        secret = await self.kube.get(kinds.SECRET, model.namespace, ref.name)
        observed.store_problem = check_store_secret(model, secret)
        if observed.store_problem is not None:
            return None
        return cachestore.decode_secret(secret, ref.key)

    async def _apply_children(self, model: Model, body: dict[str, Any],
                              prev_status: dict[str, Any], observed: Observed,
                              outcome: Outcome) -> None:
        # A changed child while the spec's generation was already handled is drift (someone
        # edited or deleted it); otherwise it is this generation's rollout.
        drift = prev_status.get("observedGeneration") == model.generation
        live: dict[Ref, dict[str, Any]] = {}
        desired = render_all(model, self.cfg)
        for obj in desired:
            ref = ref_of(obj)
            before = await self.kube.get(ref.kind, model.namespace, ref.name)
            try:
                after = await self.kube.apply(obj)
            except KubeError as e:
                if e.temporary:
                    raise
                # Something the schema let through and the API server refuses: say so in
                # status and wait for a spec change (retrying would fail the same way).
                observed.apply_problem = Problem(
                    f"{ref.kind.kind}Rejected", f"{_label(ref)} was rejected: {e.message}"[:1000])
                self.events(body, "Warning", observed.apply_problem.reason,
                            observed.apply_problem.message)
                break
            live[ref] = after
            outcome.applied.append(_label(ref))
            if before is None:
                outcome.created.append(_label(ref))
                if drift:
                    self.events(body, "Warning", "DriftRepaired",
                                f"{_label(ref)} was missing and has been recreated")
                else:
                    self.events(body, "Normal", "Created", f"created {_label(ref)}")
            elif _changed(before, after):
                if drift:
                    self.events(body, "Warning", "DriftRepaired",
                                f"{_label(ref)} had been changed and has been restored")
                else:
                    self.events(body, "Normal", "Updated", f"updated {_label(ref)}")

        wanted = {ref_of(o) for o in desired}
        for ref in possible_refs(model):
            if ref in wanted:
                continue
            existing = await self.kube.get(ref.kind, model.namespace, ref.name)
            if existing is not None and _owned_by(existing, model.uid):
                await self.kube.delete(ref.kind, model.namespace, ref.name)
                outcome.pruned.append(_label(ref))
                self.events(body, "Normal", "Pruned",
                            f"deleted {_label(ref)}, which the spec no longer needs")

        self._fill_observed(model, observed, live)
        if observed.apply_problem is not None:
            await self._observe_children(model, observed, live)

    async def _observe_children(self, model: Model, observed: Observed,
                                live: dict[Ref, dict[str, Any]] | None = None) -> None:
        live = dict(live or {})
        for child in children.OBSERVED:
            ref = child.ref(model)
            if child.wanted(model) and ref not in live:
                obj = await self.kube.get(ref.kind, model.namespace, ref.name)
                if obj is not None:
                    live[ref] = obj
        self._fill_observed(model, observed, live)

    @staticmethod
    def _fill_observed(model: Model, observed: Observed, live: dict[Ref, dict[str, Any]]) -> None:
        for child in children.OBSERVED:
            assert child.observed_as is not None
            obj = live.get(child.ref(model)) if child.wanted(model) else None
            setattr(observed, child.observed_as, obj)

    def _announce(self, body: dict[str, Any], before: list[dict[str, Any]] | None,
                  after: list[dict[str, Any]]) -> None:
        for cond in significant_changes(before, after):
            t, s = cond["type"], cond["status"]
            if t == c.READY and s == "True":
                self.events(body, "Normal", "Ready", cond.get("message", ""))
            elif t == c.READY and s == "False" and before is not None and \
                    (c.find(before, c.READY) or {}).get("status") == "True":
                self.events(body, "Warning", cond["reason"], cond.get("message", ""))
            elif t == c.DEGRADED and s == "True":
                self.events(body, "Warning", cond["reason"], cond.get("message", ""))

    # ----------------------------------------------------------------- the cache store

    async def remove_store_keys(self, body: dict[str, Any]) -> int:
        """Delete the model's keys from its store; raises when the store cannot be reached."""
        model = Model.from_body(body)
        url, password = await cachestore.credentials(self.kube, model)
        return await cachestore.delete_keys(url, password, store_prefix(model.key),
                                            self.cfg.store_timeout_seconds)

    async def refresh_figures(self, namespace: str, name: str) -> figures.Figures | None:
        """Hit rate, cache pressure and load into status.routing (from the routers' Redis)."""
        body = await self.kube.get_model(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        model = Model.from_body(body)
        url, password = await cachestore.credentials(self.kube, model)
        try:
            published = await cachestore.read_published(url, password, model.key,
                                                        self.cfg.store_timeout_seconds)
        except Exception as e:  # unreachable from here: keep the last figures, say nothing
            log.debug("figures of %s/%s unavailable: %s", namespace, name, e)
            return None
        ready = int((body.get("status") or {}).get("readyReplicas") or 0)
        figs = figures.aggregate(published, now=time.time(), ready_replicas=ready,
                                 kv_capacity_tokens=model.spec.router.kv_capacity_tokens)
        routing = figs.as_status(self.clock())
        prev = (body.get("status") or {}).get("routing") or {}
        # Merge patch would keep stale keys: null out figures that are unknown now.
        patch: dict[str, Any] = {k: None for k in prev if k not in routing}
        patch.update(routing)
        await self.kube.patch_model_status(namespace, name, {"routing": patch})
        await self.refresh_deletion_costs(model, url, password)
        return figs

    async def refresh_deletion_costs(self, model: Model, url: str, password: str | None) -> None:
        """Engine pods ranked by what only each holds (cost_writer.py), so a scale-down
        removes the coldest."""
        try:
            values = await cachestore.read_engine_values(url, password, model.key,
                                                         self.cfg.store_timeout_seconds)
        except Exception as e:  # the store went away since the figures: try next time
            log.debug("engine values of %s unavailable: %s", model.key, e)
            return
        await self.costs.refresh(model, figures.engine_values(values, now=time.time()))

    async def mark_cleanup_abandoned(self, body: dict[str, Any], message: str) -> None:
        meta = body["metadata"]
        prev = (body.get("status") or {}).get("conditions")
        conds = c.merge(prev, [c.Condition(c.DEGRADED, "True", "CacheCleanupAbandoned", message)],
                        now=self.clock(), generation=int(meta.get("generation", 1)))
        await self.kube.patch_model_status(meta["namespace"], meta["name"],
                                           {"conditions": conds})
