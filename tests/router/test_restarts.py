"""The restart detector (restarts.py): vitals read from engines' /metrics pages, and the three
signs that an engine behind the same address came back empty. Pure, clock injected."""

from __future__ import annotations

from prefix_router.restarts import RestartDetector, Vitals, read_vitals

VLLM_PAGE = b"""# HELP process_start_time_seconds Start time of the process since unix epoch.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76e+09
# HELP vllm:engine_sleep_state Engine sleep state
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 0.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.76e+09
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""

SIM_PAGE = b"""process_start_time_seconds 1.7e+09
engine_sim_prefix_cache_resets_total 2.0
engine_sim_prefix_cache_resets_created 1.7e+09
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_vitals_of_a_vllm_page() -> None:
    v = read_vitals(VLLM_PAGE)
    assert v == Vitals(started=1.76e9, awake=1.0, resets=None, served=1234.0)


def test_vitals_of_a_simulator_page() -> None:
    assert read_vitals(SIM_PAGE) == Vitals(started=1.7e9, resets=2.0)


def test_vitals_of_a_page_without_any() -> None:
    assert read_vitals(b"llamacpp:requests_processing 1\n") == Vitals()


def test_the_first_scrape_is_a_baseline() -> None:
    d = RestartDetector(Clock())
    assert d.scraped("a", Vitals(started=5.0, resets=3.0)) is None
    assert d.scraped("a", Vitals(started=5.0, resets=3.0)) is None
    assert d.detected("a") == 0


def test_a_new_start_time_is_a_restart() -> None:
    d = RestartDetector(Clock())
    d.scraped("a", Vitals(started=5.0))
    assert d.scraped("b", Vitals(started=9.0)) is None  # another engine's baseline
    assert d.scraped("a", Vitals(started=6.0)) == "restart"
    assert d.scraped("a", Vitals(started=6.0)) is None
    assert d.detected("a") == 1


def test_a_counter_going_back_is_a_restart() -> None:
    d = RestartDetector(Clock())
    d.scraped("a", Vitals(served=500.0))
    assert d.scraped("a", Vitals(served=700.0)) is None
    assert d.scraped("a", Vitals(served=10.0)) == "restart"


def test_a_reset_counter_growing_is_a_reset() -> None:
    d = RestartDetector(Clock())
    d.scraped("a", Vitals(resets=0.0))
    assert d.scraped("a", Vitals(resets=1.0)) == "reset"
    assert d.scraped("a", Vitals(resets=1.0)) is None


def test_sleep_and_wake_each_empty_the_cache_and_sleep_is_suspect() -> None:
    d = RestartDetector(Clock())
    d.scraped("a", Vitals(awake=1.0))
    assert d.scraped("a", Vitals(awake=0.0)) == "sleep"
    assert d.suspected("a")
    assert d.scraped("a", Vitals(awake=0.0)) is None
    assert d.scraped("a", Vitals(awake=1.0)) == "wake"
    assert not d.suspected("a")


def test_shortfalls_in_a_row_are_a_reset() -> None:
    clock = Clock()
    d = RestartDetector(clock, streak=3, suspect_after=2, shortfall=0.25, min_blocks=2)
    assert d.answered("a", 1, 8, 0) is None
    assert not d.suspected("a")
    assert d.answered("a", 2, 8, 2) is None  # 2 <= 8 x 0.25: short too
    assert d.suspected("a")
    assert d.answered("a", 3, 8, 1) == "shortfall"
    assert not d.suspected("a")  # dropped: the run starts over
    assert d.detected("a") == 1


def test_a_prefix_the_engine_kept_ends_the_run() -> None:
    d = RestartDetector(Clock(), streak=3, max_streak=3)  # a fixed run: the rule itself
    d.answered("a", 1, 8, 0)
    d.answered("a", 2, 8, 0)
    assert d.answered("a", 3, 8, 6) is None  # most of it held: eviction, not an empty engine
    assert d.answered("a", 4, 8, 0) is None
    assert d.answered("a", 5, 8, 0) is None
    assert d.answered("a", 6, 8, 0) == "shortfall"


