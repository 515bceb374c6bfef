"""`bench overhead`'s RSS figure: a real prefix-router process whose table real requests fill,
counted by the router's own /metrics (real simulator and router processes on 127.0.0.1)."""

from __future__ import annotations

from bench.fleet import Fleet
from bench.overhead import RSS_PROMPT_BLOCKS, rss_with_entries, start_zero_sim


async def test_requests_fill_the_router_table_and_its_memory_grows(fleet: Fleet):
    sim = await start_zero_sim(fleet)
    entries, rss, empty = await rss_with_entries(fleet, sim.url, 20_000)
    assert entries >= 20_000
    # the fill stops once the table holds the target: over it by at most one batch's
    # rounding (a prompt's blocks) and the block each answer's next-turn record adds
    assert entries < 20_000 * 1.02 + RSS_PROMPT_BLOCKS
    assert empty > 20  # a router process with its imports, not a bare interpreter
    assert rss > empty
