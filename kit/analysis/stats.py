"""Uncertainty for the numbers a report compares: percentile bootstrap over held-out items.

    bootstrap(values)                  (mean, low, high): 95% percentile interval of the mean over items
    paired_bootstrap(a, b)             (mean(a - b), low, high): the same items resampled for both methods
    seeds_items_bootstrap(table)       (mean, low, high) of a (seeds, items) table, seeds and items both resampled
    per_item(row, metric)              one value per item from an evaluation row's `per_item` lists (pass@k via
                                       the unbiased estimator of each item's c correct of n), or None
    method_line(num_items, ...)        the one line a report prints under a table
    headline(rows), window_for(n)      the metric a run is judged by; the window its final training reward averages

Why items and not samples: the n samples of one item are not independent draws from the population of problems
a researcher cares about; the held-out items are. Resampling items (with replacement, B times, the mean of each
resample) gives the spread a different draw of equally hard items would show. For two methods scored on the same
items, resampling the per-item differences keeps the pairing, so an item that is hard for both does not widen the
interval of the difference. Every resampling uses a fixed seed, so a report is reproducible to the digit.
Across seeds of training, seeds_items_bootstrap resamples the seeds too (bench/code_table.py's intervals).
Not covered: the noise of the n samples within an item (it is averaged inside each item's value).
"""

from __future__ import annotations

import numpy as np

NUM_RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0


def resample_means(values, indices: np.ndarray) -> np.ndarray:
    """The mean of each resample: `indices` (B, n) picks items of `values` (n,)."""
    return np.asarray(values, dtype=float)[indices].mean(axis=1)  # (B,)


def percentile_interval(stats, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central `confidence` share of the resampled statistics (linear interpolation between order stats)."""
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(np.asarray(stats, dtype=float), [tail, 1.0 - tail])
    return float(low), float(high)


def _indices(n: int, num_resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(num_resamples, n))  # (B, n)


def bootstrap(values, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
              seed: int = SEED) -> tuple[float, float, float]:
    """(mean, low, high) of per-item `values`; a single item gives a zero-width interval."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or not len(values):
        raise ValueError(f"bootstrap needs a non-empty list of per-item values; got shape {values.shape}")
    low, high = percentile_interval(resample_means(values, _indices(len(values), num_resamples, seed)), confidence)
    return float(values.mean()), low, high


def paired_bootstrap(a, b, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
                     seed: int = SEED) -> tuple[float, float, float]:
    """(mean(a - b), low, high) with one resample of item indices shared by both methods."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"a paired bootstrap needs the same items for both methods; got {len(a)} and {len(b)} "
                         "items (evaluate both with the same --items)")
    return bootstrap(a - b, num_resamples, confidence, seed)


def seeds_items_bootstrap(values, num_resamples: int = NUM_RESAMPLES, confidence: float = CONFIDENCE,
                          seed: int = SEED) -> tuple[float, float, float]:
    """(mean, low, high) of a (seeds, items) table: each resample draws seeds with replacement and, independently,
    items with replacement, and takes the mean of the chosen rows' chosen columns. So the interval holds both what
    another draw of problems and what another training seed would change (a two-way bootstrap); one seed gives the
    items-only interval, one item the seeds-only one. For a paired difference pass a - b, both (seeds, items) on
    the same items."""
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or not values.size:
        raise ValueError(f"seeds_items_bootstrap needs a non-empty (seeds, items) table; got shape {values.shape}")
    S, n = values.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, S, size=(num_resamples, S))  # (B, S)
    cols = rng.integers(0, n, size=(num_resamples, n))  # (B, n)
    # mean over the S x n grid of resample b: the mean over chosen seeds of each seed's mean over the chosen items
    picked = values[rows[:, :, None], cols[:, None, :]]  # (B, S, n)
    low, high = percentile_interval(picked.mean(axis=(1, 2)), confidence)
    return float(values.mean()), low, high


def per_item(row: dict, metric: str) -> list[float] | None:
    """Per-item values of `metric` ("pass@k", "reward/mean", "score/mean") from an evaluation row, or None when
    the row has no per-item data (written by an older kit) or cannot give this metric."""
    from kit.analysis.evaluate import pass_at_k

    items = row.get("per_item")
    if not items:
        return None
    if metric.startswith("pass@") and "correct" in items:
        k, n = int(metric[5:]), int(row["num_samples"])
        return [pass_at_k(n, c, k) for c in items["correct"]] if k <= n else None
    key = {"reward/mean": "reward", "score/mean": "score"}.get(metric)
    return list(items[key]) if key in items else None


def interval(row: dict, metric: str, **kw) -> tuple[float, float, float] | None:
    """`bootstrap` of a row's per-item values of `metric`; None without per-item data."""
    values = per_item(row, metric)
    return bootstrap(values, **kw) if values else None


def fmt(point: float, low: float | None = None, high: float | None = None, digits: int = 3) -> str:
    """'0.412 [0.310, 0.520]', or the point alone when there is no interval."""
    if point is None:
        return "n/a"
    if low is None:
        return f"{point:.{digits}f}"
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def method_line(num_items: int | None = None, paired: bool = False, unit: str = "held-out items") -> str:
    """The line under a table that says how its intervals were made."""
    what = f"the {num_items} {unit}" if num_items else unit
    line = (f"Intervals: {CONFIDENCE:.0%} percentile bootstrap of the mean over {what} ({NUM_RESAMPLES} resamples, "
            f"seed {SEED}).")
    if paired:
        line += " Δ: paired bootstrap of the per-item difference (the same resampled items for both methods)."
    return line


# --- which metric, over which window (the report, compare and the plots agree on both)
def headline(rows: list[dict], task: str | None = None) -> str:
    """The metric a run is judged by: the one its task names in the rows (kit.tasks.headline: a graded task such as
    writing is judged by its mean reward, its pass@k being a threshold on the grade); rows without it (an older
    kit): the headline of `task` (the run's config's task name, kit.tasks.headline_of), else pass@1 when the task
    has passes, the game score, else the mean reward."""
    named = {r["headline"] for r in rows if r.get("headline")}
    keys = {k for r in rows for k in r}
    if len(named) == 1 and named <= keys:
        return named.pop()
    if task:
        from kit.tasks import headline_of

        own = headline_of(task)
        if own in keys:
            return own
    return "pass@1" if "pass@1" in keys else "score/mean" if "score/mean" in keys else "reward/mean"


def window_for(num_points: int) -> int:
    """Steps a smoothed training curve averages: a tenth of them, 1 to 25 (final_train_reward's k)."""
    return max(1, min(25, num_points // 10))
