"""`prefix-metrics-adapter`: serves external.metrics.k8s.io/v1beta1 over HTTPS as an aggregated
API, from the figures the routers publish into each model's Redis.

A request for a metric lists the PrefixRoutedModels of the namespace through the API, keeps the
ones the label selector picks, reads their routers' hashes from each model's own store (the same
URL and password Secret the operator and the routers use) and answers with the totals computed
in external_metrics.py. Nothing is cached: the HPA asks once per sync period per metric, and a
fresh read is what makes stale data show as stale.

Two listeners: --secure-port for kube-apiserver's front proxy (the aggregated API), and, with
--client-ca-file, --client-ca-port for callers with a certificate of that CA (KEDA's
metrics-api trigger, which reads the same ExternalMetricValueList). Same routes, each with its
own authentication (adapter_auth.py).

I/O lives here; the computation is external_metrics.py, authentication adapter_auth.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from prefix_router.contract import RouterFigures

from . import cachestore, kinds
from . import external_metrics as em
from .adapter_auth import (
    AUTH_CONFIGMAP_NAME,
    AUTH_CONFIGMAP_NAMESPACE,
    Authenticator,
    ClientCertConfig,
    RequestHeaderConfig,
    middleware,
    server_ssl_context,
)
from .figures import STALE_AFTER_SECONDS
from .kube import Kube, KubeError, connect
from .spec import Model

log = logging.getLogger("prefix_operator.adapter")

# One Redis round trip's budget per model: the HPA controller waits on our answer.
STORE_TIMEOUT_SECONDS = 2.0


class ModelFigures:
    """The adapter's view of the cluster: models from the API, their routers' figures from
    their stores. Each call is one fresh read."""

    def __init__(self, kube: Kube, store_timeout: float = STORE_TIMEOUT_SECONDS) -> None:
        self.kube = kube
        self.store_timeout = store_timeout

    async def models(self, namespace: str) -> list[dict[str, Any]]:
        out = await self.kube.request("GET", kinds.MODEL.path(namespace))
        return list((out or {}).get("items") or [])

    async def published(self, body: dict[str, Any]) -> list[RouterFigures]:
        """The model's router hashes; [] when they cannot be read (the model then gets no
        item, and the HPA holds, rather than a zero it would scale down on)."""
        try:
            model = Model.from_body(body)
        except ValidationError as e:
            log.warning("skipping an unparseable PrefixRoutedModel: %s", e)
            return []
        try:
            url, password = await cachestore.credentials(self.kube, model)
            return await cachestore.read_published(url, password, model.key, self.store_timeout)
        except Exception as e:  # the store or its Secret: report no data, never fail the list
            log.warning("figures of %s unavailable: %s: %s", model.key, type(e).__name__, e)
            return []


FIGURES = web.AppKey("figures", ModelFigures)
STALE_AFTER = web.AppKey("stale_after", float)


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _group_list(_: web.Request) -> web.Response:
    return _json(em.api_group_list())


async def _group(_: web.Request) -> web.Response:
    return _json(em.api_group())


async def _resources(_: web.Request) -> web.Response:
    return _json(em.api_resource_list())


async def _openapi_v2(_: web.Request) -> web.Response:
    return _json(em.openapi_v2())


async def _openapi_v3_discovery(_: web.Request) -> web.Response:
    return _json(em.openapi_v3_discovery())


async def _openapi_v3(_: web.Request) -> web.Response:
    return _json(em.openapi_v3())


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _not_found(request: web.Request) -> web.Response:
    return _json(em.status(404, "NotFound", f"the server could not find {request.path}"), 404)


async def _metric(request: web.Request) -> web.Response:
    namespace = request.match_info["namespace"]
    metric = request.match_info["metric"]
    if metric not in em.METRICS:
        return _json(
            em.status(
                404, "NotFound", f"no external metric {metric!r} (served: {', '.join(em.METRICS)})"
            ),
            404,
        )
    try:
        selector = em.parse_selector(request.query.get("labelSelector"))
    except ValueError as e:
        return _json(em.status(400, "BadRequest", str(e)), 400)
    figures = request.app[FIGURES]
    try:
        bodies = await figures.models(namespace)
    except KubeError as e:
        # The HPA treats an error like missing data: it holds.
        log.warning("cannot list PrefixRoutedModels in %s: %s", namespace, e)
        return _json(
            em.status(503, "ServiceUnavailable", f"cannot list PrefixRoutedModels: {e}"), 503
        )
    # Select before reading: Redis is read only for the models asked about.
    picked = [b for b in bodies if selector.matches(em.metric_labels(b))]
    published = await asyncio.gather(*(figures.published(b) for b in picked))
    pairs = [(em.metric_labels(b), p) for b, p in zip(picked, published, strict=True)]
    items = em.metric_items(
        metric, pairs, selector, now=time.time(), stale_after=request.app[STALE_AFTER]
    )
    log.debug("%s %s %s: %d of %d models", namespace, metric, selector, len(items), len(bodies))
    return _json(em.value_list(items))


def make_app(
    auth: Authenticator, figures: ModelFigures, stale_after: float = STALE_AFTER_SECONDS
) -> web.Application:
    app = web.Application(middlewares=[middleware(auth)])
    app[FIGURES] = figures
    app[STALE_AFTER] = stale_after
    base = f"/apis/{em.GROUP_VERSION}"
    app.router.add_get("/healthz", _ok)
    app.router.add_get("/readyz", _ok)
    app.router.add_get("/livez", _ok)
    app.router.add_get("/apis", _group_list)
    app.router.add_get(f"/apis/{em.GROUP}", _group)
    app.router.add_get(base, _resources)
    app.router.add_get(base + "/namespaces/{namespace}/{metric}", _metric)
    app.router.add_get("/openapi/v2", _openapi_v2)
    app.router.add_get("/openapi/v3", _openapi_v3_discovery)
    app.router.add_get(em.OPENAPI_V3_PATH, _openapi_v3)
    # Everything else answers a Status, as any API server would.
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app


# --------------------------------------------------------------------------- process


async def load_auth(args: argparse.Namespace, kube: Kube) -> RequestHeaderConfig:
    allowed = frozenset(n for n in (args.requestheader_allowed_names or "").split(",") if n)
    if args.requestheader_client_ca_file:
        return RequestHeaderConfig.from_ca_file(args.requestheader_client_ca_file, allowed)
    cm = await kube.get(kinds.CONFIG_MAP, AUTH_CONFIGMAP_NAMESPACE, AUTH_CONFIGMAP_NAME)
    if cm is None:
        raise SystemExit(
            f"ConfigMap {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP_NAME} not "
            "found: pass --requestheader-client-ca-file"
        )
    auth = RequestHeaderConfig.from_configmap_data(cm.get("data") or {})
    log.info(
        "requestheader CA from %s/%s, allowed names %s",
        AUTH_CONFIGMAP_NAMESPACE,
        AUTH_CONFIGMAP_NAME,
        sorted(auth.allowed_names) or "(any)",
    )
    return auth


def client_cert_auth(args: argparse.Namespace) -> ClientCertConfig | None:
    if not args.client_ca_file:
        return None
    allowed = frozenset(n for n in (args.client_allowed_names or "").split(",") if n)
    return ClientCertConfig.from_ca_file(args.client_ca_file, allowed)


async def serve(args: argparse.Namespace) -> None:
    kube = Kube(await connect(args.kubeconfig))
    runners: list[web.AppRunner] = []
    try:
        figures = ModelFigures(kube)
        listeners: list[tuple[Authenticator, int, str]] = [
            (await load_auth(args, kube), args.secure_port, "front proxy")
        ]
        client_auth = client_cert_auth(args)
        if client_auth is not None:
            listeners.append((client_auth, args.client_ca_port, "client CA"))
        for auth, port, what in listeners:
            ctx = server_ssl_context(args.tls_cert_file, args.tls_private_key_file, auth)
            app = make_app(auth, figures, stale_after=args.stale_after_seconds)
            runner = web.AppRunner(app, access_log=log if args.verbose else None)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, args.bind_address, port, ssl_context=ctx).start()
            log.info(
                "serving %s on https://%s:%d (%s)", em.GROUP_VERSION, args.bind_address, port, what
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        for runner in runners:
            await runner.cleanup()
        await kube.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="prefix-metrics-adapter", description=__doc__.split("\n")[0])
    p.add_argument("--secure-port", type=int, default=6443)
    p.add_argument("--bind-address", default="0.0.0.0")
    p.add_argument("--tls-cert-file", required=True, help="serving certificate (PEM)")
    p.add_argument("--tls-private-key-file", required=True, help="its key (PEM)")
    p.add_argument(
        "--requestheader-client-ca-file",
        default=None,
        help="CA of kube-apiserver's front-proxy client certificate; default: read "
        f"it from ConfigMap {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP_NAME}",
    )
    p.add_argument(
        "--requestheader-allowed-names",
        default=None,
        help="comma-separated CNs allowed with --requestheader-client-ca-file "
        "(default: any certificate of that CA)",
    )
    p.add_argument(
        "--client-ca-file",
        default=None,
        help="a CA whose client certificates authenticate by themselves (CN = user, "
        "O = groups), served on --client-ca-port: for callers that reach the "
        "adapter directly, like KEDA's metrics-api trigger",
    )
    p.add_argument(
        "--client-ca-port", type=int, default=6444, help="HTTPS port for --client-ca-file clients"
    )
    p.add_argument(
        "--client-allowed-names",
        default=None,
        help="comma-separated CNs accepted with --client-ca-file (default: any "
        "certificate of that CA)",
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="default: in-cluster config, else $KUBECONFIG / ~/.kube/config",
    )
    p.add_argument(
        "--stale-after-seconds",
        type=float,
        default=STALE_AFTER_SECONDS,
        help="a router silent this long is ignored; a model with no fresh router gets no value",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.client_ca_file and args.client_ca_port == args.secure_port:
        # One port, one CA: see adapter_auth.py for why the two never share a listener.
        p.error("--client-ca-port must differ from --secure-port")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kubernetes_asyncio and redis log every connection at DEBUG/INFO: noise here.
        logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
