"""Figures of ``rayledger bench group --plot FILE.png``: latency CDFs and throughput vs clients."""

from __future__ import annotations

from pathlib import Path


def _cdf(ax, values: list[float], label: str) -> None:
    xs = sorted(values)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


def plot_group(series: dict, path: str | Path, title: str = "rayledger bench group") -> Path:
    """Two panels: the append latency CDFs (ms, log scale) and entries/s against clients.

    ``series`` holds ``latency_ms`` (label -> list of ms) and ``throughput``
    (list of ``(clients, entries_per_s)``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, values in series.get("latency_ms", {}).items():
        _cdf(left, values, label)
    left.set_xscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    left.xaxis.set_major_formatter(ScalarFormatter())  # 10, 100 rather than 10^1, 10^2
    left.xaxis.set_minor_formatter(NullFormatter())  # no crowded minor labels
    left.set_xlabel("append latency (ms, log scale)")
    left.set_ylabel("fraction of appends")
    left.set_title("latency CDF")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8, loc="upper left")

    points = sorted(series.get("throughput", []))
    if points:
        xs = [c for c, _ in points]
        right.plot(xs, [v for _, v in points], marker="o")
        right.set_xticks(xs)
    right.set_xlabel("clients (each appending batches)")
    right.set_ylabel("committed entries / s")
    right.set_title(f"throughput vs clients (batches of {series.get('batch', '?')})")
    right.set_ylim(bottom=0)
    right.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
