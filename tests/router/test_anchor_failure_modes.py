"""The anchors' known failure modes, through the Router (table, load counts, policy) at the
settings it ships with: tests/router/test_policy.py checks the policy function alone with
parameters picked per case, which says nothing of the defaults a user runs."""

import json
from collections import Counter

from prefix_router.parsing import parse_request
from prefix_router.policy import Candidate, load_limit
from prefix_router.routing import Plan, Router

BACKENDS = [f"http://10.0.0.{i}:8000" for i in range(8)]
SYSTEM_BYTES = 8_000  # ~2,000 tokens at the router's 4 bytes a token


KV = 24_000  # what the benchmarks give each simulator on system-prompts


def _chat(system: str, user: str):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    return parse_request(json.dumps(body).encode(), "chat")


async def _send(router: Router, system: str, user: str) -> tuple[Plan, str, float]:
    """What the proxy does before the engine answers: plan, count the load, record.
    Returns the plan, its backend and the prefill it was counted with."""
    plan = await router.plan(_chat(system, user))
    backend = plan.decision.backend
    prefill = router.dispatch(plan, backend)
    router.own(plan, backend, router.is_news(plan, backend))
    return plan, backend, prefill


def _done(router: Router, backend: str, prefill: float) -> None:
    router.first_byte(backend, prefill)
    router.finished(backend)


def _limit(router: Router) -> float:
    s = router.settings
    cands = [Candidate(b, router.load.inflight(b)) for b in BACKENDS]
    return load_limit(cands, s.load_bound, s.load_slack)


async def test_misses_one_at_a_time_do_not_all_land_on_one_backend(make_router):
    # An idle fleet, requests one after another (each done before the next): a router that
    # breaks ties by a fixed order sends every new prefix to its first backend.
    router = make_router(BACKENDS, KV)
    got = []
    for i in range(64):
        _plan, backend, prefill = await _send(
            router, f"system prompt {i} " + "x" * SYSTEM_BYTES, "hi"
        )
        _done(router, backend, prefill)
        got.append(backend)
    assert len(set(got[:8])) == 8, got[:8]  # the first eight go to eight backends
    assert max(Counter(got).values()) <= 2 * 64 / 8, Counter(got)


async def test_one_shared_system_prompt_gets_no_monopoly(make_router):
    # Every request carries the same system prompt, ~40 in flight: no backend may take more
    # than the load bound allows, so the prompt must get more owners.
    router = make_router(BACKENDS, KV)
    system = "You are a careful assistant. " * (SYSTEM_BYTES // 29)
    inflight: list[tuple[str, float]] = []
    served: Counter[str] = Counter()
    for i in range(400):
        limit = _limit(router)
        _plan, backend, prefill = await _send(router, system, f"question {i}")
        assert router.load.inflight(backend) <= limit  # counted this one: within the bound
        inflight.append((backend, prefill))
        served[backend] += 1
        if len(inflight) > 40:  # the oldest finishes: load stays ~40 in flight
            _done(router, *inflight.pop(0))
    assert len(served) >= 4, served
    assert max(served.values()) / (400 / 8) <= 2.0, served


async def test_overflow_keeps_affinity_to_a_partial_owner(make_router):
    # The owner of the whole prompt is past the bound. The request must go to a backend that
    # holds part of the prompt (the shared system prompt), not to a cold one at random.
    router = make_router(BACKENDS, KV)
    system = "Shared system prompt. " * (SYSTEM_BYTES // 22)
    # user turns of many blocks, so the owner holds blocks the partial owner does not
    mine, theirs = "only the owner holds this turn " * 20, "another user's turn " * 30
    _plan, owner, prefill = await _send(router, system, mine)
    _done(router, owner, prefill)
    # a second backend holds the system prompt (another user turn), placed there by hand
    partial = next(b for b in BACKENDS if b != owner)
    other = await router.plan(_chat(system, theirs))
    router.own(other, partial, news=True)
    # the owner fills up to the bound: mean (7 + 1) / 8 = 1, limit max(ceil(1.5), 1 + 6) = 7
    for _ in range(100):
        if router.load.inflight(owner) + 1 > _limit(router):
            break
        router.load.start(owner, 0.0)
    plan = await router.plan(_chat(system, mine))
    assert plan.decision.backend == partial, plan.decision
    assert plan.decision.reason == "replicated"  # the full owner was held back
    assert plan.decision.matched_blocks > 0
    assert plan.decision.order[-1] == owner  # kept as the last resort for a retry
