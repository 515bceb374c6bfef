"""Which ownership records are news (recorded at once, before the request's task yields) and
which only refresh the table (deferred off the path to the engine, proxy.py)."""

import json

from prefix_router.parsing import parse_request

BACKENDS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def _parsed():
    body = {"model": "m", "messages": [{"role": "system", "content": "S" * 4000}]}
    return parse_request(json.dumps(body).encode(), "chat")


async def test_a_first_placement_is_news_and_a_repeat_on_its_owner_is_not(make_router):
    router = make_router(BACKENDS, 100_000)
    first = await router.plan(_parsed())
    assert first.decision.reason == "miss"
    owner = first.decision.backend
    assert router.is_news(first, owner)
    router.own(first, owner, news=True)
    again = await router.plan(_parsed())
    assert again.decision.reason == "hit" and again.decision.backend == owner
    assert not router.is_news(again, owner)
    other = next(b for b in BACKENDS if b != owner)
    assert router.is_news(again, other)  # a retry on a fallback makes a new owner
