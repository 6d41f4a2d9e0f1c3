"""Figures: a game run gets game figures (score sampled and greedy, illegal-move rate, episode length) during
training and in the baselines chart; step axes have whole-number ticks; legends never cover the data.

Run: python -m pytest tests/test_plots.py
"""

import json

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from kit.analysis import plots


def write_metrics(run, rows):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def game_run(tmp_path):
    """metrics.jsonl as GameTrainer writes it: a greedy eval at step 0 and with step 2."""
    rows = [{"step": 0, "eval/reward_mean": 1.0, "eval/score_mean": 1.5, "eval/illegal_rate": 0.5}]
    for step in (1, 2):
        rows.append({"step": step, "reward/mean": 2.0 * step - 1, "score/mean": 2.0 * step, "score/std": 1.0,
                     "score/max": 4.0, "illegal/rate": 0.4 / step, "episode/length": 1.5 + step / 4})
    rows[-1].update({"eval/reward_mean": 5.0, "eval/score_mean": 5.0, "eval/illegal_rate": 0.0})
    return write_metrics(tmp_path / "game", rows)


def code_run(tmp_path):
    rows = [{"step": s, "reward/mean": 0.5 * s, "reward/std": 0.1, "reward/structure": 1.0, "reward/tests": 0.1 * s,
             "reward/cooperation": 0.0} for s in (1, 2)]
    rows[-1]["eval/reward_mean"] = 1.2
    return write_metrics(tmp_path / "code", rows)


def drawn(fig):
    FigureCanvasAgg(fig).draw()
    return fig


