"""What only one engine holds (fleet_value.py), and the handoff of its prefixes when it leaves."""

from __future__ import annotations

import json

import pytest

from prefix_router.attempt import Attempt
from prefix_router.fleet_value import FleetValue, exclusive, successor
from prefix_router.parsing import parse_request
from prefix_router.scheduling.filters import eligible
from prefix_router.scheduling.picker import rendezvous

BACKENDS = [f"http://192.0.2.{i}:8000" for i in range(1, 5)]


def test_exclusive_is_the_strictly_longest_match_beyond_the_runner_up():
    assert exclusive({}) is None
    assert exclusive({"a": 0}) is None
    assert exclusive({"a": 5, "b": 5}) is None  # both hold it: losing one loses nothing
    ex = exclusive({"a": 3, "b": 7, "c": 5})
    assert ex is not None and (ex.backend, ex.blocks, ex.depth) == ("b", 2, 7)
    ex = exclusive({"a": 4})
    assert ex is not None and (ex.backend, ex.blocks) == ("a", 4)


def test_value_is_prefill_tokens_a_second_of_recent_exclusive_demand():
    now = [1000.0]
    fv = FleetValue(lambda blocks: 16.0 * blocks, window_s=10.0, clock=lambda: now[0])
    fv.observe("m", [1, 2, 3, 4], {"a": 4, "b": 1})  # 3 blocks only a holds
    fv.observe("m", [1, 2, 3, 4], {"a": 4, "b": 1})
    fv.observe("m", [9, 8], {"a": 2, "b": 2})  # shared: worth nothing to either
    fv.observe("m", [7, 6], {"b": 2})
    assert fv.values() == {"a": pytest.approx(2 * 3 * 16 / 10), "b": pytest.approx(2 * 16 / 10)}
    now[0] += 10.5  # the window has passed: no recent demand, no value
    assert fv.values() == {"a": 0.0, "b": 0.0}


def test_a_leaving_engine_hands_each_prefix_it_alone_held_to_its_rendezvous_successor():
    now = [0.0]
    fv = FleetValue(lambda b: 16.0 * b, keep_s=100.0, clock=lambda: now[0])
    chains = {k: [k, k + 1, k + 2] for k in (11, 22, 33, 44, 55)}
    for chain in chains.values():
        fv.observe("m", chain, {"a": 3})
    fv.observe("m", chains[55], {"a": 3, "b": 3})  # no longer a's alone
    now[0] = 50.0
    fv.observe("m", [66, 67], {"a": 2})
    now[0] = 120.0  # the first five were asked for longer than keep_s ago, 66 not
    assert [h.chain for h in fv.handoff("a", lambda m: ["a", "b", "c"])] == [(66, 67)]
    now[0] = 60.0
    plan = fv.handoff("a", lambda m: ["a", "b", "c"])
    assert {h.chain[0] for h in plan} == {11, 22, 33, 44, 66}
    for h in plan:
        assert h.successor == max(["b", "c"], key=lambda n: rendezvous(h.chain[0], n))
        assert h.successor == successor(h.chain[0], ["c", "b"])
    assert len({h.successor for h in plan}) == 2  # spread over the fleet, one heir each
    fv.forget("a")
    assert fv.handoff("a", lambda m: ["b", "c"]) == []


def _parsed(system: str, user: str = "hi"):
    body = {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}]}
    return parse_request(json.dumps(body).encode(), "chat")


async def _serve(core, system: str, user: str = "hi") -> str:
    route = await core.route(_parsed(system, user))
    with Attempt(core.ledger, route, route.decision.backend) as a:
        a.answered(200)
        a.first_byte(streamed=False)
        a.done("ok", None)
    return route.decision.backend


