"""The Responses API through three router replicas on one Redis, with the official `openai`
client, in front of simulators that store responses as vLLM does (each in its own memory):
every follow-up, GET and cancel reaches the engine holding its response, whichever router it
comes through, and an id no engine holds is a 404 at once."""

from __future__ import annotations

import openai
import pytest
import redis.asyncio as aioredis

from bench.harness.fleet import Fleet

MODEL = "test-model"


@pytest.fixture
async def routers(fleet: Fleet, start_sims) -> list[str]:
    sims = await start_sims(fleet, 4, extra=["--enable-responses-api-store"])
    redis_url = await fleet.start_redis()
    out = []
    for i in range(3):
        r = await fleet.start_router(
            f"router{i}", sims, policy="prefix", kv_capacity=100_000,
            extra=["--store", "redis", "--redis-url", redis_url, "--model-key", "ns/m"],
        )
        out.append(r.url)
    return out


def _clients(routers: list[str]) -> list[openai.AsyncOpenAI]:
    return [openai.AsyncOpenAI(base_url=f"{u}/v1", api_key="none", max_retries=0)
            for u in routers]  # fmt: skip


async def test_a_conversation_continues_through_any_router(routers) -> None:
    clients = _clients(routers)
    for session in range(4):
        first = await clients[session % 3].responses.create(
            model=MODEL, instructions=f"You are agent {session}. " * 20,
            input="Start.", max_output_tokens=8,
        )
        previous = first.id
        for turn in range(1, 5):  # each turn through another router than the last
            client = clients[(session + turn) % 3]
            if turn % 2:
                r = await client.responses.create(
                    model=MODEL, previous_response_id=previous, input=f"turn {turn}",
                    max_output_tokens=8,
                )
            else:
                async with client.responses.stream(
                    model=MODEL, previous_response_id=previous, input=f"turn {turn}",
                    max_output_tokens=8,
                ) as stream:
                    r = await stream.get_final_response()
            assert r.id != previous
            previous = r.id
        # the stored response, read through every router
        for client in clients:
            got = await client.responses.retrieve(previous)
            assert got.id == previous
    for c in clients:
        await c.close()


async def test_an_unknown_response_is_a_404_at_once(routers) -> None:
    for client in _clients(routers):
        with pytest.raises(openai.NotFoundError) as err:
            await client.responses.retrieve("resp_nobody_stored_this")
        assert err.value.body["code"] == "response_not_found"  # the router's, not an engine's
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model=MODEL, previous_response_id="resp_nope",
                                          input="hi", max_output_tokens=4)  # fmt: skip
        await client.close()


async def test_cancel_reaches_the_engine_holding_the_response(routers) -> None:
    a, b, c = _clients(routers)
    r = await a.responses.create(model=MODEL, input="hello", max_output_tokens=4)
    # the engine's own answer to cancelling a finished synchronous response
    with pytest.raises(openai.BadRequestError) as err:
        await b.responses.cancel(r.id)
    assert "Cannot cancel" in str(err.value)
    for client in (a, b, c):
        await client.close()


async def test_a_background_stream_is_cancelled_by_id_while_it_streams(routers) -> None:
    """The id is known to every router from the stream's first event, not from its end: a
    client cancels (or reads back) a long background response while it still streams."""
    a, b, c = _clients(routers)
    stream = await a.responses.create(model=MODEL, input="go", background=True, stream=True,
                                      max_output_tokens=5000)  # fmt: skip
    events = 0
    async for event in stream:
        events += 1
        if event.type == "response.created":
            got = await b.responses.cancel(event.response.id)
            assert got.status == "cancelled"
            assert (await c.responses.retrieve(event.response.id)).status == "cancelled"
    assert events < 5000  # the stream ended at the cancel, not at its last token
    for client in (a, b, c):
        await client.close()



async def test_an_answer_reaches_the_client_only_once_every_router_can_find_it(
    fleet: Fleet, start_sims, tmp_path
) -> None:
    """Redis pausing writes (CLIENT PAUSE WRITE: reads still answered) shows the race a busy
    host makes rare: were the new id's write still on its way when the answer reached the
    client, a follow-up sent at once through another router would be a 404. The answer (a
    stream: its first event) waits for the write, within the store's timeout."""
    sims = await start_sims(fleet, 2, extra=["--enable-responses-api-store"])
    redis_url = await fleet.start_redis()
    config = tmp_path / "router.yaml"
    config.write_text("store:\n  timeout_max_ms: 5000\n")  # over the pause below
    routers = [(await fleet.start_router(
        f"router{i}", sims, policy="prefix", kv_capacity=100_000,
        extra=["--store", "redis", "--redis-url", redis_url, "--config", str(config)],
    )).url for i in range(2)]  # fmt: skip
    a, b = _clients(routers)
    async with aioredis.from_url(redis_url) as r:
        for stream in (False, True):
            # under the routers' 1 s socket timeout: a paused write is slow, not failed
            await r.execute_command("CLIENT", "PAUSE", "800", "WRITE")
            if stream:
                async with a.responses.stream(model=MODEL, input="hello",
                                              max_output_tokens=4) as s:  # fmt: skip
                    first = await s.get_final_response()
            else:
                first = await a.responses.create(model=MODEL, input="hello", max_output_tokens=4)
            follow = await b.responses.create(model=MODEL, previous_response_id=first.id,
                                              input="more", max_output_tokens=4)  # fmt: skip
            assert follow.previous_response_id == first.id
    for c in (a, b):
        await c.close()