def test_hits_on_prefixes_computed_again_since_do_not_end_the_run() -> None:
    """After a reset the hot prefix misses once, is computed again, and hits between the
    other prefixes' misses: those hits say nothing of what the engine kept."""
    d = RestartDetector(Clock(), streak=3)
    assert d.answered("a", 1, 8, 0) is None
    for _ in range(5):
        assert d.answered("a", 1, 8, 8) is None
    assert d.answered("a", 2, 8, 0) is None
    assert d.answered("a", 1, 8, 8) is None
    assert d.answered("a", 3, 8, 0) == "shortfall"


def test_a_hit_on_a_prefix_short_before_the_run_ends_it() -> None:
    """Evictions of a few hot prefixes are not a reset: prefix 1 fell short, was computed
    again and kept (the engine answered prefix 5 from cache in between), so its later hits
    say the engine is not empty, and the run of 2, 3, 4 never forms."""
    d = RestartDetector(Clock(), streak=3)
    assert d.answered("a", 1, 8, 0) is None
    assert d.answered("a", 5, 8, 8) is None  # kept: the run ends
    assert d.answered("a", 2, 8, 0) is None
    assert d.answered("a", 1, 8, 8) is None  # fell short before this run: kept since
    assert d.answered("a", 3, 8, 0) is None
    assert d.answered("a", 1, 8, 8) is None
    assert d.answered("a", 4, 8, 0) is None


def test_an_engine_that_often_falls_short_needs_a_longer_run() -> None:
    """An engine whose answers fall short half the time (a small cache, several routers'
    guesses) makes three shortfalls in a row by chance every few seconds: the run that drops
    it must be as unlikely at its own rate (0.5^10 < 1e-3: capped at max_streak, 8)."""
    d = RestartDetector(Clock(), streak=3, max_streak=8, chance=1e-3)
    for k in range(60):  # every other answer short, each on a new prefix
        assert d.answered("a", 100 + k, 8, 8 if k % 2 else 0) is None
    for k in range(7):
        assert d.answered("a", 200 + k, 8, 0) is None
    assert d.answered("a", 300, 8, 0) == "shortfall"


def test_one_prefix_short_again_and_again_is_not_a_reset() -> None:
    """Requests of one prefix sent together each compute it (neither finds the other's blocks
    yet): their shortfalls say nothing of the engine's other prefixes."""
    d = RestartDetector(Clock(), streak=3)
    for _ in range(5):
        assert d.answered("a", 1, 8, 0) is None
    assert d.answered("a", 2, 8, 0) is None
    assert d.answered("a", 3, 8, 0) == "shortfall"  # three prefixes, none kept


def test_small_predictions_neither_count_nor_break() -> None:
    d = RestartDetector(Clock(), streak=2, min_blocks=4)
    assert d.answered("a", 1, 8, 0) is None
    assert d.answered("a", 2, 3, 3) is None  # too small to say anything
    assert d.answered("a", 3, 8, 0) == "shortfall"


def test_shortfalls_far_apart_are_not_a_streak() -> None:
    clock = Clock()
    d = RestartDetector(clock, streak=2, suspect_after=1, window_s=30.0)
    d.answered("a", 1, 8, 0)
    assert d.suspected("a")
    clock.t += 31.0
    assert not d.suspected("a")
    assert d.answered("a", 2, 8, 0) is None  # the first one is too old to count
    clock.t += 31.0
    d.answered("a", 3, 8, 0)
    assert d.answered("a", 1, 8, 8) is None  # its shortfall is too old: a prefix kept
    assert d.answered("a", 4, 8, 0) is None


def test_engines_are_apart_and_forgotten() -> None:
    d = RestartDetector(Clock(), streak=2)
    d.answered("a", 1, 8, 0)
    assert d.answered("b", 2, 8, 0) is None
    d.scraped("a", Vitals(started=1.0))
    d.forget("a")
    assert d.scraped("a", Vitals(started=2.0)) is None  # a new baseline
    assert d.answered("a", 3, 8, 0) is None
