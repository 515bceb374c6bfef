"""kopf handlers: thin. Each one hands the model's namespace/name to the Reconciler.

Registered into a given registry (not kopf's global one at import time) so that timings come
from OperatorConfig, which the tests shorten.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import GROUP, PLURAL, VERSION
from .children import WATCHED_KINDS
from .config import OperatorConfig
from .kube import Kube, KubeError, connect
from .naming import MANAGED_BY, MANAGED_BY_LABEL, MODEL_LABEL
from .reconcile import Reconciler

log = logging.getLogger(__name__)

FINALIZER = "prefixrouter.io/cache-cleanup"
ANNOTATION_PREFIX = "prefixrouter.io"

class Runtime:
    """What the handlers share: created at startup, closed at cleanup."""

    def __init__(self, cfg: OperatorConfig) -> None:
        self.cfg = cfg
        self.reconciler: Reconciler | None = None

    @property
    def r(self) -> Reconciler:
        if self.reconciler is None:
            raise kopf.TemporaryError("the operator is still starting", delay=1)
        return self.reconciler


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(body, type=type_, reason=reason, message=message[:1024])


def configure_settings(settings: kopf.OperatorSettings) -> None:
    # kopf keeps handler progress and the last-handled spec in annotations, not in
    # status.kopf: the CRD's status schema is strict (structurally pruned, no
    # preserve-unknown-fields) and would silently drop kopf's bookkeeping there.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = FINALIZER
    # Our own Events are posted explicitly; kopf's per-handler log lines would be noise.
    settings.posting.level = logging.WARNING
    # Watches are re-opened regularly, so a silently broken connection heals by itself.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150


async def _reconcile(rt: Runtime, namespace: str, name: str) -> None:
    try:
        await rt.r.reconcile(namespace, name)
    except KubeError as e:
        if e.temporary:
            raise kopf.TemporaryError(str(e), delay=rt.cfg.retry_backoff_seconds) from e
        # Not retryable (403, 404, ...): visible in the log, retried by the periodic resync
        # instead of kopf's fast backoff, so it never turns into a hot loop.
        log.error("reconcile of %s/%s failed: %s", namespace, name, e)


def register(registry: kopf.OperatorRegistry, rt: Runtime) -> None:
    cfg = rt.cfg
    res = (GROUP, VERSION, PLURAL)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Our own registry does not inherit kopf's default login handlers.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_settings(settings)
        rt.reconciler = Reconciler(Kube(await connect()), cfg, post_event)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if rt.reconciler is not None:
            await rt.reconciler.close()
            await rt.reconciler.kube.close()

    @kopf.on.probe(id="reconciles", registry=registry)
    def probe(**_: Any) -> int:
        return rt.reconciler.runs if rt.reconciler else 0

    @kopf.on.resume(*res, registry=registry, backoff=cfg.retry_backoff_seconds)
    @kopf.on.create(*res, registry=registry, backoff=cfg.retry_backoff_seconds)
    @kopf.on.update(*res, registry=registry, backoff=cfg.retry_backoff_seconds)
    async def model_changed(namespace: str, name: str, **_: Any) -> None:
        await _reconcile(rt, namespace, name)

    @kopf.timer(*res, registry=registry, id="resync", interval=cfg.resync_seconds,
                initial_delay=cfg.resync_seconds)
    async def resync(namespace: str, name: str, **_: Any) -> None:
        await _reconcile(rt, namespace, name)

    @kopf.timer(*res, registry=registry, id="figures", interval=cfg.figures_seconds,
                initial_delay=cfg.figures_seconds)
    async def figures(namespace: str, name: str, **_: Any) -> None:
        try:
            await rt.r.refresh_figures(namespace, name)
        except KubeError as e:
            log.debug("figures of %s/%s not written: %s", namespace, name, e)

    @kopf.on.delete(*res, registry=registry, backoff=cfg.cleanup_backoff_seconds)
    async def model_deleted(body: kopf.Body, retry: int, **_: Any) -> None:
        raw = dict(body)
        try:
            removed = await rt.r.remove_store_keys(raw)
        except Exception as e:
            message = f"cannot remove this model's keys from its cache store: {e}"
            if retry + 1 < cfg.cleanup_attempts:
                raise kopf.TemporaryError(message, delay=cfg.cleanup_backoff_seconds) from e
            # Bounded: a store that is gone must not keep the model (and its GPUs) forever.
            message = f"gave up after {retry + 1} attempts: {message}"
            post_event(raw, "Warning", "CacheCleanupAbandoned", message)
            try:
                await rt.r.mark_cleanup_abandoned(raw, message)
            except KubeError as patch_error:
                log.warning("could not record CacheCleanupAbandoned: %s", patch_error)
            return
        post_event(raw, "Normal", "CacheKeysRemoved",
                   f"removed {removed} keys of this model from its cache store")

    # Every kind a model owns (children.WATCHED_KINDS): a hand edit or deletion is repaired at
    # once and status follows the Deployments' real state (the periodic resync is the backstop).
    for kind in WATCHED_KINDS:
        @kopf.on.event(kind.group, kind.version, kind.plural, registry=registry,
                       id=f"owned-{kind.plural}",
                       labels={MANAGED_BY_LABEL: MANAGED_BY, MODEL_LABEL: kopf.PRESENT})
        async def owned_changed(namespace: str, labels: dict[str, str], **_: Any) -> None:
            rt.r.poke(namespace, labels[MODEL_LABEL])