def labels(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []


def test_a_game_runs_learning_curves_plot_score_illegal_rate_and_episode_length(tmp_path):
    fig = plots.learning_curves(game_run(tmp_path))
    score, illegal, length = fig.axes
    assert score.get_ylabel() == "game score" and "illegal" in illegal.get_ylabel()
    assert length.get_ylabel() == "decisions per episode"
    assert all(ax.has_data() for ax in fig.axes)  # the issue: an empty "reward parts" panel
    assert labels(score) == ["sampled (training)", "greedy (held-out)"]
    greedy = [line for line in score.get_lines() if line.get_label() == "greedy (held-out)"][0]
    assert list(greedy.get_xdata()) == [0, 2] and list(greedy.get_ydata()) == [1.5, 5.0]
    trained = [line for line in illegal.get_lines() if line.get_label() == "sampled (training)"][0]
    assert list(trained.get_ydata()) == pytest.approx([0.4, 0.3])  # smoothed: the mean of 0.4 and 0.2


def test_the_live_curve_of_a_game_run_shows_score_and_illegal_move_rate(tmp_path):
    live = plots.LiveCurve(every=1, run_dir=game_run(tmp_path))
    score, illegal = live.figure().axes
    assert score.get_ylabel() == "game score" and illegal.get_ylabel() == "illegal-move rate"
    assert "greedy (held-out)" in [line.get_label() for line in score.get_lines()]


def test_game_baselines_show_sampled_and_greedy_score_illegal_rate_and_length():
    rows = [{"method": "random", "score/mean": 3.7, "illegal/rate": 0.0, "episode/length": 2.0},
            {"method": "base", "score/mean": 4.06, "greedy/score_mean": 1.5, "illegal/rate": 0.3,
             "greedy/illegal_rate": 0.5, "episode/length": 2.0},
            {"method": "magrpo", "score/mean": 3.92, "greedy/score_mean": 5.0, "illegal/rate": 0.1,
             "greedy/illegal_rate": 0.0, "episode/length": 1.5}]
    score, illegal, length = plots.baseline_bars(rows).axes
    heights = {c.get_label(): [round(b.get_height(), 2) for b in c] for c in score.containers}
    assert heights == {"sampled": [3.7, 4.06, 3.92], "greedy": [1.5, 5.0]}  # random plays no greedy game: no bar
    assert [round(b.get_height(), 2) for c in illegal.containers for b in c] == [0.0, 0.3, 0.1, 0.5, 0.0]
    assert [b.get_height() for c in length.containers for b in c] == [2.0, 2.0, 1.5]
    assert [t.get_text() for t in length.get_xticklabels()] == ["random", "base", "magrpo"]


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("figures")
    evals = [{"step": s, "pass@1": 0.1 * s, "reward/mean": 0.2 * s, "cooperation_rate": 0.5} for s in (0, 1, 2)]
    figs = {"learning": plots.learning_curves(code_run(tmp_path)),
            "game": plots.learning_curves(game_run(tmp_path)),
            "eval": plots.eval_curves(evals),
            "schemes": plots.scheme_area([{"step": 1, "wrapper": 1.0}, {"step": 2, "wrapper": 0.5}]),
            "live": plots.LiveCurve(every=1, run_dir=tmp_path / "code").figure()}
    return {name: drawn(fig) for name, fig in figs.items()}


def test_step_ticks_are_whole_numbers(figures):
    for name, fig in figures.items():
        for ax in fig.axes:
            if ax.get_xlabel() == "step":
                assert all(float(t).is_integer() for t in ax.get_xticks()), (name, list(ax.get_xticks()))


def test_legends_sit_beside_the_data(figures):
    for name, fig in figures.items():
        for ax in fig.axes:
            if ax.get_legend() is not None:
                legend, area = ax.get_legend().get_window_extent(), ax.get_window_extent()
                assert not legend.overlaps(area), (name, ax.get_title())


def test_every_panel_has_a_y_label(figures):
    assert figures["learning"].axes[1].get_title() == "reward parts"
    for name, fig in figures.items():
        for ax in fig.axes:
            assert ax.get_ylabel(), (name, ax.get_title())


def test_a_game_runs_evaluation_over_checkpoints_plots_score_illegal_rate_and_length():
    rows = [{"step": s, "score/mean": 4.0 + s, "greedy/score_mean": 1.5 + s, "illegal/rate": 0.3 / (s + 1),
             "greedy/illegal_rate": 0.5 / (s + 1), "episode/length": 2.0, "reward/mean": 3.0 + s} for s in (0, 4)]
    score, illegal, length = plots.eval_curves(rows).axes
    assert [line.get_label() for line in score.get_lines()] == ["sampled", "greedy"]
    assert list(illegal.get_lines()[1].get_ydata()) == [0.5, 0.1] and length.get_ylabel() == "decisions per episode"


def test_notebook_06_draws_the_game_figures_of_its_run(tmp_path):
    import types
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parent.parent / "notebooks" / "06_hanabi.ipynb", as_version=4)
    (cell,) = [c.source for c in nb.cells if c.cell_type == "code" and "plots.learning_curves(" in c.source]
    *body, last = cell.strip().splitlines()
    space = {"cfg": types.SimpleNamespace(run_dir=game_run(tmp_path))}
    exec("\n".join(body), space)
    fig = eval(last, space)  # the figure the cell shows
    assert [ax.get_ylabel() for ax in fig.axes] == ["game score", "illegal moves / decisions", "decisions per episode"]


def test_the_live_curve_of_a_critic_run_shows_each_critics_fit(tmp_path):
    """algorithm=iac (issue 31): a third panel, explained variance per critic and its value loss on a twin axis."""
    rows = [{"step": s, "reward/mean": 0.1 * s, "mismatch/kl/agent_0": 0.0, **{
        f"critic/{k}/critic_{i}": v * s + i for i in (0, 1) for k, v in (("value_loss", 1.0), ("explained_variance",
                                                                                              0.1))}}
            for s in (1, 2)]
    live = plots.LiveCurve(every=1, run_dir=write_metrics(tmp_path / "iac", rows))
    axes = live.figure().axes
    critic = [ax for ax in axes if ax.get_title() == "critics"][0]
    ev = {line.get_label(): list(line.get_ydata()) for line in critic.get_lines()}
    assert ev == {"critic_0": [0.1, 0.2], "critic_1": [1.1, 1.2]}
    twin = [ax for ax in axes if ax.get_ylabel() == "value loss (dashed)"][0]
    assert [list(line.get_ydata()) for line in twin.get_lines()] == [[1.0, 2.0], [2.0, 3.0]]
