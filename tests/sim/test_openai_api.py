"""The simulator's Responses API and embeddings through the official `openai` package (sync
and async clients, streamed and not), against real simulator processes."""

from __future__ import annotations

import asyncio
import math
import sys

import aiohttp
import openai
import pytest
from waiting import until

from bench.harness.fleet import Fleet, Proc, free_port

LONG = "You are a careful assistant who answers briefly. " * 40  # ~2,000 bytes: 30+ blocks


async def start_sim(
    fleet: Fleet, name: str, *, env: dict[str, str] | None = None, extra: list[str] | None = None
) -> Proc:
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "engine_sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        "m",
        "--kv-capacity-tokens",
        "50000",
        "--profile",
        "fast",
        "--replica-id",
        name,
        *(extra or []),
    ]
    return await fleet.start(name, args, port, "/health", env=env)


def sync_client(p: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=p.url + "/v1", api_key="none", max_retries=0)


def async_client(p: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=p.url + "/v1", api_key="none", max_retries=0)


STORE_ON = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


def _conversation(c: openai.OpenAI) -> str:
    first = c.responses.create(model="m", instructions=LONG, input="hello", max_output_tokens=5)
    assert first.id.startswith("resp_") and first.object == "response"
    # the simulator always stops at the limit: vLLM calls that "incomplete"
    assert first.status == "incomplete"
    assert first.incomplete_details.reason == "max_output_tokens"
    assert first.output_text and first.usage.output_tokens == 5
    assert first.usage.input_tokens_details.cached_tokens == 0

    # instructions again: a stored response's do not carry over (vLLM 0.34, the OpenAI API)
    second = c.responses.create(model="m", instructions=LONG, previous_response_id=first.id,
                                input="and more", max_output_tokens=3)  # fmt: skip
    assert second.previous_response_id == first.id
    # the first turn's prompt and answer are this one's prefix, cached on this engine
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16

    # the same conversation as a chat is the same prompt: every full block of it is cached
    chat = c.chat.completions.create(
        model="m",
        max_tokens=2,
        messages=[
            {"role": "system", "content": LONG},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "and more"},
        ],
    )
    assert chat.usage.prompt_tokens == second.usage.input_tokens
    assert chat.usage.prompt_tokens_details.cached_tokens >= chat.usage.prompt_tokens - 16

    streamed = list(
        c.responses.create(
            model="m", instructions=LONG, previous_response_id=first.id, input="and more",
            max_output_tokens=3, stream=True,
        )
    )  # fmt: skip
    assert streamed[-1].type == "response.completed"
    assert streamed[-1].response.usage.input_tokens == second.usage.input_tokens
    return streamed[-1].response.id

    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text

    with pytest.raises(openai.BadRequestError) as e:
        c.responses.cancel(first.id)  # finished, and not a background one
    assert e.value.body["message"] == "Cannot cancel a synchronous response."

    unstored = c.responses.create(model="m", input="x", store=False, max_output_tokens=2)
    assert unstored.output_text
    for call in (
        lambda: c.responses.retrieve(unstored.id),
        lambda: c.responses.create(model="m", input="y", previous_response_id=unstored.id),
        lambda: c.responses.cancel(unstored.id),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.status_code == 404
        assert e.value.body == {
            "message": f"Response with id '{unstored.id}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }


@pytest.mark.parametrize(
    "extra", [[], ["--tokenizer", "tiny", "--enable-prompt-tokens-details"]], ids=["bytes", "hf"]
)
async def test_a_responses_conversation_with_the_sync_client(
    fleet: Fleet, extra: list[str]
) -> None:
    sim = await start_sim(fleet, "sim0", env=STORE_ON, extra=extra)
    last = await asyncio.to_thread(_conversation, sync_client(sim))
    assert last.startswith("resp_")  # every turn checked inside


async def test_streamed_responses_with_the_async_client(fleet: Fleet) -> None:
    sim = await start_sim(fleet, "sim0", extra=["--enable-responses-api-store"])
    c = async_client(sim)
    stream = await c.responses.create(
        model="m",
        instructions="be brief",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "hi there"}]},
        ],
        max_output_tokens=4,
        stream=True,
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text and final.usage.output_tokens == 4
    assert (await c.responses.retrieve(final.id)).output_text == text

    # the client's stream helper rebuilds the response from the events' indices
    async with c.responses.stream(
        model="m", instructions="be brief", input="again", previous_response_id=final.id,
        max_output_tokens=3,
    ) as s:
        helped = await s.get_final_response()
    assert helped.output_text and helped.usage.output_tokens == 3
    assert helped.usage.input_tokens_details.cached_tokens > 0

    # a not streamed one with the async client, continuing the streamed one
    plain = await c.responses.create(
        model="m", input="last", previous_response_id=helped.id, max_output_tokens=2
    )
    assert plain.usage.input_tokens > helped.usage.input_tokens


