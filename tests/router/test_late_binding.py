"""Late binding (issue 39): a request that waited in the dispatch queue is scored only when an
engine has room, so it goes where its prefix is then, and only to an engine with room."""

import asyncio
import json

from prefix_router.attempt import Attempt
from prefix_router.parsing import parse_request

BACKENDS = ["http://192.0.2.1:8000", "http://192.0.2.2:8000", "http://192.0.2.3:8000"]
QUEUE = {"max_in_flight": 1, "max_waiting": 0}


def _parsed(system: str, user: str = "hi"):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    return parse_request(json.dumps(body).encode(), "chat")


async def _fill(core, backend: str) -> Attempt:
    route = await core.route(_parsed(f"filler for {backend} " * 100))
    return Attempt(core.ledger, route, backend)


async def test_a_queued_request_is_bound_where_its_prefix_is_when_released(make_core):
    core = make_core(BACKENDS, 100_000, queue=QUEUE)
    held = [await _fill(core, b) for b in BACKENDS]  # every engine's one slot taken
    parsed = _parsed("S" * 4000)
    waiting = asyncio.create_task(core.route(parsed))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done() and core.dispatch.queued == 1
    # while it waits, its prefix lands on the second engine (another request, answered)
    key = await core.keyer.key(parsed, core.backends.healthy())
    core.index.own("m", key.hashes, BACKENDS[1])
    held[1].close()  # the second engine frees a slot
    route = await asyncio.wait_for(waiting, 30)
    assert (route.decision.backend, route.decision.reason) == (BACKENDS[1], "hit")
    for a in held:
        a.close()


async def test_a_released_request_goes_to_an_engine_with_room(make_core):
    core = make_core(BACKENDS, 100_000, queue=QUEUE)
    held = [await _fill(core, b) for b in BACKENDS]
    parsed = _parsed("T" * 4000)
    key = await core.keyer.key(parsed, core.backends.healthy())
    core.index.own("m", key.hashes, BACKENDS[0])  # its prefix is on a saturated engine
    waiting = asyncio.create_task(core.route(parsed))
    for _ in range(5):
        await asyncio.sleep(0)
    held[2].close()  # the third engine frees a slot
    route = await asyncio.wait_for(waiting, 30)
    assert route.decision.backend == BACKENDS[2]
    for a in held:
        a.close()


async def test_no_request_goes_to_a_saturated_engine_while_another_has_room(make_core):
    core = make_core(BACKENDS, 100_000, queue=QUEUE)
    held = await _fill(core, BACKENDS[0])  # the first engine's one slot is taken
    parsed = _parsed("U" * 4000)
    key = await core.keyer.key(parsed, core.backends.healthy())
    core.index.own("m", key.hashes, BACKENDS[0])  # its prefix is there
    route = await core.route(parsed)  # nothing queued: straight through
    assert core.dispatch.queued == 0 and route.decision.backend != BACKENDS[0]
    held.close()
