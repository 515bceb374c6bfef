"""Leader election parts that need no cluster: settings, CLI flags, the Lease spec we write,
the watchdog, the standby's health endpoint, and API failures (a closed port, a server that
never answers) counted as failed attempts instead of ending the election.

The election against a real kube-apiserver: tests/k8s/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from waiting import scaled

from prefix_operator import cli, leader
from prefix_operator.leader import LeaseSettings, StandbyHealth, TimedLeaseLock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(**kw: object) -> LeaseSettings:
    base: dict[str, object] = {"name": "l", "namespace": "ns", "identity": "me"}
    return LeaseSettings(**{**base, **kw})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- settings


def test_default_timings_are_the_client_go_ones_and_valid() -> None:
    s = settings()
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15, 10.0, 2.0)
    assert s.problems() == []


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"lease_duration": 10}, "lease duration must exceed the renew deadline"),
        ({"renew_deadline": 2.4}, "renew deadline must exceed 1.2 x the retry period"),
        ({"retry_period": 0.5, "renew_deadline": 0.8}, "retry period must be at least 1 s"),
        ({"identity": ""}, "must not be empty"),
    ],
)
def test_unsafe_timings_are_named(kw: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in settings(**kw).problems())


def test_request_timeout_leaves_room_for_several_attempts() -> None:
    assert settings().request_timeout == pytest.approx(10 / 3)
    assert settings(lease_duration=3, renew_deadline=2.5, retry_period=1).request_timeout == 1


def test_identity_is_the_pod_name_else_host_and_pid() -> None:
    assert leader.default_identity({"POD_ID": "op-7f9c-abcde"}) == "op-7f9c-abcde"
    assert leader.default_identity({"POD_NAME": "p"}) == "p"
    own = leader.default_identity({})
    assert own == f"{socket.gethostname()}-{__import__('os').getpid()}"


def test_lease_namespace_from_env_then_service_account_then_default(tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    assert leader.default_namespace({"POD_NAMESPACE": "ops"}, sa) == "ops"
    assert leader.default_namespace({}, sa) == "default"
    sa.write_text("prefix-router\n")
    assert leader.default_namespace({}, sa) == "prefix-router"


# --------------------------------------------------------------------------- CLI


def test_cli_leader_election_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIX_OPERATOR_LEADER_ELECTION", raising=False)
    assert cli.parse_args([]).leader_election is False
    args = cli.parse_args(
        ["--leader-election", "--lease-namespace=ops", "--lease-identity=pod-1",
         "--lease-duration=20", "--renew-deadline=12", "--retry-period=3"]
    )  # fmt: skip
    assert cli.lease_settings(args) == LeaseSettings("prefix-operator-leader", "ops", "pod-1",
                                                     20, 12.0, 3.0)  # fmt: skip
    monkeypatch.setenv("PREFIX_OPERATOR_LEADER_ELECTION", "true")
    assert cli.parse_args([]).leader_election is True
    assert cli.parse_args(["--no-leader-election"]).leader_election is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--leader-election", "--peering=x"], "--peering and --leader-election exclude"),
        (["--leader-election", "--lease-duration=5"], "lease duration must exceed"),
    ],
)
def test_cli_refuses_unsafe_combinations(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- the Lease spec


@pytest.fixture
async def api() -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    c = client.ApiClient(cfg)
    yield c
    await c.close()


def record(holder: str) -> LeaderElectionRecord:
    now = str(datetime.now())
    return LeaderElectionRecord(holder, "15", now, now)


async def test_lease_spec_times_are_utc_and_acquire_time_kept_on_renewal(
    api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local zone far from UTC: the library's own stamps would be 9 h off.
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        lock = TimedLeaseLock(settings(), api)
        before = time.time()
        created = lock.update_lease(record("me"))
        after = time.time()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert created.holder_identity == "me" and created.lease_duration_seconds == 15
    for stamp in (created.renew_time, created.acquire_time):
        parsed = datetime.strptime(stamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
        # Written between the two readings of the clock (microseconds: no slack needed).
        assert before - 1e-6 <= parsed.timestamp() <= after + 1e-6
    held = client.V1LeaseSpec(holder_identity="me", acquire_time="2020-01-01T00:00:00.000000Z")
    renewed = lock.update_lease(record("me"), held)
    assert renewed.acquire_time == "2020-01-01T00:00:00.000000Z"
    assert renewed.renew_time != "2020-01-01T00:00:00.000000Z"
    theirs = client.V1LeaseSpec(holder_identity="other", acquire_time="2020-01-01T00:00:00Z")
    taken = lock.update_lease(record("me"), theirs)
    assert taken.holder_identity == "me" and taken.acquire_time != "2020-01-01T00:00:00Z"


async def test_unreachable_api_is_a_failed_attempt_not_a_crash(api: client.ApiClient) -> None:
    lock = TimedLeaseLock(settings(), api)
    found, err = await lock.get("l", "ns")
    assert found is False
    # What the library reads: a JSON body with a code that is not 404.
    assert json.loads(err.body)["code"] == 0
    assert await lock.create("l", "ns", record("me")) is False
    lock.lease_reference = client.V1Lease(spec=client.V1LeaseSpec())
    assert await lock.update("l", "ns", record("me")) is False
    assert lock.held_since_write is None
    assert await lock.release() is False


async def test_a_hung_api_call_times_out() -> None:
    # A server that accepts connections and never answers.
    hung = await asyncio.start_server(lambda r, w: asyncio.sleep(3600), "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    api = client.ApiClient(cfg)
    lock = TimedLeaseLock(settings(lease_duration=3, renew_deadline=2.5, retry_period=1), api)
    try:
        # Without the lock's own timeout (1 s here) this call would wait for the hour the
        # server sleeps; the bound is only there to fail instead of hanging.
        found, _ = await asyncio.wait_for(lock.get("l", "ns"), scaled(30))
        assert found is False
    finally:
        await api.close()
        hung.close()


# --------------------------------------------------------------------------- watchdog


class Clock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        await asyncio.sleep(0)


async def test_watchdog_gives_up_after_the_renew_deadline(api: client.ApiClient) -> None:
    s = settings(lease_duration=3, renew_deadline=1.5, retry_period=1)
    clock = Clock()
    lock = TimedLeaseLock(s, api, clock=clock)
    reasons: list[str] = []
    lock.held_since_write = clock()
    await leader.watchdog(lock, s, reasons.append, sleep=clock.sleep)
    # It noticed on its first look past the deadline: within one check interval (0.25 s).
    waited = clock() - lock.held_since_write
    assert 1.5 < waited <= 1.5 + 0.25
    assert reasons == ["no successful renewal of lease ns/l within the renew deadline (1.5 s)"]


async def test_watchdog_stays_quiet_while_renewals_land(api: client.ApiClient) -> None:
    s = settings(lease_duration=3, renew_deadline=1.5, retry_period=1)
    clock = Clock()
    lock = TimedLeaseLock(s, api, clock=clock)
    reasons: list[str] = []
    lock.held_since_write = clock()

    async def renewing() -> None:
        # A renewal every second for 30 s: twenty times the deadline, never past it.
        while clock() < 1030.0:
            if clock() - lock.held_since_write >= 1.0:
                lock.held_since_write = clock()
            await clock.sleep(0.25)
        lock.held_since_write = None  # the lease is lost at the end: the watchdog must notice

    def sleep(seconds: float) -> Any:
        return asyncio.sleep(0)  # the renewing task moves the clock

    await asyncio.gather(renewing(), leader.watchdog(lock, s, reasons.append, sleep=sleep))
    assert clock() >= 1030.0
    assert len(reasons) == 1 and clock.sleeps >= 120


# --------------------------------------------------------------------------- standby health


async def test_standby_health_answers_and_frees_the_port_for_kopf() -> None:
    port = free_port()
    health = StandbyHealth(f"http://127.0.0.1:{port}/healthz")
    await health.start(lambda: {"leader": False, "holder": "op-a"})
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200 and await r.json() == {"leader": False, "holder": "op-a"}
            async with s.get(f"http://127.0.0.1:{port}/other") as r:
                assert r.status == 404
    finally:
        await health.stop()
    # kopf binds the same address next.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def listening_sockets() -> set[str]:
    """The local addresses this process listens on (TCP, v4 and v6), read from /proc: the
    sockets among our descriptors whose state is LISTEN (0A)."""
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}  # fmt: skip
    out = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f"socket:[{f[9]}]" in mine:
                out.add(f[1])
    return out


async def test_standby_health_disabled_without_url() -> None:
    # Without kopf's liveness URL there is nothing to answer for: no listener at all (with
    # no URL to read a port from, a listener would land on 0.0.0.0:80).
    asked: list[int] = []
    before = listening_sockets()
    health = StandbyHealth(None)
    await health.start(lambda: {"asked": asked.append(1)})
    try:
        assert listening_sockets() == before
    finally:
        await health.stop()
    assert not asked
