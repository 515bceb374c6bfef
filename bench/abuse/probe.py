"""`python -m bench.abuse.probe URL`: GET URL/healthz every 50 ms on one kept-alive
connection, printing `<monotonic start> <seconds> <ok>` a line. A process of its own, so the
attack's own CPU work (building bombs, multi-megabyte bodies) cannot delay a probe and be
counted against the router."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=5.0)


async def probe(url: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        while True:
            t0, ok = time.monotonic(), False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with s.get(url + "/healthz", timeout=TIMEOUT) as r:
                    await r.read()
                    ok = r.status == 200
            took = time.monotonic() - t0
            print(f"{t0:.6f} {took:.6f} {int(ok)}", flush=True)
            await asyncio.sleep(max(0.0, 0.05 - took))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(probe(sys.argv[1]))
