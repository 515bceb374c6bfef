"""A large or compressed request body is parsed (and inflated) off the router's event loop:
while it is, the loop goes on answering `/healthz` (bench/results/abuse/FINDINGS.md, findings
2 and "large plain bodies"; router/prefix_router/offload.py).

Decided by the order of events, not by a time: a `prefix-router` process, a body sent whole,
then, once the router has read its last byte (the kernel's queues of that connection are
empty), a chain of `/healthz` probes on another connection, each sent when the one before was
answered. On the loop, the body's parse ends in its answer (a 400: far longer than the
engine's context) before the router reads the first probe; off it, the chain goes on while the
body is parsed, and at least two probes come back before the body's answer.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import aiohttp
from waiting import until

from bench.harness.fleet import Fleet, Proc

MODEL = "test-model"


def tcp_queues(local: int, remote: int) -> tuple[int, int] | None:
    """(send queue, receive queue) in bytes of the IPv4 socket from port `local` to port
    `remote` on this machine, read from /proc/net/tcp; None if there is none."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].rsplit(":", 1)[1], 16) == local and int(f[2].rsplit(":", 1)[1], 16) == remote:
            tx, rx = f[4].split(":")
            return int(tx, 16), int(rx, 16)
    return None


def big_chat(size: int) -> bytes:
    """A chat body of about `size` bytes, many short messages: costly to parse and to make
    canonical, as a long conversation is."""
    one = {"role": "user", "content": "a message of a long conversation, number 000000"}
    n = size // (len(json.dumps(one)) + 2)
    messages = [{**one, "content": one["content"][:-6] + f"{i:06d}"} for i in range(n)]
    return json.dumps({"model": MODEL, "max_tokens": 4, "messages": messages}).encode()


async def probes_before_the_answer(router: Proc, body: bytes, headers: dict[str, str],
                                   status: int) -> int:  # fmt: skip
    """How many `/healthz` probes, chained one after another from when the router has read
    the whole body, were answered before the body's answer, whose `status` says the router
    went through the whole of it: 400 a prompt longer than the engine takes (parsed whole),
    413 a body over the limit once inflated."""
    port = int(router.url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/healthz") as r:  # the probes' connection, opened
            assert r.status == 200
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        events: list[str] = []
        try:
            head = "".join(f"{k}: {v}\r\n" for k, v in {
                "Host": "router", "Content-Type": "application/json",
                "Content-Length": str(len(body)), **headers}.items())  # fmt: skip
            writer.write(f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + body)
            await writer.drain()
            local = writer.get_extra_info("sockname")[1]

            def all_read() -> bool:
                return (writer.transport.get_write_buffer_size() == 0
                        and tcp_queues(local, port) == (0, 0)
                        and tcp_queues(port, local) == (0, 0))  # fmt: skip

            await until(all_read, 30, "the router to read the whole body", interval=0.001)

            async def answer() -> bytes:
                status = await reader.readuntil(b"\r\n\r\n")
                events.append("answer")
                return status

            async def probes() -> None:
                while "answer" not in events:
                    async with s.get(router.url + "/healthz") as r:
                        assert r.status == 200
                        await r.read()
                    if "answer" not in events:
                        events.append("probe")

            answered = asyncio.create_task(answer())
            await asyncio.gather(answered, probes())
            head_bytes = answered.result()
            assert head_bytes.startswith(b"HTTP/1.1 %d" % status), head_bytes[:200]
            length = int(next(ln.split(b":")[1] for ln in head_bytes.split(b"\r\n")
                              if ln.lower().startswith(b"content-length:")))  # fmt: skip
            error = json.loads(await reader.readexactly(length))["error"]
            if status == 400:
                assert error["code"] == "context_length_exceeded", error
        finally:
            writer.close()
    return events.index("answer")


async def _router(fleet: Fleet, tmp_path: Path, **settings: object) -> Proc:
    sim = await fleet.start_sim("sim", model=MODEL, kv_capacity=100_000, profile="fast",
                                time_scale=1.0)  # fmt: skip
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps(settings))  # JSON is YAML
    return await fleet.start_router("router", [sim.url], policy="prefix", kv_capacity=100_000,
                                    extra=["--config", str(config)])  # fmt: skip


async def test_a_large_body_does_not_hold_the_event_loop(fleet: Fleet, tmp_path: Path) -> None:
    # parsed and made canonical in the router's worker process (no GIL shared with its loop)
    router = await _router(fleet, tmp_path)
    body = big_chat(8 * 2**20 - 4096)  # just under the default max_body_bytes (8 MiB)
    assert await probes_before_the_answer(router, body, {}, 400) >= 2


def deflated_zeros(size: int) -> bytes:
    z = zlib.compressobj(9)
    chunk = bytes(2**20)
    return b"".join(z.compress(chunk) for _ in range(size // len(chunk))) + z.flush()


async def test_a_compressed_body_does_not_hold_the_event_loop(
    fleet: Fleet, tmp_path: Path
) -> None:
    # aiohttp inflated it on the loop as it arrived; the router now inflates it itself, in a
    # worker thread (zlib lets go of the GIL), bounded by max_body_bytes: a 413 past it. The
    # limit is raised so that inflating takes long enough for the probes to be seen.
    limit = 64 * 2**20
    router = await _router(fleet, tmp_path, max_body_bytes=limit)
    bomb = deflated_zeros(limit + 2**20)
    assert len(bomb) < 2**17  # small on the wire
    assert await probes_before_the_answer(router, bomb, {"Content-Encoding": "deflate"},
                                          413) >= 2  # fmt: skip
