"""Leader election: one active operator among several replicas, through a coordination.k8s.io
Lease.

kopf peering cannot do this: two peers of equal priority pause each other, and a killed peer's
stale keep-alive pauses its successor until the keep-alive ages out. So the process first wins
the Lease, and only then starts kopf (in standalone mode); a standby answers its liveness probe
and waits for the Lease to expire.

The election algorithm is kubernetes_asyncio's (`kubernetes_asyncio.leaderelection`: the
client-go rules: a candidate takes the Lease only after it has seen the record unchanged for a
whole lease duration, and every write carries the resourceVersion it read, so two candidates
never both win). What it lacks, added here:

- a timeout on every API call (a hung request would otherwise outlive the lease while the
  leader keeps reconciling) and transport errors treated as failed attempts (it catches only
  ApiException, so a dropped connection would end the election with kopf still running);
- a watchdog: the leader exits when its last successful renewal is older than the renew
  deadline, whatever the election loop is doing, and the standby can only take over a full
  lease duration after that renewal was observed;
- releasing the Lease on a graceful stop (SIGTERM), so a rollout hands over at once instead of
  after a lease duration;
- exit codes: losing the Lease ends the process with status 1 at once (os._exit, no cleanup
  that could still write), and Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection.electionconfig import Config
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from . import kube

log = logging.getLogger("prefix_operator.leader")

DEFAULT_LEASE_NAME = "prefix-operator-leader"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# kubernetes_asyncio's Config refuses a renew deadline within this factor of the retry period
# (a renewal must get more than one attempt before the deadline).
JITTER_FACTOR = 1.2
# Exit status when the Lease is lost or the election cannot go on.
EXIT_LOST = 1


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problems(self) -> list[str]:
        """Why these timings are unsafe (empty: fine). The library checks the same, but
        raises one at a time and only once the process is connected."""
        out = []
        if self.retry_period < 1:
            out.append("the retry period must be at least 1 s")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            out.append(f"the renew deadline must exceed {JITTER_FACTOR} x the retry period")
        if self.lease_duration <= self.renew_deadline:
            # The gap is the margin in which a leader that stopped renewing exits before a
            # standby may take over.
            out.append("the lease duration must exceed the renew deadline")
        if not self.name or not self.namespace or not self.identity:
            out.append("the lease name, namespace and identity must not be empty")
        return out

    @property
    def request_timeout(self) -> float:
        # Several attempts fit in one renew deadline, and one hung call never eats all of it.
        return max(1.0, self.renew_deadline / 3)


def default_identity(environ: dict[str, str] | None = None) -> str:
    """The pod's name (POD_ID, set by the chart from metadata.name; kopf reads the same
    variable), else hostname and pid: unique among candidates, which is all the Lease needs."""
    env = os.environ if environ is None else environ
    return env.get("POD_ID") or env.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_namespace(
    environ: dict[str, str] | None = None, sa_namespace: Path = SERVICE_ACCOUNT_NAMESPACE
) -> str:
    """POD_NAMESPACE, else the pod's own namespace (its ServiceAccount mount), else default."""
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        ns = sa_namespace.read_text().strip()
    except OSError:
        ns = ""
    return ns or "default"


