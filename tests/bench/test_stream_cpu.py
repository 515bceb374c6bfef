"""`bench stream-cpu`'s pure parts: the per-token figure and the README it writes."""

from __future__ import annotations

from bench.stream_cpu import per_token_us, readme


def test_per_token_us() -> None:
    assert per_token_us(0.5, 32_000) == 15.6
    assert per_token_us(1.0, 0) == 0.0  # no tokens: no figure, not a division error


def test_readme_states_command_host_and_figures() -> None:
    text = readme({
        "command": "cmd --streams 16", "measured_at": "2026-12-05 19:30 UTC", "machine": "m",
        "streams": 16, "tokens_per_stream": 200, "rounds": 7, "tokens": 22400,
        "sim_us_per_token": 15.5, "client_us_per_token": 31.7,
    })
    assert "`cmd --streams 16`" in text and "2026-12-05 19:30 UTC on m" in text
    assert "| 16 x 200 | 7 | 22400 | 15.5 | 31.7 |" in text
