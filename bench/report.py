"""Tables (markdown) and plots (PNG, matplotlib) of benchmark results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

COLUMNS = (
    ("router", "router"),
    ("engine_hit_rate", "engine hit rate"),
    ("oracle_hit_rate", "oracle"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "TTFT p90 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_ms", "e2e p50 ms"),
    ("throughput_rps", "req/s"),
    ("output_tokens_per_s", "out tok/s"),
    ("errors", "errors"),
    ("imbalance", "imbalance"),
)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def table(rows: Sequence[dict], columns: Sequence[tuple[str, str]] = COLUMNS) -> str:
    head = "| " + " | ".join(c[1] for c in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def print_table(rows: Sequence[dict], columns: Sequence[tuple[str, str]] = COLUMNS) -> None:
    widths = [max(len(c[1]), *(len(_fmt(r.get(c[0]))) for r in rows)) for c in columns]
    print("  ".join(c[1].ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(_fmt(r.get(c[0])).ljust(w) for c, w in zip(columns, widths, strict=True)))


def sweep_plot(rows: Sequence[dict], workload: str, out: Path) -> None:
    """TTFT p50/p99 and engine hit rate against request rate, one line per router."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    routers = sorted({r["router"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in routers:
        pts = sorted((r for r in rows if r["router"] == name), key=lambda r: r["rate"])
        rates = [r["rate"] for r in pts]
        axes[0].plot(rates, [r["ttft_p50_ms"] for r in pts], marker="o", label=name)
        axes[1].plot(rates, [r["ttft_p99_ms"] for r in pts], marker="o", label=name)
        axes[2].plot(rates, [r["engine_hit_rate"] for r in pts], marker="o", label=name)
    axes[0].set_title(f"{workload}: TTFT p50 (ms)")
    axes[1].set_title(f"{workload}: TTFT p99 (ms)")
    axes[2].set_title(f"{workload}: engine prefix-cache hit rate")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].set_ylim(0, 1)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
