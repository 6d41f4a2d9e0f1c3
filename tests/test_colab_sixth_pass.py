"""Colab, sixth pass (issue 76): 01's parameters left unset mean the preset's, the config cell says what the run will
do, and a task that cannot run is refused there, before any model loads.

Run: python -m pytest tests/test_colab_sixth_pass.py
"""

import json
import time
from pathlib import Path

import pytest

from kit import colab
from kit.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README_PRESETS = ["tiny_cpu", "smol_writing", "smol_code", "coder_code", "coder_mbpp", "coder_keys", "colab_a100",
                  "colab_t4"]


def parameters_cell() -> dict:
    """The parameters cell of 01_train.ipynb, run: its values."""
    nb = json.loads((ROOT / "notebooks" / "01_train.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    values: dict = {}
    exec("".join(cell["source"]), {}, values)
    return values


@pytest.fixture
def no_gpu_check(monkeypatch):
    monkeypatch.setattr(colab, "require_gpu", lambda *a, **k: None)  # full mode of a GPU preset, on this CPU


@pytest.mark.parametrize("preset", README_PRESETS + ["coder_code_single", "coder_mbpp_single"])  # + the table's
def test_changing_preset_alone_trains_the_presets_own_task(preset, no_gpu_check, tmp_path, monkeypatch):
    """The parameters cell's defaults with PRESET changed: the preset's task, data, environment and algorithm."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    p = parameters_cell()
    said = []
    cfg = colab.notebook_config(preset, p["TASK"], p["TASK_ARGS"], p["RUN_NAME"], None, p["DRIVE_FOLDER"],
                                p["NUM_STEPS"], p["JUDGE_MODEL"], p["JUDGE_BUDGET_USD"], save_every=p["SAVE_EVERY"],
                                algorithm=p["ALGORITHM"], environment=p["ENVIRONMENT"], log=said.append)
    want = load_config(preset)
    assert (cfg.task, cfg.task_args, cfg.environment, cfg.algorithm, cfg.num_steps) == \
           (want.task, want.task_args, want.environment, want.algorithm, want.num_steps)
    assert any("every setting is the preset's" in line for line in said)


def test_the_config_cell_says_which_preset_settings_a_parameter_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    said = []
    cfg = colab.notebook_config("coder_code", None, {"dataset": "mbpp", "prefill": "helper"}, "run", num_steps=4,
                                log=said.append)
    assert cfg.task == "code" and cfg.task_args["dataset"] == "mbpp"
    plan = "\n".join(s for s in said if s.startswith("[kit] the run"))
    assert ("task_args {'dataset': 'coop', 'prefill': 'helper', 'eval_range': [0, 32], 'train_range': [32, None]} -> "
            "{'dataset': 'mbpp', 'prefill': 'helper'}") in plan
    assert "num_steps 30 -> 4" in plan and "qwen2.5-coder-0.5b" in plan


def test_another_task_than_the_presets_starts_from_its_own_defaults(tmp_path, monkeypatch):
    """smol_writing's users were told TASK = "writing"; a code preset with TASK = "writing" does not carry the code
    task's arguments over (the resume cell used to fail with `task_args={'dataset': 'humaneval'} do not fit`)."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    cfg = colab.notebook_config("smol_code", "writing", None, "run", log=lambda *_: None)
    assert cfg.task == "writing" and cfg.task_args == {}
    assert colab.notebook_config("smol_writing", "writing", None, "run", log=lambda *_: None).task_args == \
        {"kind": "tldr"}  # the preset's own task: its own arguments kept


def test_task_args_that_do_not_fit_are_refused_in_the_config_cell(tmp_path, monkeypatch):
    """Before any model loads, naming what the cell set and what to do."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    with pytest.raises(ValueError, match="(?s)this run cannot start.*TASK_ARGS.*leave TASK, TASK_ARGS and "
                                         "ENVIRONMENT at None"):
        colab.notebook_config("smol_writing", None, {"dataset": "humaneval"}, "run", log=lambda *_: None)


def test_the_rows_example_of_the_parameters_cell_is_a_task_that_starts(tmp_path, monkeypatch):
    """The TASK_ARGS comment's rows example, with KeyHalves as the environment, is accepted as written."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    cells = [c for c in json.loads((ROOT / "notebooks" / "01_train.ipynb").read_text())["cells"]
             if "TASK_ARGS" in "".join(c["source"])]
    line = next(ln for c in cells for ln in "".join(c["source"]).splitlines() if "rows (a JSONL" in ln)
    example = eval(line.split(":", 1)[1].strip())
    cfg = colab.notebook_config("coder_code", "rows", example, "run", environment="kit.tasks.environments:KeyHalves",
                                log=lambda *_: None)
    assert cfg.task == "rows" and cfg.task_args == example


# --- the lows: what a line says

def test_a_failed_copy_after_the_run_does_not_say_training_goes_on(tmp_path):
    """Item 5: the flush cell's copy (a finished run) that fails says the run has ended and what to do."""
    from kit.run.mirror import Mirror

    run = tmp_path / "run"
    (run / "ckpt" / "step_000001").mkdir(parents=True)
    (run / "ckpt" / "step_000001" / "COMPLETE").write_text("")
    (run / "config.json").write_text("{}")
    blocked = tmp_path / "drive_is_a_file"
    blocked.write_text("not a folder")
    said = []
    for training in (True, False):
        said.clear()
        mirror = Mirror(run, blocked / "run", log=said.append, training=training)
        mirror.push()
        mirror.close()
        text = "\n".join(said)
        assert "FAILED" in text
        assert ("Training goes on" in text) == training and ("The run has ended" in text) == (not training)


def test_a_report_made_during_training_says_its_environment_record_comes_at_the_end(tmp_path):
    """Item 8: metrics but no environment.json yet is a run still training, not an old kit's run."""
    from kit.analysis.report import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(load_config("tiny_cpu").__dict__, default=str))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, "perf/step_s": 1.0}) + "\n")
    text = write_report(run, log=lambda *_: None).read_text()
    assert "written when training returns" in text and "older kit, or not trained yet" not in text