@pytest.mark.parametrize("how", ["terminating", "removed"])
async def test_followers_of_a_leaving_engines_prefixes_meet_on_its_successor(make_core, how):
    """Each prefix only the leaving engine held is found on one successor (the rendezvous
    order of its first block) by the next request, and by the ones after it; nothing new goes
    to the leaving engine. Without the handoff, each follower is a miss placed by load."""
    core = make_core(BACKENDS, 1_000_000)
    systems = [f"system prompt number {i} " * 40 for i in range(12)]
    held: dict[str, str] = {}
    for s in systems:
        held[s] = await _serve(core, s)
        await _serve(core, s, "again")  # asked for twice: demand only its engine serves
    leaving = max(set(held.values()), key=lambda b: list(held.values()).count(b))
    mine = [s for s in systems if held[s] == leaving]
    assert mine and core.fleet is not None and core.fleet.values()[leaving] > 0
    if how == "terminating":
        core.backends.mark_leaving([leaving])
    else:
        core.backends.set_members([b for b in BACKENDS if b != leaving])
    stay = [b for b in BACKENDS if b != leaving]
    for s in mine:
        first = await core.route(_parsed(s, "a follower"))
        key = first.key.hashes[0]
        heir = max(stay, key=lambda n: rendezvous(key, n))
        assert (first.decision.backend, first.decision.reason) == (heir, "hit")
        second = await core.route(_parsed(s, "another follower"))
        assert second.decision.backend == heir
    for s in systems:
        route = await core.route(_parsed(s, "more"))
        assert route.decision.backend != leaving


def test_a_leaving_backend_takes_nothing_new_unless_all_are_leaving(make_core):
    core = make_core(BACKENDS[:2], 100_000)
    core.backends.mark_leaving([BACKENDS[0]])
    assert [b.url for b in eligible(core.backends, frozenset(), "m")] == [BACKENDS[1]]
    core.backends.mark_leaving(BACKENDS[:2])
    assert {b.url for b in eligible(core.backends, frozenset(), "m")} == set(BACKENDS[:2])
    # level-triggered: an address no longer leaving (a new pod behind it) takes requests
    core.backends.mark_leaving([BACKENDS[1]])
    assert [b.url for b in eligible(core.backends, frozenset(), "m")] == [BACKENDS[0]]


def test_discovery_tells_terminating_endpoints_from_ready_ones():
    from kubernetes_asyncio.client import (
        DiscoveryV1EndpointPort,
        V1EndpointConditions,
        V1EndpointSlice,
        V1ObjectMeta,
        V1ObjectReference,
    )
    from kubernetes_asyncio.client import V1Endpoint as Endpoint

    from prefix_router.kube_discovery import leaving_addresses, ready_addresses

    def ep(ip: str, pod: str, **cond: bool) -> Endpoint:
        return Endpoint(addresses=[ip], conditions=V1EndpointConditions(**cond),
                        target_ref=V1ObjectReference(kind="Pod", name=pod))

    sl = V1EndpointSlice(
        address_type="IPv4", metadata=V1ObjectMeta(name="s"),
        ports=[DiscoveryV1EndpointPort(port=8000)],
        endpoints=[ep("198.18.0.1", "a", ready=True),
                   ep("198.18.0.2", "b", ready=False, serving=True, terminating=True),
                   ep("198.18.0.3", "c", ready=False, serving=False, terminating=True),
                   ep("198.18.0.4", "d", ready=False)])
    assert ready_addresses(sl, 8000) == [("198.18.0.1", 8000, "a")]
    assert leaving_addresses(sl, 8000) == [("198.18.0.2", 8000, "b"),
                                           ("198.18.0.3", 8000, "c")]


async def test_without_the_handoff_a_leaving_engines_prefixes_go_unowned(make_core):
    """`handoff: false` (the bench's scale-down without it): the leaving engine's prefixes
    are owned by nobody, so their first followers are misses, not hits on an heir."""
    core = make_core(BACKENDS, 1_000_000, handoff=False)
    systems = [f"system prompt number {i} " * 40 for i in range(12)]
    held: dict[str, str] = {}
    for s in systems:
        held[s] = await _serve(core, s)
        await _serve(core, s, "again")  # as above: a chain only its engine serves
    leaving = max(set(held.values()), key=lambda b: list(held.values()).count(b))
    core.backends.set_members([b for b in BACKENDS if b != leaving])
    for s in (s for s in systems if held[s] == leaving):
        assert (await core.route(_parsed(s, "a follower"))).decision.reason != "hit"
