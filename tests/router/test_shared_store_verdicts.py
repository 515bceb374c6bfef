"""The shared-store table's checks against the single-router reference (pure)."""

from bench.shared_store import verdicts


def row(workload: str, routers: int, store: str, hit: float, imbalance: float = 1.1) -> dict:
    return {"workload": workload, "router_replicas": routers, "store": store,
            "engine_hit_rate": hit, "imbalance": imbalance}


def test_each_run_is_judged_against_its_own_workloads_single_router() -> None:
    out = verdicts([
        row("a", 1, "local", 0.80), row("a", 3, "redis", 0.78), row("a", 3, "local", 0.60),
        row("b", 1, "local", 0.50), row("b", 3, "redis", 0.47),
    ])
    by = {(r["workload"], r["setup"]): r for r in out}
    assert by[("a", "1 x local")]["verdict"] == "reference"
    assert by[("a", "3 x redis")]["hit_ratio"] == 0.975
    assert by[("a", "3 x redis")]["verdict"] == "met"
    assert by[("a", "3 x local")]["verdict"] == "-"  # printed beside, not judged
    assert by[("b", "3 x redis")]["hit_ratio"] == 0.94
    assert by[("b", "3 x redis")]["verdict"] == "NOT met"


def test_imbalance_over_the_bound_fails_even_with_the_hit_rate() -> None:
    out = verdicts([row("a", 1, "local", 0.8), row("a", 3, "redis", 0.8, imbalance=1.31)])
    assert out[1]["verdict"] == "NOT met"
