"""What the load generator logs besides its results: each request's answer (the oracle replays
them) and the turns it planned but never sent (a conversation stops at a failed turn)."""

from __future__ import annotations

import socket

from aiohttp.test_utils import TestServer

from bench.harness.loadgen import run_load
from bench.harness.oracle import oracle_hit_rate
from bench.harness.workloads import Workload, build
from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES
from engine_sim.server import build_app


async def test_answers_are_logged_and_the_oracle_replays_them_as_the_engine_cached_them() -> None:
    engine = Engine(PROFILES["zero"], 1_000_000)  # answers at once, so turns never overlap
    app = build_app(model="m", served=["m"], engine=engine, max_model_len=32_768,
                    replica_id="r0")
    session = build("multi-turn", 20).sessions[0]
    wl = Workload("multi-turn", [session], 0)
    async with TestServer(app) as server:
        url = str(server.make_url("")).rstrip("/")
        log = await run_load(wl, [url], "m", 1000.0, 1.0, progress=False)
    turns = len(session.turns)
    assert [r.ok for r in log.results] == [True] * turns
    assert len(log.sent) == len(log.answers) == log.planned == turns
    for i, answer in enumerate(log.answers[:-1]):  # each answer is in the next turn's history
        assert log.sent[i + 1][2 + 2 * i] == {"role": "assistant", "content": answer}
    c = engine.counters
    assert oracle_hit_rate(log.sent, 1_000_000, answers=log.answers) == (
        c.cached_tokens / c.prompt_tokens
    )
    # without the answers the oracle would miss the history's answers, as it used to
    assert oracle_hit_rate(log.sent, 1_000_000) < c.cached_tokens / c.prompt_tokens


async def test_turns_after_a_failed_turn_are_planned_but_never_sent() -> None:
    with socket.socket() as s:  # a port nothing listens on: every request fails at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wl = build("multi-turn", 30)
    log = await run_load(wl, [f"http://127.0.0.1:{port}"], "m", 60.0, 0.5, progress=False)
    started = len({r.session for r in log.results})
    assert started and len(log.sent) == started  # only each conversation's first turn
    assert all(not r.ok and r.turn == 0 for r in log.results)
    assert log.answers == [""] * started
    assert log.planned == sum(len(s.turns) for s in wl.sessions[:started]) > len(log.sent)


async def test_an_agent_turn_waits_for_its_tools_and_carries_them() -> None:
    """The agentic workload's turns: sent with the session's tools, each after its tools' time,
    and the oracle renders them with those tools, as the engine did."""
    from dataclasses import replace

    from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer
    from engine_sim.kvcache import TokenBlockHasher
    from engine_sim.sequences import TokenSequences

    tok = ChatTokenizer(TINY_TOKENIZER)
    engine = Engine(PROFILES["zero"], 1_000_000, 16,
                    sequences=TokenSequences(tok, TokenBlockHasher(16)), preemption="recompute")
    app = build_app(model="m", served=["m"], engine=engine, max_model_len=100_000,
                    replica_id="r0", tokenizer=tok, enable_prompt_tokens_details=True)
    session = build("agentic", 12).sessions[0]
    session.turns = [replace(t, think_s=0.3 * i) for i, t in enumerate(session.turns[:3])]
    async with TestServer(app) as server:
        url = str(server.make_url("")).rstrip("/")
        log = await run_load(Workload("agentic", [session], 0), [url], "m", 1000.0, 1.0,
                             progress=False)
    assert [r.ok for r in log.results] == [True] * 3 and log.tools == [session.tools] * 3
    for i in (1, 2):  # sent no sooner than its tools' time after the turn before ended
        before = log.results[i - 1]
        assert log.results[i].sent_at >= before.sent_at + before.e2e + 0.3 * i
    c = engine.counters
    assert oracle_hit_rate(log.sent, 1_000_000, answers=log.answers, tokenizer=tok,
                           tools=log.tools) == c.cached_tokens / c.prompt_tokens


async def test_targets_are_read_live_and_a_stop_ends_the_run() -> None:
    """bench lifecycle changes the routers under a running load (a Service's endpoints) and
    ends it when its last window is over: the next request goes to the targets as they are
    now, and a stop starts no new session."""
    import asyncio
    import time

    from waiting import scaled, until

    engines = [Engine(PROFILES["zero"], 1_000_000) for _ in range(2)]
    apps = [build_app(model="m", served=["m"], engine=e, max_model_len=32_768,
                      replica_id=f"r{k}") for k, e in enumerate(engines)]
    wl = build("system-prompts", 20_000)
    async with TestServer(apps[0]) as a, TestServer(apps[1]) as b:
        targets = [str(a.make_url("")).rstrip("/")]
        stop = asyncio.Event()
        run = asyncio.create_task(run_load(wl, targets, "m", 200.0, 100.0, progress=False,
                                           stop=stop))
        await until(lambda: engines[0].counters.requests, 30, "a request served by a")
        targets[:] = [str(b.make_url("")).rstrip("/")]
        switched = time.perf_counter()
        await until(lambda: engines[1].counters.requests, 30, "a request served by b")
        stop.set()
        log = await asyncio.wait_for(run, scaled(60))
    # a request's target is chosen as it is sent: none sent after the switch went to a
    assert engines[0].counters.requests == sum(r.sent_at < switched for r in log.results)
    assert log.planned == len(log.results) < len(wl.sessions)
    assert all(r.ok for r in log.results)
