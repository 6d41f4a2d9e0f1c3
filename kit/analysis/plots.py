"""Figures from a run directory's files (matplotlib). Each returns a Figure; `path=` also saves a PNG.

    learning_curves(run_dir)            reward total and per part over steps, smoothed, with a +-1 std band
                                        (a game run: score sampled and greedy, illegal-move rate, episode length)
    eval_curves(rows)                   pass@k and mean reward over checkpoints (kit.analysis.evaluate rows)
    baseline_bars(rows)                 pass@k by method (kit.analysis.baselines rows; games: score, illegal rate, length)
    scheme_area(shares)                 scheme shares over training, stacked (kit.analysis.schemes.scheme_shares)
    LiveCurve(every=5)                  trainer.train(on_step=LiveCurve()) redraws the reward curve in a notebook
Everything is rebuilt from files, so the figures work after a Colab reconnect and on a finished run. Step axes
have whole-number ticks; legends sit beside their axes, never over the data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _figure(ncols: int = 1, width: float = 6.0, height: float = 3.6):
    from matplotlib.figure import Figure

    # a bare Figure, not pyplot: no global state, no backend to pick; notebooks display it when returned
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def _steps_axis(ax) -> None:
    """An x axis of training steps: whole-number ticks only (a 2-step run gets 1 and 2, not 1.25, 1.5 ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _legend(ax, handles=None, labels=None, right: float = 1.02):
    """The axes' legend beside it, outside the data area (constrained layout makes room for it). `right` moves it
    further out past a twin axis's labels."""
    args = () if handles is None else (handles, labels)
    return ax.legend(*args, loc="upper left", bbox_to_anchor=(right, 1.0), borderaxespad=0.0, fontsize="small")


def _save(fig, path):
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def read_metrics(run_dir: str | Path) -> list[dict]:
    from kit.run.rundir import METRICS, read_jsonl

    return read_jsonl(Path(run_dir) / METRICS)


def smooth(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing moving mean and std over `window` points (fewer at the start), ignoring NaNs."""
    mean, std = np.empty(len(values)), np.empty(len(values))
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        chunk = chunk[~np.isnan(chunk)]
        mean[i] = chunk.mean() if len(chunk) else np.nan
        std[i] = chunk.std() if len(chunk) else np.nan
    return mean, std


def _band(ax, steps, values, window: int, label: str):
    """A smoothed line with a +-1 std band."""
    mean, std = smooth(np.asarray(values, dtype=float), window)
    line, = ax.plot(steps, mean, label=label)
    ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def learning_curves(run_dir: str | Path, parts: list[str] | None = None, window: int | None = None, path=None):
    """Left: total training reward (and the greedy eval reward when logged). Right: each reward part.
    A game run (kit/tasks/games.py): `game_curves` instead. `window` (default: a tenth of the steps, 1 to 25, as
    kit.analysis.runinfo.final_train_reward): the curve ends at the final training reward the summary and the
    report say."""
    from kit.analysis.stats import window_for

    rows = [r for r in read_metrics(run_dir) if "reward/mean" in r]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no training steps yet")
    if any("score/mean" in r for r in rows):
        return game_curves(run_dir, window or 10, path)
    window = window or window_for(len(rows))
    steps = np.array([r["step"] for r in rows])
    skip = {"reward/mean", "reward/std"}
    parts = parts or sorted({k for r in rows for k in r if k.startswith("reward/") and k not in skip
                             and not k.startswith("reward/turn_")})
    fig, (ax_total, ax_parts) = _figure(2)
    for ax, keys in ((ax_total, ["reward/mean"]), (ax_parts, parts)):
        for key in keys:
            _band(ax, steps, [r.get(key, np.nan) for r in rows], window, key.removeprefix("reward/"))
        _steps_axis(ax)
    evals = [r for r in read_metrics(run_dir) if "eval/reward_mean" in r]
    if evals:
        ax_total.plot([r["step"] for r in evals], [r["eval/reward_mean"] for r in evals], "o--", label="eval (greedy)")
    ax_total.set_ylabel("reward")
    shown = min(window, len(rows))
    ax_total.set_title(f"reward (mean over the last {shown} steps, band: +-1 std)" if shown > 1 else
                       "reward (each step)")
    ax_parts.set_ylabel("reward part (mean per joint action)")
    ax_parts.set_title("reward parts")
    _legend(ax_total)
    if parts:
        _legend(ax_parts)
    return _save(fig, path)


def game_curves(run_dir: str | Path, window: int = 10, path=None):
    """A game run over training: the score (sampled episodes, smoothed with a +-1 std band; greedy held-out
    episodes as points, when logged), the illegal-move rate and the episode length (decisions per episode)."""
    metrics = read_metrics(run_dir)
    rows = [r for r in metrics if "score/mean" in r]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no game training steps yet")
    steps = np.array([r["step"] for r in rows])
    fig, (ax_score, ax_illegal, ax_length) = _figure(3, width=4.6)
    panels = ((ax_score, "score/mean", "eval/score_mean", "game score", "score"),
              (ax_illegal, "illegal/rate", "eval/illegal_rate", "illegal moves / decisions", "illegal-move rate"),
              (ax_length, "episode/length", None, "decisions per episode", "episode length"))
    for ax, key, greedy, ylabel, title in panels:
        _band(ax, steps, [r.get(key, np.nan) for r in rows], window, "sampled (training)")
        evals = [r for r in metrics if greedy and greedy in r]
        if evals:
            ax.plot([r["step"] for r in evals], [r[greedy] for r in evals], "o--", label="greedy (held-out)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} (mean over the last {min(window, len(rows))} steps)", fontsize="medium")
        _steps_axis(ax)
    ax_illegal.set_ylim(-0.02, 1.02)
    _legend(ax_score)
    return _save(fig, path)


def eval_curves(rows: list[dict], path=None):
    """pass@k and the mean reward of held-out evaluations over checkpoints (a game run: `game_eval_curves`)."""
    if not rows:
        raise ValueError("no evaluation rows: run kit.analysis.evaluate.evaluate_run first")
    rows = sorted(rows, key=lambda r: r["step"])
    if any("score/mean" in r for r in rows):  # a game run (kit/tasks/games.py): scores, not pass@k
        return game_eval_curves(rows, path)
    steps = [r["step"] for r in rows]
    fig, (ax_pass, ax_reward) = _figure(2)
    for key in sorted({k for r in rows for k in r if k.startswith("pass@")}, key=lambda k: int(k[5:])):
        ax_pass.plot(steps, [r.get(key, np.nan) for r in rows], "o-", label=key)
    ax_reward.plot(steps, [r["reward/mean"] for r in rows], "o-", color="black", label="mean reward")
    twin = None
    if any("cooperation_rate" in r for r in rows):
        twin = ax_reward.twinx()
        twin.plot(steps, [r.get("cooperation_rate", np.nan) for r in rows], "s--", color="tab:green",
                  label="cooperation rate")
        twin.set_ylim(0, 1)
        twin.set_ylabel("cooperation rate")
    ax_pass.set_ylim(0, 1)
    ax_pass.set_ylabel("pass@k")
    ax_pass.set_title("held-out pass@k by checkpoint (step 0: base)")
    ax_reward.set_ylabel("mean reward")
    ax_reward.set_title("held-out reward")
    for ax in (ax_pass, ax_reward):
        _steps_axis(ax)
    _legend(ax_pass)
    handles, labels = ax_reward.get_legend_handles_labels()
    if twin is not None:  # one legend for both axes: the twin's line would otherwise be unnamed
        more = twin.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    _legend(ax_reward, handles, labels, right=1.02 if twin is None else 1.18)  # past the twin's ticks and label
    return _save(fig, path)


def game_eval_curves(rows: list[dict], path=None):
    """A game run's held-out evaluations over checkpoints (kit.tasks.games.evaluate_team rows): score and illegal-move
    rate, sampled and greedy, and the episode length."""
    steps = [r["step"] for r in rows]
    fig, (ax_score, ax_illegal, ax_length) = _figure(3, width=4.6)
    panels = ((ax_score, {"score/mean": "sampled", "greedy/score_mean": "greedy"}, "game score", "score"),
              (ax_illegal, {"illegal/rate": "sampled", "greedy/illegal_rate": "greedy"}, "illegal moves / decisions",
               "illegal-move rate"),
              (ax_length, {"episode/length": "sampled"}, "decisions per episode", "episode length"))
    for ax, keys, ylabel, title in panels:
        for key, label in keys.items():
            ax.plot(steps, [r.get(key, np.nan) for r in rows], "o-", label=label)
        ax.set_ylabel(ylabel)
        ax.set_title(f"held-out {title} (step 0: base)", fontsize="medium")
        _steps_axis(ax)
    ax_illegal.set_ylim(-0.02, 1.02)
    _legend(ax_score)
    return _save(fig, path)


def baseline_bars(rows: list[dict], path=None):
    """Grouped bars: pass@k of every method on the same items; a graded task (its rows' headline is the mean
    reward, kit.tasks.headline): the mean reward; a game: `game_bars`."""
    from kit.analysis.stats import headline

    if not rows:
        raise ValueError("no baseline rows: run kit.analysis.baselines.compare first")
    if any("score/mean" in r for r in rows):
        return game_bars(rows, path)
    graded = headline(rows) == "reward/mean"
    ks = [] if graded else sorted({k for r in rows for k in r if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    metric_keys = ks or (["score/mean"] if any("score/mean" in r for r in rows) else ["reward/mean"])
    fig, (ax,) = _figure(1, width=max(6.0, 1.2 * len(rows) * max(1, len(metric_keys)) / 2))
    x = np.arange(len(rows))
    width = 0.8 / len(metric_keys)
    for i, key in enumerate(metric_keys):
        values = [r.get(key, 0.0) for r in rows]
        bars = ax.bar(x + (i - (len(metric_keys) - 1) / 2) * width, values, width, label=key)
        ax.bar_label(bars, fmt="%.2f", fontsize="x-small")
    ax.set_xticks(x, [r.get("method", str(i)) for i, r in enumerate(rows)])
    ax.set_ylabel("pass@k" if ks else {"score/mean": "game score"}.get(metric_keys[0], "mean reward"))
    if ks:  # a probability: never below 0 (all-zero bars would centre the axis on 0), room for the labels
        ax.set_ylim(0, 1.1)
    ax.set_title("baselines vs the MAGRPO team (same items, sampling, scoring)")
    _legend(ax)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _bars(ax, rows: list[dict], keys: dict[str, str], fmt: str = "%.2f") -> None:
    """Grouped bars of `keys` (key: label) by method; a method without a key (random and rule players have no
    greedy play) gets no bar rather than a false 0."""
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys.items()):
        at = [(x, r[key]) for x, r in enumerate(rows) if r.get(key) is not None]
        if at:
            x, values = zip(*at)
            bars = ax.bar(np.array(x) + (i - (len(keys) - 1) / 2) * width, values, width, label=label)
            ax.bar_label(bars, fmt=fmt, fontsize="x-small")
    ax.set_xticks(np.arange(len(rows)), [r.get("method", str(i)) for i, r in enumerate(rows)])
    ax.grid(axis="y", alpha=0.3)


def game_bars(rows: list[dict], path=None):
    """The game baselines (kit.tasks.games.compare rows) side by side: score sampled and greedy, illegal-move rate
    (sampled and greedy) and episode length, each method on the same held-out deals."""
    fig, (ax_score, ax_illegal, ax_length) = _figure(3, width=max(4.2, 0.9 * len(rows)))
    _bars(ax_score, rows, {"score/mean": "sampled", "greedy/score_mean": "greedy"})
    _bars(ax_illegal, rows, {"illegal/rate": "sampled", "greedy/illegal_rate": "greedy"})
    _bars(ax_length, rows, {"episode/length": "sampled"}, fmt="%.1f")
    for ax, ylabel, title in ((ax_score, "game score", "score"),
                              (ax_illegal, "illegal moves / decisions", "illegal-move rate"),
                              (ax_length, "decisions per episode", "episode length")):
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize="medium")
        ax.set_ylim(bottom=0)
    ax_illegal.set_ylim(0, 1.1)
    _legend(ax_score)
    fig.suptitle("game baselines vs the MAGRPO team (same held-out deals)")
    return _save(fig, path)


def scheme_area(shares: list[dict], path=None):
    """Stacked shares of the primary cooperation scheme per training step."""
    from kit.analysis.schemes import SCHEMES

    if not shares:
        raise ValueError("no scheme shares: the run has no code-task rollouts yet")
    steps = [s["step"] for s in shares]
    present = [k for k in SCHEMES if any(s.get(k, 0) > 0 for s in shares)]
    fig, (ax,) = _figure(1, width=7.0)
    ax.stackplot(steps, *[[s.get(k, 0.0) for s in shares] for k in present], labels=present, alpha=0.85)
    ax.set_ylim(0, 1)
    _steps_axis(ax)
    ax.set_ylabel("share of joint actions")
    ax.set_title("cooperation schemes over training")
    _legend(ax)
    return _save(fig, path)


class LiveCurve:
    """`trainer.train(on_step=LiveCurve(run_dir=...))`: redraws the training reward in the notebook every `every`
    steps. With `run_dir`, the steps already in its metrics.jsonl are drawn too, so after a resume the curve
    shows the whole run. Outside IPython it only collects the rows."""

    def __init__(self, every: int = 5, window: int | None = None, run_dir: str | Path | None = None,
                 last: int | None = None):
        """Drawn at each of the first `every` steps (a real model's first minutes show a curve), then every
        `every` steps, and at step `last` (the run's num_steps). `window`: as learning_curves (None: a tenth)."""
        self.every, self.fixed_window, self.last = every, window, last
        self.rows: list[dict] = []
        if run_dir is not None and (Path(run_dir) / "metrics.jsonl").exists():
            self.rows = [r for r in read_metrics(run_dir) if "reward/mean" in r]
        self._handle = None

    def figure(self):
        steps = np.array([r["step"] for r in self.rows])
        if "score/mean" in self.rows[-1]:
            return self._game_figure(steps)
        mismatch = sorted(k for k in self.rows[-1] if k.startswith("mismatch/kl/"))
        critics = self._critics()
        if mismatch:
            fig, (ax, ax_mismatch, *ax_critic) = _figure(2 + bool(critics), width=4.6, height=3.0)
            self._mismatch(ax_mismatch, steps, mismatch)
        else:  # a run from before the sampler's log-probs were kept
            fig, (ax, *ax_critic) = _figure(1 + bool(critics), width=7.0 if not critics else 4.6, height=3.0)
        if critics:
            self._critic(ax_critic[0], steps, critics)
        keys = ("reward/mean", *(k for k in ("reward/tests", "reward/cooperation") if k in self.rows[-1]),
                *sorted(k for k in self.rows[-1] if k.startswith("reward_log/")))  # kit.tasks.rewards.log_metric's
        for key in keys:
            _band(ax, steps, [r.get(key, np.nan) for r in self.rows], self.window, key.removeprefix("reward/"))
        _steps_axis(ax)
        ax.set_ylabel("reward (sampled)")
        ax.set_title(f"training reward, step {self.rows[-1]['step']}")
        _legend(ax)
        return fig

    @property
    def window(self) -> int:
        from kit.analysis.stats import window_for

        return self.fixed_window or window_for(len(self.rows))

    def _mismatch(self, ax, steps, keys: list[str]) -> None:
        """Per adapter, the sampler/trainer KL estimate of each step (kit/maths/losses.py: rollout_weights)."""
        for key in keys:
            ax.plot(steps, [r.get(key, np.nan) for r in self.rows], lw=1, label=key.removeprefix("mismatch/kl/"))
        ax.set_ylabel("KL(sampler || trainer)")
        ax.set_title("sampler vs trainer", fontsize="medium")
        _steps_axis(ax)
        _legend(ax)

    def _critics(self) -> list[str]:
        """The critics of an actor-critic run (algorithm=iac or maac, kit/trainers/critic.py), by name."""
        return sorted(k.removeprefix("critic/value_loss/") for k in self.rows[-1] if k.startswith("critic/value_loss/"))

    def _critic(self, ax, steps, names: list[str]) -> None:
        """Per critic: its explained variance (solid, left axis) and value loss (dashed, right axis)."""
        twin = ax.twinx()
        for name in names:
            line, = ax.plot(steps, [r.get(f"critic/explained_variance/{name}", np.nan) for r in self.rows], lw=1,
                            label=name)
            twin.plot(steps, [r.get(f"critic/value_loss/{name}", np.nan) for r in self.rows], "--", lw=1,
                      color=line.get_color())
        ax.set_ylabel("explained variance")
        twin.set_ylabel("value loss (dashed)")
        ax.set_title("critics", fontsize="medium")
        _steps_axis(ax)
        _legend(ax, right=1.25)

    def _game_figure(self, steps):
        """A game run: the score (sampled; greedy held-out points when logged) and the illegal-move rate."""
        critics = self._critics()
        fig, (ax_score, ax_illegal, *ax_critic) = _figure(2 + bool(critics), width=4.6, height=3.0)
        if critics:
            self._critic(ax_critic[0], steps, critics)
        for ax, key, greedy, ylabel in ((ax_score, "score/mean", "eval/score_mean", "game score"),
                                        (ax_illegal, "illegal/rate", "eval/illegal_rate", "illegal-move rate")):
            _band(ax, steps, [r.get(key, np.nan) for r in self.rows], self.window, "sampled")
            evals = [r for r in self.rows if greedy in r]
            if evals:
                ax.plot([r["step"] for r in evals], [r[greedy] for r in evals], "o--", label="greedy (held-out)")
            ax.set_ylabel(ylabel)
            _steps_axis(ax)
        ax_illegal.set_ylim(-0.02, 1.02)
        ax_score.set_title(f"training, step {self.rows[-1]['step']}", fontsize="medium")
        _legend(ax_illegal)
        return fig

    def __call__(self, row: dict) -> None:
        # a step trained again (after going back to a checkpoint) replaces the dropped ones, never drawn over them
        self.rows = [r for r in self.rows if r["step"] < row["step"]] + [row]
        if len(self.rows) % self.every and len(self.rows) > self.every and row["step"] != self.last:
            return
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is None:
            return
        fig = self.figure()
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)