async def test_background_responses_run_and_cancel(fleet: Fleet) -> None:
    # 10 ms a step: a 5,000-token answer runs for a minute unless cancelled
    sim = await start_sim(fleet, "sim0", env=STORE_ON, extra=["--time-scale", "5"])
    c = async_client(sim)
    long = await c.responses.create(model="m", input="go", background=True, max_output_tokens=5000)
    assert long.status == "queued" and long.background
    assert (await c.responses.retrieve(long.id)).status == "queued"
    cancelled = await c.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert (await c.responses.retrieve(long.id)).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        await c.responses.cancel(long.id)
    stats = await _stats(sim)
    # the engine let it go, before its end
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["generation_tokens"] < 5000
    async with aiohttp.ClientSession() as s, s.delete(f"{sim.url}/v1/responses/{long.id}") as r:
        assert r.status == 405  # vLLM has no DELETE for responses

    short = await c.responses.create(model="m", input="go", background=True, max_output_tokens=3)

    async def finished() -> bool:
        return (await c.responses.retrieve(short.id)).status == "incomplete"

    await until(finished, 30, "the background response finished")
    assert (await c.responses.retrieve(short.id)).usage.output_tokens == 3

    # a streamed background response, then its events again from a sequence number on
    stream = await c.responses.create(
        model="m", input="go", background=True, stream=True, max_output_tokens=3
    )
    events = [e async for e in stream]
    rid = events[0].response.id
    again = await c.responses.retrieve(rid, stream=True, starting_after=2)
    replayed = [e async for e in again]
    assert [e.sequence_number for e in replayed] == [e.sequence_number for e in events[3:]]
    assert replayed[-1].type == "response.completed"


async def _stats(sim: Proc) -> dict:
    async with aiohttp.ClientSession() as s, s.get(sim.url + "/stats") as r:
        return await r.json()


async def test_the_store_is_off_unless_switched_on_as_in_vllm(fleet: Fleet) -> None:
    sim = await start_sim(fleet, "sim0")
    c = async_client(sim)
    r = await c.responses.create(model="m", input="hi", max_output_tokens=2)  # store: default
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        await c.responses.create(model="m", input="hi", background=True)
    assert "VLLM_ENABLE_RESPONSES_API_STORE=1" in e.value.body["message"]
    assert e.value.body["param"] == "background"


async def test_a_stored_response_is_unknown_to_every_other_simulator(fleet: Fleet) -> None:
    a, b = await asyncio.gather(
        start_sim(fleet, "sim-a", env=STORE_ON), start_sim(fleet, "sim-b", env=STORE_ON)
    )
    ca, cb = async_client(a), async_client(b)
    r = await ca.responses.create(model="m", input="hi", max_output_tokens=2)
    raw = await ca.responses.with_raw_response.retrieve(r.id)
    assert raw.parse().id == r.id and raw.headers["x-replica-id"] == "sim-a"
    expected = {
        "message": f"Response with id '{r.id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    for call in (
        lambda: cb.responses.retrieve(r.id),
        lambda: cb.responses.create(model="m", input="more", previous_response_id=r.id),
        lambda: cb.responses.cancel(r.id),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            await call()
        assert e.value.body == expected
    follow = await ca.responses.create(
        model="m", input="more", previous_response_id=r.id, max_output_tokens=2
    )
    assert follow.previous_response_id == r.id


def _embeddings(c: openai.OpenAI) -> None:
    # the client asks for base64 (and decodes it) unless told otherwise
    got = c.embeddings.create(model="m", input=["the same text", "the same text", "other"])
    assert got.object == "list" and got.model == "m"
    vecs = [d.embedding for d in got.data]
    assert [d.index for d in got.data] == [0, 1, 2] and len(vecs[0]) == 256
    assert vecs[0] == vecs[1] and vecs[0] != vecs[2]
    assert math.isclose(sum(x * x for x in vecs[0]), 1.0, rel_tol=1e-5)
    floats = c.embeddings.create(model="m", input="the same text", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(vecs[0], abs=1e-6)
    assert got.usage.prompt_tokens == got.usage.total_tokens > 0
    with pytest.raises(openai.NotFoundError):
        c.embeddings.create(model="nope", input="x")


async def test_embeddings_with_both_clients(fleet: Fleet) -> None:
    sim = await start_sim(fleet, "sim0")
    await asyncio.to_thread(_embeddings, sync_client(sim))
    c = async_client(sim)
    small = await c.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]], dimensions=64)
    assert [len(d.embedding) for d in small.data] == [64, 64]
    assert small.usage.prompt_tokens == 5
    with pytest.raises(openai.BadRequestError):
        await c.embeddings.create(model="m", input="x", dimensions=10_000)
