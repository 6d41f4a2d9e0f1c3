"""What a run directory says about its run, read tolerantly: shared by the report (kit/analysis/report.py) and the
comparison (kit/analysis/compare.py), plus the environment record the trainer writes for them.

    read_run(run_dir)            config, metrics (training rows), eval/ rows, baselines, judge budget, environment;
                                 a missing file is an empty value, never an error (older runs still read)
    record_environment(run_dir)  environment.json: kit version and commit, packages, Python, GPU, peak GPU and
                                 resident memory
    nearest_preset(config)       the preset a run differs least from, and the training fields that differ
    final_train_reward(train)    where the training reward ended: the one definition the report and compare say
    figure(), raw_and_smoothed() the figures' shared look: a bare matplotlib Figure, raw points faint under a
                                 trailing mean
Nothing here runs a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kit.analysis.stats import headline, window_for  # noqa: F401  (runinfo's readers use them from here)
from kit.run.rundir import ENVIRONMENT


# --- what a run ran on (written by the trainer, read by the report)

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "numpy")


def record_environment(run_dir: str | Path, precision: list | None = None) -> dict:
    """Write <run_dir>/environment.json: kit version and commit, package versions, Python, GPU, the peak GPU
    memory and the process's peak resident memory (each the largest over every train() call of the run, so a
    resume keeps the highest), and `precision`: each base's dtype and why it was chosen (kit.engine.models
    choose_dtype; a resume on another CPU records where it ran last). Never raises: a missing package or git is
    recorded as absent."""
    import platform
    import subprocess
    import sys
    from importlib import metadata

    import kit

    path = Path(run_dir) / ENVIRONMENT
    old = json_or_none(path) or {}
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "-C", str(Path(kit.__file__).parent), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    gpu, peak = None, None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
        peak = max(torch.cuda.max_memory_allocated(d) for d in range(torch.cuda.device_count())) / 2**30
    env = {"kit_version": kit.__version__, "kit_commit": commit, "python": platform.python_version(),
           "packages": packages, "gpu": gpu,
           "peak_memory_gib": _highest(peak, old.get("peak_memory_gib")),
           "peak_host_memory_gib": _highest(_peak_rss_gib(), old.get("peak_host_memory_gib")),
           "precision": precision if precision is not None else old.get("precision")}
    path.write_text(json.dumps(env, indent=1))
    return env


def _highest(*values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _peak_rss_gib() -> float | None:
    """This process's peak resident memory since it started (what an out-of-memory kill on a CPU machine is about:
    in a notebook, also what ran before the training in the same kernel); None where the platform has no
    `resource` module (Windows). Recorded when train() returns: a process killed mid-run records nothing."""
    import sys

    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


# --- reading a run

def read_run(run_dir: str | Path) -> dict:
    """Everything a report or comparison reads from a run directory, tolerant of missing files."""
    from kit.analysis.evaluate import load_eval_rows
    from kit.run.rundir import BUDGET, CONFIG, METRICS, read_jsonl

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).exists():
        raise FileNotFoundError(f"{run_dir} has no {CONFIG}: is it a run directory made by `python -m kit train` "
                                "or 01_train?")
    metrics = read_jsonl(run_dir / METRICS) if (run_dir / METRICS).exists() else []
    baselines = run_dir / "eval" / "baselines.json"
    return {"path": run_dir, "config": json.loads((run_dir / CONFIG).read_text()), "metrics": metrics,
            "train": [r for r in metrics if "reward/mean" in r],
            "evals": load_eval_rows(run_dir) if (run_dir / "eval").is_dir() else [],
            "baselines": json.loads(baselines.read_text()) if baselines.exists() else [],
            "budget": json_or_none(run_dir / BUDGET),
            "environment": json_or_none(run_dir / ENVIRONMENT)}


def json_or_none(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def is_game_config(config: dict) -> bool:
    return config.get("task") == "game"


def smooth(values, window: int) -> np.ndarray:
    """Trailing moving mean over `window` points (fewer at the start), NaNs ignored (kit.analysis.plots.smooth's mean)."""
    from kit.analysis.plots import smooth as mean_and_std

    return mean_and_std(np.asarray(values, dtype=float), window)[0]


def final_train_reward(train: list[dict]) -> tuple[float, int] | None:
    """(the final training reward, k): the mean of `reward/mean` over the run's last k logged steps, k =
    window_for(steps) (a tenth of them, 1 to 25), i.e. the last point of the smoothed curve the report and compare
    draw. Both say this number, so it has one definition, here. None before the first step."""
    rewards = [r["reward/mean"] for r in train]
    if not rewards:
        return None
    k = window_for(len(rewards))
    return float(np.mean(rewards[-k:])), k


def figure(ncols: int = 1, width: float = 6.0, height: float = 3.4):
    from kit.analysis.plots import _figure

    return _figure(ncols, width, height)


def step_axes(*axes, right: float = 1.02) -> None:
    """Each axis over training steps as kit.analysis.plots draws them: whole-number ticks, a grid, the legend beside it
    (`right` further out past a twin axis's labels)."""
    from kit.analysis.plots import _legend, _steps_axis

    for ax in axes:
        _steps_axis(ax)
        if ax.get_legend_handles_labels()[0]:
            _legend(ax, right=right)


def raw_and_smoothed(ax, steps, values, label: str, window: int, color=None):
    """The raw points faint, the trailing mean on top in the same colour."""
    values = np.asarray(values, dtype=float)
    line, = ax.plot(steps, smooth(values, window), label=label, color=color)
    ax.plot(steps, values, ".", color=line.get_color(), alpha=0.25, markersize=3)
    return line


def normalized(config: dict) -> dict:
    """A saved config read through kit.run.config, so an older kit's spelling of a value compares equal; as saved when
    it names a field this kit no longer knows."""
    from kit.run.config import from_dict, to_dict

    try:
        return to_dict(from_dict(config))
    except ValueError:
        return config


def nearest_preset(config: dict) -> tuple[str, list[str]]:
    """The preset the run's config differs least from, and the training fields that differ (`name=value`)."""
    from kit.run.config import NON_TRAINING, preset, to_dict
    from kit.run.presets import PRESETS

    config, best = normalized(config), None
    recorded = {"model_sources"}  # where the weights came from, resolved by the run: a record, not a setting
    for name in PRESETS:
        base = to_dict(preset(name))
        diff = [f"{k}={config[k]!r}" for k in config
                if k in base and k not in NON_TRAINING and k not in recorded and config[k] != base[k]]
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    return best
