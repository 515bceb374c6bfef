"""The runner end to end on real processes (simulators and our router on 127.0.0.1), with a
scenario a few seconds long: the points it writes, their rounds, a staircase's steps, a
timeline's join, and the report read back from them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from bench import report, runner
from bench.scenarios import SCENARIOS, Scenario

TINY = Scenario("tiny", "", "Tiny", "", "tiny", setups=("prefix", "round-robin"), rates=(16.0,),
                seconds=3.0, replicas=2, kv_capacity=24_000, drain_s=60.0, profile="fast",
                columns=("router", "engine_hit_rate", "ttft_p50_ms"))


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(runner, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(runner, "LOGS", tmp_path / "logs")
    monkeypatch.setitem(report.SCENARIOS, "tiny", TINY)
    return tmp_path


async def test_every_setup_every_round_one_point_each(results: Path) -> None:
    sc = dataclasses.replace(TINY, repeats=2, rules=SCENARIOS["suite"].rules[:1])
    points = await runner.run_scenario(sc, "cmd")
    by = {p["router"]: p for p in points}
    assert set(by) == {"prefix", "round-robin"}
    for p in points:
        assert p["repeats"] == 2 and len(p["runs"]) == 2
        assert p["requests_ok"] > 10 and p["errors"] == 0
        assert p["caches_emptied_before"] is True  # each round from empty caches
        assert 0 < p["oracle_hit_rate"] <= 1 and p["command"] == "cmd"
    # the same requests for both setups, round after round
    assert [r["requests_sent"] for r in by["prefix"]["runs"]] == \
        [r["requests_sent"] for r in by["round-robin"]["runs"]]
    assert by["prefix"]["decisions"] and "decisions" in by["round-robin"]
    on_disk = json.loads((results / "tiny" / "system-prompts-prefix.json").read_text())
    assert on_disk["engine_hit_rate"] == by["prefix"]["engine_hit_rate"]
    text = report.render(sc)
    assert "| prefix |" in text and "| round-robin |" in text


async def test_a_staircase_gives_one_point_per_step(results: Path) -> None:
    sc = dataclasses.replace(TINY, setups=("prefix",), rates=(8.0, 16.0), staircase=True,
                             drain_s=5.0, session_header=True)
    points = await runner.run_scenario(sc, "cmd")
    assert sorted(p["rate"] for p in points) == [8.0, 16.0]
    low, high = sorted(points, key=lambda p: p["rate"])
    assert high["requests_sent"] > low["requests_sent"] > 0
    assert "oracle_hit_rate" not in high  # warm caches from the step before: not comparable
    assert (results / "tiny" / "system-prompts-prefix-8.json").exists()


async def test_a_timeline_sees_the_replicas_that_join(results: Path) -> None:
    sc = dataclasses.replace(TINY, setups=("prefix",), seconds=6.0, sample_s=1.0,
                             first_replicas=1, join_at=0.4)
    [p] = await runner.run_scenario(sc, "cmd")
    before = [w for w in p["series"] if w["t"] < 2.0]
    after = [w for w in p["series"] if w["t"] > 4.0]
    assert before and all(w["new_share"] == 0 for w in before)
    assert any(w["new_share"] > 0 for w in after)
    assert p["seconds_to_40pct"] is None or p["seconds_to_40pct"] > 0


async def test_index_modes_on_one_token_mode_fleet_with_a_restart(results: Path) -> None:
    sc = dataclasses.replace(TINY, setups=("prefix-approx", "prefix-events"), seconds=6.0,
                             restart=(0, 0.5))
    points = await runner.run_scenario(sc, "cmd")  # kv_events: the setups speak tokens
    by = {p["router"]: p for p in points}
    assert set(by) == {"prefix-approx", "prefix-events"}
    for p in by.values():
        assert p["kv_events"] and p["sim_args"][:2] == ["--tokenizer", "tiny"]
        assert p["restart_down_s"] > 0 and p["requests_ok"] > 20
        # the killed process's requests are counted with the new one's
        assert sum(p["per_replica_requests"]) >= p["requests_ok"]
        assert 0 < p["oracle_hit_rate"] <= 1 and p["hit_over_oracle"] > 0
    # the events router was told where each simulator publishes (its own two ports)
    configs = [yaml.safe_load(f.read_text()) for f in (results / "logs").glob("tiny-*/*/*.yaml")]
    [events] = [c["events"]["endpoints"] for c in configs if c["index"] == "events"]
    assert len(events) == 2 and len({p for v in events.values() for p in v.split(",")}) == 4
    assert all(c["tokenizer"] and c["cached_tokens_reported"] for c in configs)
    assert by["prefix-events"]["engine_hit_rate"] > 0.3
    # its index (the engines' events, its own entries until confirmed) predicted hits
    assert by["prefix-events"]["router_predicted_hit_rate"] > 0.3
