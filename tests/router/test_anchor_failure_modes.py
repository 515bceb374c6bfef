"""The anchors' known failure modes, through the router core (index, load counts, profile) at the
settings it ships with: tests/router/scheduling/ checks the pipeline's parts with parameters
picked per case, which says nothing of the defaults a user runs."""

import json
from collections import Counter

from prefix_router.attempt import Attempt, Route
from prefix_router.core import RouterCore
from prefix_router.parsing import parse_request
from prefix_router.scheduling import Candidate
from prefix_router.scheduling.filters import load_limit

BACKENDS = [f"http://192.0.2.{i + 1}:8000" for i in range(8)]
SYSTEM_BYTES = 8_000  # ~2,000 tokens at the router's 4 bytes a token


KV = 24_000  # what the benchmarks give each simulator on system-prompts


def _chat(system: str, user: str):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    return parse_request(json.dumps(body).encode(), "chat")


async def _send(core: RouterCore, system: str, user: str) -> tuple[Route, Attempt]:
    """What the proxy does until the engine's first token: route, start an attempt (its
    load counts), confirm it (the index records the prompt)."""
    route = await core.route(_chat(system, user))
    attempt = Attempt(core.ledger, route, route.decision.backend)
    attempt.answered(200)
    attempt.first_byte(streamed=True)
    return route, attempt


def _done(attempt: Attempt) -> None:
    attempt.close()


def _limit(core: RouterCore) -> float:
    s = core.settings
    cands = [Candidate(b, core.load.inflight(b)) for b in BACKENDS]
    return load_limit(cands, s.load_bound, s.load_slack)


async def test_misses_one_at_a_time_do_not_all_land_on_one_backend(make_core):
    # An idle fleet, requests one after another (each done before the next): a router that
    # breaks ties by a fixed order sends every new prefix to its first backend.
    core = make_core(BACKENDS, KV)
    got = []
    for i in range(64):
        _route, attempt = await _send(core, f"system prompt {i} " + "x" * SYSTEM_BYTES, "hi")
        _done(attempt)
        got.append(attempt.backend)
    assert len(set(got[:8])) == 8, got[:8]  # the first eight go to eight backends
    assert max(Counter(got).values()) <= 2 * 64 / 8, Counter(got)


async def test_one_shared_system_prompt_gets_no_monopoly(make_core):
    # Every request carries the same system prompt, ~40 in flight: no backend may take more
    # than the load bound allows, so the prompt must get more owners.
    core = make_core(BACKENDS, KV)
    system = "You are a careful assistant. " * (SYSTEM_BYTES // 29)
    in_flight: list[Attempt] = []
    served: Counter[str] = Counter()
    most = 0
    for i in range(400):
        limit = _limit(core)
        most = max(most, limit)
        _route, attempt = await _send(core, system, f"question {i}")
        backend = attempt.backend
        assert core.load.inflight(backend) <= limit  # counted this one: within the bound
        in_flight.append(attempt)
        served[backend] += 1
        if len(in_flight) > 40:  # the oldest finishes: load stays ~40 in flight
            _done(in_flight.pop(0))
    assert len(served) >= 4, served
    # holding at most `limit` of the ~40 in flight, a backend serves at most that share
    assert max(served.values()) <= 400 * most / 40, (served, most)


async def test_overflow_keeps_affinity_to_a_partial_owner(make_core):
    # The owner of the whole prompt is past the bound. The request must go to a backend that
    # holds part of the prompt (the shared system prompt), not to a cold one at random.
    core = make_core(BACKENDS, KV)
    system = "Shared system prompt. " * (SYSTEM_BYTES // 22)
    # user turns of many blocks, so the owner holds blocks the partial owner does not
    mine, theirs = "only the owner holds this turn " * 20, "another user's turn " * 30
    _route, attempt = await _send(core, system, mine)
    _done(attempt)
    owner = attempt.backend
    # a second backend holds the system prompt (another user turn), placed there by hand
    partial = next(b for b in BACKENDS if b != owner)
    other = await core.route(_chat(system, theirs))
    core.index.table.record("m", other.hashes, partial)
    # the owner fills up to the bound: mean (7 + 1) / 8 = 1, limit max(ceil(1.5), 1 + 6) = 7
    for _ in range(100):
        if core.load.inflight(owner) + 1 > _limit(core):
            break
        core.load.start(owner, 0.0)
    route = await core.route(_chat(system, mine))
    assert route.decision.backend == partial, route.decision
    assert route.decision.reason == "replicated"  # the full owner was held back
    assert route.decision.matched_blocks > 0
    assert route.decision.order[-1] == owner  # kept as the last resort for a retry
