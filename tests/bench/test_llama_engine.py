"""The bench on llama-server engines, its pure parts: the servers' /metrics read as the
simulators' /stats, the prompt cache's size in whole prompts, the real-engine scenario's
declaration, and the trace's analysis of where requests went."""

from __future__ import annotations

from bench.harness import llama
from bench.harness.loadgen import RunLog
from bench.harness.workloads import build
from bench.runner import engine_stats, model_of, plan
from bench.scenarios import LLAMA_KV_TOKENS, LLAMA_SERVERS, SCENARIOS, setup

METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1374
llamacpp:prompt_tokens_cached_total 1358
llamacpp:prompt_seconds_total 0.123581
llamacpp:tokens_predicted_total 64
llamacpp:n_decode_total 64
llamacpp:prompt_tokens_seconds 11118.2
llamacpp:requests_processing 1
llamacpp:requests_deferred 2
"""


def test_a_servers_metrics_read_as_the_simulators_stats() -> None:
    s = llama.stats_of(METRICS)
    # prompt tokens served are the computed ones and the cached ones, as a simulator counts
    assert s["prompt_tokens"] == 1374 + 1358 and s["cached_tokens"] == 1358
    assert (s["generation_tokens"], s["running"], s["waiting"]) == (64, 1, 2)
    assert llama.stats_of("")["prompt_tokens"] == 0


def test_step_figures_count_each_servers_share_in_prompt_tokens() -> None:
    def snap(t: float, *servers: tuple[int, int]) -> dict:
        return {"t": t, "stats": [llama.stats_of(
            f"llamacpp:prompt_tokens_total {c}\nllamacpp:prompt_tokens_cached_total {h}\n"
            f"llamacpp:tokens_predicted_total {10 * (c + h)}") for c, h in servers]}

    before = snap(0.0, (0, 0), (0, 0), (0, 0))
    after = snap(10.0, (100, 300), (400, 0), (0, 0))
    f = llama.step_figures(RunLog(), before, after)
    assert f["engine_hit_rate"] == 0.375  # 300 cached of 800
    assert f["per_replica_prompt_tokens"] == [400, 400, 0]
    assert "per_replica_requests" not in f  # llama-server counts no requests
    assert f["imbalance"] == 1.5 and f["computed_prompt_tokens"] == 500
    assert f["output_tokens_per_s"] == 800.0


def test_a_server_holds_its_slots_and_its_host_cache_less_one_whole_prompts() -> None:
    # docs/real-engine.md: 2 slots, 16 MiB, ~2,000-token prompts -> K = 3, C = 4
    assert llama.prompts_held(2, 16, 2000, 2048) == (4, 5)  # 4 x 3.9 MiB fit in 16
    assert llama.prompts_held(2, 16, 2200, 2048) == (3, 4)
    assert llama.prompts_held(1, 8, 2900, 2048) == (1, 1)
    assert llama.prompts_held(1, 1, 2900, 2048) == (0, 1)  # an entry over the limit: not kept


def test_the_real_engine_scenario_sits_between_one_server_and_the_fleet() -> None:
    sc = SCENARIOS["real-engine"]
    assert sc.engine == "llama" and sc.replicas == 3 and sc.fresh_fleet
    wl = build(sc.workloads[0], 400)
    prefixes = {s.group for s in wl.sessions}
    # ~2,190 tokens a request with its answer (bytes / 3 of the tiny tokenizer, checked in
    # the README against the engines' own counts)
    entry = 2200
    _, per_server = llama.prompts_held(LLAMA_SERVERS["slots"], LLAMA_SERVERS["cache_ram_mib"],
                                       entry, llama.kv_bytes_per_token())
    assert per_server < len(prefixes) < sc.replicas * per_server
    assert LLAMA_KV_TOKENS == per_server * entry  # what our router is told
    # every setup once a round, the same requests each
    runs = plan(sc)
    assert len(runs) == sc.repeats * len(sc.rates or ()) * len(sc.setups)
    assert engine_stats(sc) is llama.fetch_stats and model_of(sc) == llama.MODEL


def test_a_setup_can_run_its_routers_with_their_own_environment() -> None:
    # an A/B of a patched router copy: its path first on PYTHONPATH, settings as usual
    s = setup("prefix,env.PYTHONPATH=/tmp/patched,tokenizer=sim/engine_sim/data/tiny-tokenizer")
    assert s.env == {"PYTHONPATH": "/tmp/patched"}
    assert s.settings == {"tokenizer": "sim/engine_sim/data/tiny-tokenizer"}
    assert setup("prefix").env == {}