def test_the_tiny_model_warning_says_what_it_can_and_cannot_learn(tmp_path, monkeypatch):
    """Item 9: its code reward rises (the structure part), so "stays at 0" was wrong."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    said = []
    colab.notebook_config("tiny_cpu", "code", {"dataset": "coop"}, "run", log=said.append)
    text = "\n".join(said)
    assert "cannot learn" in text and "structure" in text and "stays at 0" not in text


def test_a_report_made_during_training_catches_up_with_the_finished_run(tmp_path, monkeypatch):
    """Item 2: 02/07 ran at step 40; the run ended at 120. 07 evaluates the checkpoints without results, makes Table
    1 again at the newest checkpoint and samples the schemes again, and says so; what is current is not redone."""
    import os

    import kit.analysis.baselines
    import kit.analysis.evaluate
    import kit.analysis.report

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**load_config("tiny_cpu").__dict__, "task": "code"}, default=str))
    for step in (40, 120):
        (run / "ckpt" / f"step_{step:06d}").mkdir(parents=True)
        (run / "ckpt" / f"step_{step:06d}" / "COMPLETE").write_text("")
    for step in (0, 40):
        (run / "eval" / f"step_{step:06d}.json").write_text(json.dumps({"step": step, "num_samples": 4}))
    (run / "eval" / "baselines.json").write_text(json.dumps([{"method": "naive"}, {"method": "magrpo", "step": 40}]))
    (run / "eval" / "schemes_fresh.json").write_text("{}")
    os.utime(run / "eval" / "schemes_fresh.json", (1, 1))  # made before the last checkpoint
    calls = []
    monkeypatch.setattr(kit.analysis.evaluate, "evaluate_run", lambda d, steps, **k: calls.append(("eval", steps)))
    monkeypatch.setattr(kit.analysis.baselines, "compare", lambda d, m, **k: calls.append(("baselines", k["n"])))
    monkeypatch.setattr(kit.analysis.report, "save_fresh_shares", lambda d, **k: calls.append(("schemes",)))
    said = []
    colab.evaluate_missing(run, 4, log=said.append)
    assert calls == [("eval", [120]), ("baselines", 4), ("schemes",)]
    assert any("lack: [120]" in s for s in said) and any("step 40" in s and "120" in s for s in said)
    calls.clear()
    (run / "eval" / "step_000120.json").write_text(json.dumps({"step": 120, "num_samples": 4}))
    (run / "eval" / "baselines.json").write_text(json.dumps([{"method": "magrpo", "step": 120}]))
    (run / "eval" / "schemes_fresh.json").write_text("{}")  # now newer than the checkpoint
    colab.evaluate_missing(run, 4, log=said.append)
    assert calls == []  # everything current: nothing redone


def test_the_config_cell_says_a_cpu_presets_cost_and_then_the_runs_own(tmp_path, monkeypatch):
    """Item 4: the minutes a step of a 0.5B preset on a CPU, from the kit's measurements, and this run's own median
    once it has logged steps."""
    monkeypatch.setattr(colab, "runs_root", lambda: tmp_path)
    monkeypatch.setattr(colab, "_has_gpu", lambda: False)
    said = []
    colab.notebook_config("coder_code", log=said.append)
    line = next(s for s in said if s.startswith("[kit] on a CPU"))
    assert "about 2 minutes a step" in line and "about 60 minutes of training" in line  # 30 steps
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "perf/step_s": s}) + "\n"
                                                            for k, s in ((1, 90.0), (2, 120.0), (3, 600.0))))
    said.clear()
    colab.notebook_config("coder_code", log=said.append)
    assert "This run's own steps: 2.0 minutes (median of 3)" in next(s for s in said if s.startswith("[kit] on a CPU"))


def test_a_held_out_evaluation_during_training_is_kept_out_of_the_bars_time_per_step(tmp_path, monkeypatch):
    """Item 4: the bar says it is evaluating, and the evaluation's seconds are not counted as step time."""
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'r'}", "num_steps=2", "eval_every=1",
                                              "batch_size=2", "num_generations=2"])
    trainer = Trainer(cfg, log=lambda *_: None)

    class Bar:
        start_t = last_print_t = 100.0

        def set_postfix_str(self, text, refresh=True):
            self.said = text

    real = trainer.evaluate
    monkeypatch.setattr(trainer, "evaluate", lambda: (time.sleep(0.2), real())[1])
    bar = Bar()
    out = trainer.evaluate_between_steps(bar)
    assert "eval/reward_mean" in out and "held-out evaluation" in bar.said
    assert bar.start_t >= 100.2 and bar.last_print_t >= 100.2  # the rate ignores those seconds
    trainer.close()


