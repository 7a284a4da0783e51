"""Figures of ``rayledger bench group --plot FILE.png``: latency CDFs and throughput vs clients."""

from __future__ import annotations

import math
from pathlib import Path


def _cdf(ax, values: list[float], label: str) -> None:
    xs = sorted(values)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")


#: Mantissas of the latency axis's labelled ticks: 1, 2, 5, 10, 20, 50, 100 ... ms.
STEPS = (1, 2, 5)


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks 1-2-5 per decade from the last one at or below ``lo`` to the first one at or
    above ``hi`` (so even a narrow range gets a labelled tick at each end)."""
    lo, hi = max(lo, 1e-3), max(hi, lo, 1e-3)
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
    ticks = [m * 10.0**e for e in decades for m in STEPS]
    start = max(i for i, t in enumerate(ticks) if t <= lo * (1 + 1e-9))
    stop = min(i for i, t in enumerate(ticks) if t >= hi * (1 - 1e-9))
    if start == stop:  # all values on one tick: one more on each side
        start, stop = start - 1, stop + 1
    return [round(t, 6) for t in ticks[start : stop + 1]]


def _latency_axis(ax, values: list[float]) -> None:
    """Log scale with readable labels (1, 2, 5, 10, 20, 50, 100, 200, 500 ms ...), the
    minor ticks unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    positive = [v for v in values if v > 0]
    if not positive:
        return
    ticks = log_ticks(min(positive), max(positive))
    ax.set_xlim(ticks[0], ticks[-1])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_group(series: dict, path: str | Path, title: str = "rayledger bench group") -> Path:
    """Two panels: the append latency CDFs (ms, log scale) and entries/s against clients.

    ``series`` holds ``latency_ms`` (label -> list of ms) and ``throughput``
    (list of ``(clients, entries_per_s)``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    latencies = series.get("latency_ms", {})
    for label, values in latencies.items():
        _cdf(left, values, label)
    _latency_axis(left, [v for values in latencies.values() for v in values])
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
