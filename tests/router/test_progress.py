"""A hung engine, told from its progress counters (progress.py) and read from its /metrics
page (health.engine_figures)."""

from __future__ import annotations

from prefix_router.health import engine_figures
from prefix_router.progress import StallWatch

U = "http://e"


def test_standing_still_counts_only_while_requests_wait() -> None:
    w = StallWatch(stall_after_s=10.0)
    assert w.observe(U, 100.0, in_flight=0, now=0.0) == 0.0
    assert w.observe(U, 100.0, in_flight=0, now=50.0) == 0.0  # idle: nothing to make
    assert w.observe(U, 100.0, in_flight=2, now=55.0) == 5.0  # from the last idle scrape
    assert w.observe(U, 101.0, in_flight=2, now=60.0) == 0.0  # it moved
    assert w.observe(U, 101.0, in_flight=2, now=69.0) == 9.0
    assert w.observe(U, 101.0, in_flight=2, now=70.0) == 10.0  # hung: said once
    assert w.observe(U, 101.0, in_flight=2, now=71.0) == 1.0  # then a new window
    assert w.observe(U, None, in_flight=2, now=90.0) == 0.0  # no counters: no verdict
    assert w.observe(U, 5.0, in_flight=2, now=91.0) == 0.0
    w.keep(set())  # it left: its clock goes with it
    assert w.observe(U, 5.0, in_flight=2, now=95.0) == 0.0


def test_engine_figures_reads_the_queue_and_the_progress_counters() -> None:
    page = b"\n".join([
        b"# HELP vllm:num_requests_running Requests in the running batch",
        b'vllm:num_requests_running{model_name="m"} 2.0',
        b'vllm:num_requests_waiting{model_name="m"} 3.0',
        b'vllm:generation_tokens_total{model_name="m"} 40.0',
        b'vllm:prompt_tokens_total{model_name="m"} 100.0',
        b'vllm:iteration_tokens_total_count{model_name="m"} 7.0',
        b'vllm:iteration_tokens_total_sum{model_name="m"} 140.0',
        b'vllm:time_to_first_token_seconds_count{model_name="m"} 9.0',
    ])
    assert engine_figures(page) == ((2.0, 3.0), 147.0)
    assert engine_figures(b"llamacpp:n_decode_total 12\n") == (None, 12.0)
    assert engine_figures(b"something_else 1\n") == (None, None)