# --- item 7: the analysis bars


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny code run with one checkpoint: what 02-05 look at."""
    from kit.trainers.trainer import Trainer

    path = tmp_path_factory.mktemp("bars") / "run"
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={path}", "progress=false", "num_steps=1", "save_every=1",
                                             "eval_every=0", "batch_size=1", "num_generations=2", "num_eval_items=2",
                                             "max_new_tokens=6"])
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    trainer.close()
    return path


class Bars:
    """tqdm.auto.tqdm, recorded: each bar's description, total and how often it moved."""

    made: list = []

    def __init__(self, iterable=None, desc="", total=None, disable=False, **kwargs):
        self.iterable, self.desc, self.total, self.disable, self.n, self.moves = iterable, desc, total, disable, 0, 0
        if iterable is not None and total is None:
            self.total = len(iterable)
        Bars.made.append(self)

    def __iter__(self):
        for thing in self.iterable:
            yield thing
            self.update(1)

    def update(self, k=1):
        self.n += k
        self.moves += 1

    def reset(self, total=None):
        self.n, self.total = 0, total

    def close(self):
        pass


def test_the_baselines_bar_counts_the_trained_team_as_its_last_job(tiny_run, monkeypatch):
    """03's bar showed 4/4 while the trained team, sampled after the loop, still ran: it is now the bar's fifth job."""
    import kit.analysis.baselines as baselines

    jobs = []
    real = baselines.progress

    def recorded(things, unit):
        jobs.append(list(things))
        return real(things, unit)

    monkeypatch.setattr(baselines, "progress", recorded)
    rows = baselines.compare(tiny_run, ["naive", "sequential"], n=1, log=lambda *_: None)
    assert jobs == [["naive", "sequential", "magrpo"]]
    assert [r["method"] for r in rows] == ["naive", "sequential", "magrpo"]