def _utc_micro(ts: float) -> str:
    # The library formats local time and appends "Z"; a Lease must show UTC.
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class TimedLeaseLock(LeaseLock):
    """The library's LeaseLock with a timeout per call, transport errors as failures, UTC
    timestamps, and the time of the last successful write by this candidate."""

    def __init__(self, settings: LeaseSettings, api: client.ApiClient,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(settings.name, settings.namespace, settings.identity, api)
        self.settings = settings
        self.clock = clock
        # clock() at the start of the last create/update that made us the holder.
        self.held_since_write: float | None = None

    async def _call(self, coro: Awaitable[Any], what: str) -> Any:
        try:
            return await asyncio.wait_for(coro, self.settings.request_timeout)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            log.warning(
                "lease %s/%s: %s failed: %s", self.namespace, self.name, what, e or type(e).__name__
            )
            raise _TransportError(str(e) or type(e).__name__) from e

    async def get(self, name: str, namespace: str) -> Any:
        try:
            return await self._call(super().get(name, namespace), "read")
        except _TransportError as e:
            # The library reads `body` of a failed get as JSON; code 0 is "not 404": it logs
            # the error and counts the attempt as failed.
            exc = ApiException(status=0, reason=str(e))
            exc.body = json.dumps({"code": 0, "message": str(e)})
            return False, exc

    async def create(
        self, name: str, namespace: str, election_record: LeaderElectionRecord
    ) -> bool:
        started = self.clock()
        try:
            ok = bool(await self._call(super().create(name, namespace, election_record), "create"))
        except _TransportError:
            return False
        self._wrote(ok, election_record, started)
        return ok

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        started = self.clock()
        try:
            ok = bool(await self._call(super().update(name, namespace, updated_record), "update"))
        except _TransportError:
            return False
        self._wrote(ok, updated_record, started)
        return ok

    def _wrote(self, ok: bool, record: LeaderElectionRecord, started: float) -> None:
        if ok and record.holder_identity == self.identity:
            self.held_since_write = started

    def update_lease(
        self,
        leader_election_record: LeaderElectionRecord,
        current_spec: client.V1LeaseSpec | None = None,
    ) -> client.V1LeaseSpec:
        # The library writes the record's times, formatted from local time with a "Z"
        # appended, into current_spec itself: note what the Lease said before it does.
        held_by_us = current_spec is not None and current_spec.holder_identity == self.identity
        acquired = current_spec.acquire_time if current_spec is not None else None
        spec = super().update_lease(leader_election_record, current_spec)
        now = _utc_micro(time.time())
        spec.renew_time = now
        spec.acquire_time = acquired if held_by_us and acquired is not None else now
        return spec

    async def release(self) -> bool:
        """Hand the Lease back (holder cleared, duration 1 s) if we still hold it: a standby
        takes it on its next attempt. The write carries the resourceVersion just read, so it
        never clears a Lease another candidate has taken meanwhile."""
        api = client.CoordinationV1Api(api_client=self.api_instance.api_client)
        try:
            lease = await asyncio.wait_for(
                api.read_namespaced_lease(self.name, self.namespace), self.settings.request_timeout
            )
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = _utc_micro(time.time())
            await asyncio.wait_for(
                api.replace_namespaced_lease(self.name, self.namespace, lease),
                self.settings.request_timeout,
            )
        except (ApiException, TimeoutError, aiohttp.ClientError, OSError) as e:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, e)
            return False
        return True


class _TransportError(Exception):
    pass


