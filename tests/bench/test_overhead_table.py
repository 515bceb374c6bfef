"""bench/overhead_table.py: the overhead README from per-router result dicts (pure), and the
pure helpers of bench/overhead.py's overhead-all (/proc status parsing, plan, command line)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.overhead import (
    ROUTERS,
    add_arguments,
    command_line,
    describe,
    parse_status,
    planned_seconds,
)
from bench.overhead_table import load, overhead_table, readme, write_readme

COMMON = {
    "rate": 500.0,
    "seconds": 20.0,
    "seed": 2,
    "clients": 64,
    "max_seconds": 10.0,
    "direct_max_rps": 5384.6,
    "command": ".venv/bin/python -m bench overhead-all",
    "machine": "Intel(R) Xeon(R) Processor, 2 cores, Python 3.11.7",
    "measured_at": "2026-12-03 14:00 UTC",
}


def _row(router: str, **figs: Any) -> dict[str, Any]:
    return {"router": router, **COMMON, **figs}


FIXTURE: list[dict[str, Any]] = [
    # in file order (sorted by name), not the table's
    _row(
        "vllm-cache_aware",
        kind="anchor",
        version="vllm-router 0.1.17",
        settings=["cache_aware", "--cache-threshold", "0.5"],
        settings_source="vllm-project/router docs/load_balancing/README.md (Cache Aware)",
        error="did not start: vllm-router exited with 1: bad | flag\nsecond line",
    ),
    _row(
        "prefix",
        kind="ours",
        version="this tree (d9bf6b8)",
        settings=["--policy", "prefix"],
        requests=10085,
        errors=0,
        direct_errors=0,
        max_errors=0,
        direct_p50_ms=0.86,
        direct_p99_ms=2.08,
        routed_p50_ms=2.18,
        routed_p99_ms=5.59,
        added_p50_ms=1.32,
        added_p99_ms=3.51,
        max_rps=1640.4,
        rss_mb=61.23,
        peak_rss_mb=70.0,
        processes=1,
    ),
    _row(
        "prefix-redis",
        kind="ours",
        version="this tree (d9bf6b8)",
        settings=["--policy", "prefix", "--store", "redis"],
        errors=2,
        direct_errors=0,
        max_errors=1,
        direct_p50_ms=0.9,
        direct_p99_ms=2.1,
        routed_p50_ms=2.04,
        routed_p99_ms=8.79,
        added_p50_ms=1.14,
        added_p99_ms=6.69,
        max_rps=1901.0,
        rss_mb=64.0,
        peak_rss_mb=66.5,
        processes=1,
        redis_rss_mb=9.5,
    ),
]


def _lines(table: str) -> list[str]:
    return table.splitlines()[2:]  # after the header and the rule


def test_table_has_one_row_per_router_in_the_given_order() -> None:
    rows = _lines(overhead_table(FIXTURE, ROUTERS))
    assert [r.split("|")[1].strip() for r in rows] == ["prefix", "prefix-redis", "vllm-cache_aware"]


def test_figures_are_formatted_per_column() -> None:
    cells = [c.strip() for c in _lines(overhead_table(FIXTURE, ROUTERS))[0].split("|")[1:-1]]
    assert cells == [
        "prefix",
        "this tree (d9bf6b8)",
        "1.32",
        "3.51",
        "0.86 / 2.08",
        "2.18 / 5.59",
        "1,640",
        "61.2",
        "70.0",
        "",
    ]


def test_an_unmeasured_router_gets_its_reason_not_numbers() -> None:
    row = _lines(overhead_table(FIXTURE, ROUTERS))[2]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[2:9] == ["-", "-", "- / -", "- / -", "-", "-", "-"]
    # on one line, and its pipe does not open another cell
    assert (
        cells[9] == "not measured: did not start: vllm-router exited with 1: bad / flag second line"
    )
    assert len(cells) == 10


def test_notes_say_failures_and_the_redis_server_memory() -> None:
    notes = _lines(overhead_table(FIXTURE, ROUTERS))[1].split("|")[-2]
    assert "2 open-loop + 1 closed-loop requests failed (0 direct)" in notes
    assert "redis-server 9.5 MB besides" in notes


def test_readme_states_settings_command_machine_and_versions() -> None:
    text = readme(FIXTURE, ROUTERS)
    assert "Open loop 500 req/s for 20 s (seed 2); closed loop 64 clients for 10 s." in text
    assert "- Command: `.venv/bin/python -m bench overhead-all`" in text
    assert "- Machine: Intel(R) Xeon(R) Processor, 2 cores, Python 3.11.7." in text
    assert "- Measured: 2026-12-03 14:00 UTC." in text
    assert "- The simulator alone, same closed loop: 5,385 req/s." in text
    assert "not comparable" not in text
    assert overhead_table(FIXTURE, ROUTERS) in text
    versions = text.split("## Versions and settings")[1]
    assert (
        "| vllm-cache_aware | anchor | vllm-router 0.1.17 | `cache_aware --cache-threshold 0.5` |"
        in versions
    )
    assert text.endswith("\n")


def test_readme_flags_rows_of_different_settings() -> None:
    rows = [*FIXTURE[:2], {**FIXTURE[2], "rate": 100.0, "seconds": 3.0}]
    text = readme(rows, ROUTERS)
    assert "**Rows measured with different settings (not comparable):**" in text
    assert "prefix-redis: rate 100.0, seconds 3.0" in text
    assert "Open loop 500 req/s" not in text


def test_readme_without_results() -> None:
    assert "No results yet." in readme([], ROUTERS)


def test_write_readme_reads_the_json_files_beside_it(tmp_path: Path) -> None:
    for row in FIXTURE:
        (tmp_path / f"{row['router']}.json").write_text(json.dumps(row))
    by_router = {r["router"]: r for r in load(tmp_path)}
    assert by_router == {r["router"]: r for r in FIXTURE}
    path = write_readme(tmp_path, ROUTERS)
    assert path == tmp_path / "README.md"
    assert path.read_text() == readme(load(tmp_path), ROUTERS)


# ---- pure helpers of overhead-all ------------------------------------------------------------


def test_parse_status_reads_the_vm_lines_in_kb() -> None:
    text = (
        "Name:\tpython\nVmPeak:\t  300000 kB\nVmHWM:\t   81234 kB\nVmRSS:\t   61000 kB\n"
        "Threads:\t3\n"
    )
    assert parse_status(text) == {"VmPeak": 300000, "VmHWM": 81234, "VmRSS": 61000}


def test_every_router_and_anchor_is_measured() -> None:
    assert ROUTERS == (
        "prefix",
        "prefix-redis",
        "sglang-cache_aware",
        "vllm-cache_aware",
        "vllm-consistent_hash",
    )
    assert describe("prefix-redis", "v")["settings"][:4] == [
        "--policy",
        "prefix",
        "--store",
        "redis",
    ]
    assert describe("sglang-cache_aware", "v")["version"] == "sglang-router 0.3.2"


def test_plan_of_the_default_run_is_about_five_minutes() -> None:
    s = planned_seconds(ROUTERS, 20.0, 10.0)
    assert 270 < s < 330


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_command_line_repeats_the_options_that_differ() -> None:
    assert command_line(_args()) == ".venv/bin/python -m bench overhead-all"
    assert (
        command_line(_args("--routers", "prefix", "--rate", "100", "--seconds", "3"))
        == ".venv/bin/python -m bench overhead-all --routers prefix --rate 100 --seconds 3"
    )
