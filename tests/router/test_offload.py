import json
import os
import threading

import pytest

from prefix_router.errors import RequestError
from prefix_router.offload import Offload
from prefix_router.parsing import parse_for_routing


async def test_large_work_runs_off_the_loop_and_small_work_inline() -> None:
    off = Offload(threshold=100, process_threshold=10_000)
    here = threading.get_ident()
    assert await off.run(10, threading.get_ident) == here
    assert await off.run(1000, threading.get_ident) != here
    # the largest, when it may, in a process of its own (no GIL shared with the loop)
    assert await off.run(20_000, threading.get_ident, apart=False) != here
    try:
        assert await off.run(20_000, os.getpid, apart=True) != os.getpid()
    finally:
        off.close()


async def test_a_body_parsed_in_the_worker_process_comes_back_slim_with_the_gateways_salt():
    off = Offload(threshold=100, process_threshold=1000)
    body = {"model": "m", "max_tokens": 4, "cache_salt": "theirs",
            "messages": [{"role": "user", "content": "x" * 5000}]}  # fmt: skip
    raw = json.dumps(body).encode()
    try:
        parsed, out = await off.run(len(raw), parse_for_routing, raw, "chat", "ours", True, True,
                                    apart=True)  # fmt: skip
        assert parsed.model == "m" and parsed.cache_salt == "ours"
        assert parsed.canonical.endswith(b"x" * 5000)
        assert "messages" not in parsed.body and parsed.body["max_tokens"] == 4
        assert json.loads(out)["cache_salt"] == "ours"  # the engine gets the gateway's salt
        assert json.loads(out)["messages"] == body["messages"]
        # a client's mistake found there is the same error here, every field kept
        bad = json.dumps({"model": "m", "messages": "x" * 5000}).encode()
        with pytest.raises(RequestError) as err:
            await off.run(len(bad), parse_for_routing, bad, "chat", None, True, True, apart=True)
        assert (err.value.status, err.value.param) == (400, "messages")
    finally:
        off.close()