class StandbyHealth:
    """Answers the liveness/readiness URL while this process is a standby (kopf's own endpoint
    only exists once kopf runs): a standby is healthy, and a rollout must see it Ready."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._runner: web.AppRunner | None = None

    async def start(self, status: Callable[[], dict[str, Any]]) -> None:
        if not self.url:
            return
        parts = urllib.parse.urlsplit(self.url)

        async def health(_: web.Request) -> web.Response:
            return web.json_response(status())

        app = web.Application()
        app.router.add_get(parts.path or "/", health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, parts.hostname or "0.0.0.0", parts.port or 80, reuse_address=True
        )
        await site.start()

    async def stop(self) -> None:
        # Before kopf starts: it binds the same address for its own liveness endpoint.
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def lost(reason: str) -> None:
    """Stop at once: a leader that can no longer prove it holds the Lease must not write
    another object (a standby may take over a few seconds from now). No cancellation, no
    finally blocks: those could still reach the API server."""
    log.critical(
        "leader election: %s; exiting so that Kubernetes restarts this process as a standby", reason
    )
    for h in logging.getLogger().handlers:
        h.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOST)


async def watchdog(
    lock: TimedLeaseLock,
    settings: LeaseSettings,
    on_lost: Callable[[str], None] = lost,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """While leading: exit once the last successful renewal is older than the renew deadline.

    The standby measures expiry from when it saw that renewal land, which is after the write
    started (what we measure from), so the leader is gone at least lease_duration -
    renew_deadline before a standby can take over."""
    interval = min(0.5, settings.retry_period / 4)
    while True:
        written = lock.held_since_write
        if written is None or lock.clock() - written > settings.renew_deadline:
            on_lost(
                f"no successful renewal of lease {settings.namespace}/{settings.name} "
                f"within the renew deadline ({settings.renew_deadline:g} s)"
            )
            return
        await sleep(interval)


async def run_elected(
    settings: LeaseSettings,
    lead: Callable[[], Awaitable[None]],
    *,
    health_url: str | None = None,
    api: client.ApiClient | None = None,
) -> int:
    """Wait for the Lease, then run `lead()` (kopf) while holding it. Returns the exit status
    for a graceful end (SIGTERM/SIGINT, or `lead` returning or failing); a lost Lease does not
    return (see lost())."""
    api = api or await kube.connect()
    lock = TimedLeaseLock(settings, api)
    health = StandbyHealth(health_url)
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[int] = loop.create_future()
    finished: asyncio.Future[BaseException | None] = loop.create_future()
    leading: asyncio.Task[None] | None = None
    guard: asyncio.Task[None] | None = None
    election: LeaderElection | None = None

    def on_signal(sig: signal.Signals) -> None:
        # kopf installs its own handlers once it runs; until then a signal ends the standby.
        if not stop.done():
            log.info("%s received while not leading: stopping", sig.name)
            stop.set_result(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    async def on_started() -> None:
        nonlocal leading, guard
        leading = asyncio.current_task()
        # Before kopf starts, so that kopf counts it as a task that is not its own.
        guard = asyncio.create_task(watchdog(lock, settings), name="lease watchdog")
        await health.stop()
        log.info(
            "leader election: %s holds lease %s/%s; starting the operator",
            settings.identity,
            settings.namespace,
            settings.name,
        )
        try:
            await lead()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # kopf's fatal errors end the process, reported below
            if not finished.done():
                finished.set_result(e)
        else:
            if not finished.done():
                finished.set_result(None)

    async def on_stopped() -> None:
        lost(
            f"lease {settings.namespace}/{settings.name} was not renewed within the renew "
            f"deadline ({settings.renew_deadline:g} s)"
        )

    def status() -> dict[str, Any]:
        record = election.observed_record if election else None
        return {
            "leader": False,
            "identity": settings.identity,
            "lease": f"{settings.namespace}/{settings.name}",
            "holder": record.holder_identity if record else None,
        }

    election = LeaderElection(
        Config(
            lock=lock,
            lease_duration=settings.lease_duration,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
            onstarted_leading=on_started,
            onstopped_leading=on_stopped,
        )
    )
    await health.start(status)
    log.info(
        "leader election: %s waiting for lease %s/%s (duration %d s, renew deadline "
        "%g s, retry %g s)",
        settings.identity,
        settings.namespace,
        settings.name,
        settings.lease_duration,
        settings.renew_deadline,
        settings.retry_period,
    )
    electing = asyncio.create_task(election.run(), name="leader election")
    try:
        done, _ = await asyncio.wait(
            {electing, stop, finished}, return_when=asyncio.FIRST_COMPLETED
        )
        if electing in done and leading is not None:
            # The renew loop ended without the library's loss callback (an unexpected error):
            # nothing renews any more, so nothing may reconcile any more.
            err = electing.exception()
            lost(f"the election loop ended while leading: {err!r}")
        if electing in done:
            err = electing.exception()
            log.error("leader election failed before this process led: %r", err)
            return EXIT_LOST
        # A graceful end: stop renewing, stop kopf if it is still running, hand the Lease over.
        electing.cancel()
        if guard is not None:
            guard.cancel()
        if leading is not None and not leading.done():
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)
        if leading is not None and await lock.release():
            log.info("leader election: released lease %s/%s", settings.namespace, settings.name)
        if finished.done() and finished.result() is not None:
            err = finished.result()
            log.error("the operator failed: %r", err, exc_info=err)
            return 1
        return 0
    finally:
        electing.cancel()
        await asyncio.gather(electing, return_exceptions=True)
        await health.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await api.close()
