"""`bench overhead`'s RSS figure: a real prefix-router process whose table real requests fill,
counted by the router's own /metrics (real simulator and router processes on 127.0.0.1)."""

from __future__ import annotations

from bench.harness.fleet import Fleet, memory_of, parse_status
from bench.overhead import MODEL, RSS_CAPACITY_TOKENS, RSS_PROMPT_BLOCKS, fill_table


async def test_requests_fill_the_router_table_and_its_memory_grows(fleet: Fleet) -> None:
    sim = await fleet.start_sim("sim", model=MODEL, kv_capacity=1_000_000, profile="zero",
                                time_scale=1.0)
    router = await fleet.start_router("router", [sim.url], policy="prefix",
                                      kv_capacity=RSS_CAPACITY_TOKENS)
    empty = memory_of(router.process.pid)
    entries = await fill_table(router.url, router.metrics, 20_000)
    assert entries >= 20_000
    # the fill stops once the table holds the target: over it by at most one batch's
    # rounding (a prompt's blocks) and the block each answer's next-turn record adds
    assert entries < 20_000 * 1.02 + RSS_PROMPT_BLOCKS
    # a router, not a bare interpreter; its body-parsing worker processes are in its tree
    assert empty["rss_mb"] > 20 and empty["processes"] >= 1
    assert memory_of(router.process.pid)["rss_mb"] > empty["rss_mb"]


def test_status_lines_are_read_in_kb() -> None:
    text = "Name:\tpython\nVmPeak:\t  300 kB\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t4\n"
    assert parse_status(text) == {"VmPeak": 300, "VmHWM": 2048, "VmRSS": 1024}