def test_the_evaluation_bars_move_with_the_decoding_steps(tiny_run, monkeypatch):
    """The bars moved once per checkpoint or method (minutes apart on a CPU); a second bar now moves with every
    decoding step of the generate call running, and restarts at each call."""
    import tqdm.auto

    from kit.analysis.evaluate import evaluate_run

    Bars.made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", Bars)
    evaluate_run(tiny_run, "all", n=1, log=lambda *_: None)
    (outer,) = [b for b in Bars.made if b.desc == "checkpoints"]
    (decoding,) = [b for b in Bars.made if b.desc.strip() == "decoding"]
    assert outer.total == 2 and outer.n == 2  # the base and step 1
    assert decoding.total == 6 and decoding.moves >= 2 * 2  # two checkpoints, several tokens each (EOS may end early)


def test_watching_decode_sees_every_step_and_changes_no_sample(tiny_run):
    from kit.engine.batching import watching_decode
    from kit.run.rundir import open_run
    from kit.engine.models import build_team
    from kit.engine.tools import sampler_for

    run = open_run(tiny_run)
    team = build_team(run.cfg, log=lambda *_: None)
    sampler = sampler_for(team, run.cfg, lambda *_: None)
    item = run.task.load("eval")[0]
    requests, keys = [(0, run.task.prompts(item)[0])], [("watch", item["id"])]
    plain = sampler.sample(requests, 3, keys=keys).texts
    ticks = []
    with watching_decode(lambda step, total: ticks.append((step, total))):
        watched = sampler.sample(requests, 3, keys=keys).texts
    sampler.sample(requests, 3, keys=keys)  # outside: nobody is told
    assert watched == plain
    assert ticks and ticks[0] == (1, 6) and [s for s, _ in ticks] == list(range(1, len(ticks) + 1))


def test_notebooks_that_only_read_the_run_do_not_say_evaluations_take_minutes(tmp_path, monkeypatch):
    """04 and 05 read the run's files (04's fresh-samples cell says its own estimate): their run cell says nothing
    of minutes; 02 and 03, which sample, still do."""
    monkeypatch.setattr(colab, "_has_gpu", lambda: False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model_name": "smollm2-135m", "task": "code"}))
    (run / "environment.json").write_text(json.dumps({"gpu": None}))
    said = []
    colab.run_to_analyse("x", run_dir=run, log=said.append)
    assert any("takes minutes" in s for s in said)
    said.clear()
    colab.run_to_analyse("x", run_dir=run, log=said.append, samples=False)
    assert not any("minutes" in s for s in said)
    for name, reads_only in (("02_evaluate", False), ("03_baselines", False), ("04_schemes", True),
                             ("05_explore", True)):
        nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        cell = next("".join(c["source"]) for c in nb["cells"] if "run_to_analyse(" in "".join(c["source"]))
        assert ("samples=False" in cell) == reads_only, name
