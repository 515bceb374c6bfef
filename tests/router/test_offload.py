import threading

from prefix_router.offload import Offload


async def test_large_work_runs_off_the_loop_and_small_work_inline() -> None:
    off = Offload(threshold=100)
    here = threading.get_ident()
    assert await off.run(10, threading.get_ident) == here
    assert await off.run(1000, threading.get_ident) != here
