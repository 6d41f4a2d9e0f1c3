"""Colab, fifth pass (issue 55): a Drive that drops and comes back, analysis beside a run still training, writing
judged by its reward, CPU-path notebooks that say how long, short real-model runs, the training cell's lines, two
runtimes on one run, an absolute run folder; one test per problem, each fails on the code before its fix.

Run: python -m pytest tests/test_colab_fifth_pass.py
"""

import errno
import json
import sys
import time
import types
from pathlib import Path

import pytest

from kit.run import rundir
from kit.run.config import load_config
from kit.trainers.trainer import Trainer

QUIET = dict(log=lambda *_: None)


def cfg_for(run_dir, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "progress=false", "num_steps=4", "batch_size=2",
                                              "num_generations=2", "eval_every=0", "save_every=2", *overrides])


@pytest.fixture
def in_colab(monkeypatch):
    """Colab as the kit sees it: google.colab importable (its Drive faked as the fourth pass fakes it), Drive
    mounted."""
    import importlib.machinery

    from kit import env
    from test_colab_fourth_pass import FakeDrive

    drive = FakeDrive()
    colab_module = types.ModuleType("google.colab")
    colab_module.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)  # libraries probe find_spec
    colab_module.drive = drive
    google = types.ModuleType("google")
    google.__spec__ = importlib.machinery.ModuleSpec("google", None, is_package=True)
    google.colab = colab_module
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab_module)
    monkeypatch.setattr(env, "drive_mounted", lambda root=None: True)
    return drive


# 1. a Drive that drops mid-run and comes back -----------------------------------------------------------------

def test_a_drive_back_after_the_run_ended_is_caught_up_by_the_training_cell_and_the_flush_checks(tmp_path,
                                                                                                monkeypatch,
                                                                                                in_colab):
    from kit import colab
    from kit.run import checkpoint
    from kit.run.mirror import Mirror

    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy_all = Mirror._copy_all
    copies = []

    def dropping(self):  # Drive drops after the first copy (step 2) and stays away until the run has ended
        copies.append(1)
        if len(copies) > 1:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        return real_copy_all(self)

    monkeypatch.setattr(Mirror, "_copy_all", dropping)
    cfg = cfg_for(run, f"mirror_dir={drive}")
    trainer = Trainer(cfg, **QUIET)
    colab.train_to_end(trainer, every=100)
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000002"]
    said = []
    assert colab.flush_drive(cfg, log=said.append) is False  # the last cell: Drive is behind, so no flush
    assert in_colab.calls == []
    assert any("NOT up to date" in s and "step 2" in s and "step 4" in s and "training cell" in s for s in said), said
    monkeypatch.setattr(Mirror, "_copy_all", real_copy_all)  # the user mounted Drive again
    said.clear()
    trainer.log = said.append
    summary = colab.train_to_end(trainer, every=100)  # ... and runs the training cell again
    assert summary["backup"] == f"last good backup: step 4 ({drive})"
    assert [p.name for p in checkpoint.complete_checkpoints(drive)][0] == "step_000004"
    assert (drive / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert any("brought up to date" in s for s in said), said
    said.clear()
    assert colab.flush_drive(cfg, log=said.append) is True
    assert in_colab.calls == [("flush_and_unmount",)]
    assert any("UNMOUNTED" in s and "(checked)" in s for s in said), said


# 2. 02 or 07 on a run that 01 is still training ------------------------------------------------------------------

def test_evaluating_a_run_still_training_skips_what_it_prunes_and_leaves_no_result_for_it(tmp_path, monkeypatch):
    from kit.analysis import evaluate
    from kit.run import checkpoint

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=6", "save_every=1", "keep_last=3", "keep_history=0"), **QUIET)
    trainer.train(max_steps=4)  # checkpoints 2, 3, 4; the other tab's training goes on
    trainer.close()
    real = evaluate.evaluate_team
    evaluated = []

    def evaluate_while_training(sampler, task, cfg, items, n, scorer):
        evaluated.append(len(evaluated))
        if len(evaluated) == 1:  # during the base's evaluation the training prunes step 2
            checkpoint.remove(run / "ckpt" / "step_000002")
        if len(evaluated) == 3:  # and step 4 while it is being evaluated
            checkpoint.remove(run / "ckpt" / "step_000004")
        return real(sampler, task, cfg, items, n, scorer)

    monkeypatch.setattr(evaluate, "evaluate_team", evaluate_while_training)
    said = []
    rows = evaluate.evaluate_run(run, "all", n=1, num_items=2, log=said.append)
    assert [r["step"] for r in rows] == [0, 3]
    assert sorted(p.name for p in (run / "eval").glob("step_*.json")) == ["step_000000.json", "step_000003.json"]
    assert any("not finished (step 4 of 6)" in s for s in said), said
    assert any("step 2 skipped" in s for s in said) and any("step 4 dropped" in s for s in said), said


def test_the_baselines_take_the_newest_checkpoint_again_when_it_vanishes(tmp_path, monkeypatch):
    from kit.analysis.evaluate import CheckpointGone, RunContext
    from kit.run import checkpoint

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "save_every=1", "keep_last=2", "keep_history=0"), **QUIET)
    trainer.train(max_steps=3)
    trainer.close()
    ctx = RunContext(run, num_items=1, **QUIET)
    real = ctx.use_step
    gone = []

    def use_step(step):
        if step == 3 and not gone:  # pruned between choosing it and reading it; the training saved step 4
            gone.append(step)
            trainer.train(max_steps=1)
        return real(step)

    monkeypatch.setattr(ctx, "use_step", use_step)
    monkeypatch.setattr(checkpoint, "load_adapters", _vanishing(checkpoint.load_adapters, run, gone))
    assert ctx.use_team_step("newest", log=lambda *_: None) == 4
    with pytest.raises(CheckpointGone, match="still training"):
        RunContext.use_step(ctx, 2)  # pruned for good (keep_last=2): a clear error, not a KeyError
    ctx.close()
    trainer.close()


def _vanishing(load, run, gone):
    def loading(path, team):
        if gone and Path(path).name == "step_000003":
            raise FileNotFoundError(path)
        return load(path, team)
    return loading


# 3. writing runs are judged by their reward ----------------------------------------------------------------------

def test_a_writing_run_is_judged_by_its_mean_reward_in_the_report_compare_and_the_figure(tmp_path):
    from kit.analysis import plots, report, stats
    from kit.analysis.evaluate import summarize
    from kit.tasks import get_task
    from kit.tasks.rewards import Reward

    task = get_task("writing", 2)
    rows = []
    for method, grades in (("naive", [1.0, 1.2, 0.8]), ("magrpo", [1.3, 1.5, 1.1])):
        rewards = [[Reward(total=g, parts={"grade": g}) for _ in range(2)] for g in grades]
        rows.append({"method": method, "step": 5, **summarize(task, rewards)})
    assert rows[0]["pass@1"] == 0.0 and rows[0]["headline"] == "reward/mean"
    assert stats.headline(rows) == "reward/mean"
    text = report.table1_section({"baselines": rows, "evals": [], "config": {"task": "writing"}, "path": tmp_path})
    assert "Δ reward/mean (magrpo − method)" in text and "Δ pass@1" not in text
    fig = plots.baseline_bars(rows)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["reward/mean"]
    code_rows = [{**r, "headline": "pass@1"} for r in rows]
    assert stats.headline(code_rows) == "pass@1"  # a pass/fail task keeps pass@1


# 4. the analysis notebooks on a CPU --------------------------------------------------------------------------------

def real_cpu_run(path: Path, generate_s: float = 60.0) -> Path:
    """A run folder of the coder preset trained on this CPU (environment.json without a GPU)."""
    from kit.run.config import to_dict

    path.mkdir(parents=True)
    cfg = to_dict(load_config("coder_code", overrides=[f"run_dir={path}"]))
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "environment.json").write_text(json.dumps({"gpu": None}))
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 1.0, "perf/generate_s": generate_s})
                                        + "\n")
    return path


def test_the_analysis_of_a_cpu_run_says_how_long_shows_bars_and_never_sends_to_a_gpu(tmp_path, monkeypatch):
    from kit import colab
    from kit.analysis import evaluate

    monkeypatch.delenv("KIT_SMOKE", raising=False)
    monkeypatch.setattr(colab, "_has_gpu", lambda: False)
    run = real_cpu_run(tmp_path / "run")
    said = []
    colab.run_to_analyse("run", run_dir=run, log=said.append)
    assert not any("Change runtime type" in s for s in said), said
    assert colab.samples_per_item(run) == 4 and colab.samples_per_item(real_cpu_run(tmp_path / "tiny").parent /
                                                                       "missing") == 10
    ctx = types.SimpleNamespace(run_dir=run, cfg=load_config("coder_code"), items=[{}] * 8)
    said.clear()
    evaluate.say_estimate(ctx, 3, 4, log=said.append)  # 3 checkpoints x 8 items x 4 samples
    per_row = 60.0 / (ctx.cfg.batch_size * ctx.cfg.num_generations)
    assert said and "96 joint samples" in said[0] and f"about {per_row * 96 / 60:.0f} min" in said[0], said
    bars = []
    monkeypatch.setattr(evaluate, "progress", lambda things, unit: bars.append(unit) or things)
    tiny = tmp_path / "tiny_run"
    trainer = Trainer(cfg_for(tiny, "num_steps=2"), **QUIET)
    trainer.train()
    trainer.close()
    evaluate.evaluate_run(tiny, "all", n=1, num_items=1, **QUIET)
    from kit.analysis import baselines

    monkeypatch.setattr(baselines, "progress", lambda things, unit: bars.append(unit) or things)
    baselines.compare(tiny, ["naive"], n=1, **QUIET)
    assert bars == ["checkpoints", "methods"]


# 5. wording the smol presets made wrong ----------------------------------------------------------------------------

def test_the_words_name_the_cpu_presets(monkeypatch):
    import torch

    from kit import colab, env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "coder_code" in env.gpu_summary() and "smol_writing" in env.gpu_summary()
    said = []
    colab.notebook_config("tiny_cpu", "code", {"dataset": "coop"}, "run", log=said.append)
    assert any("cannot learn" in s and "coder_code" in s for s in said), said
    said.clear()
    colab.notebook_config("tiny_cpu", "writing", {}, "run", log=said.append)
    assert any("cannot learn" in s and "smol_writing" in s for s in said), said


# 6. short real-model runs ---------------------------------------------------------------------------------------

def test_a_short_run_is_evaluated_at_its_end_and_says_the_step_0_evaluation_first(tmp_path):
    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=3", "eval_every=5", "num_eval_items=2"),
                      log=said.append)
    summary = trainer.train()
    trainer.close()
    evals = [r["step"] for r in rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval/reward_mean" in r]
    assert evals == [0, 3]
    assert summary["eval_end"] is not None
    assert any(s.startswith("[kit] step 0:") for s in said), said


def test_the_live_curve_draws_the_first_steps_and_the_last_one():
    from kit.analysis.plots import LiveCurve

    drawn = []

    class Counting(LiveCurve):
        def figure(self):
            drawn.append(self.rows[-1]["step"])
            raise _Drawn

    class _Drawn(Exception):
        pass

    def run(curve, steps):
        ipython = types.ModuleType("IPython")
        ipython.get_ipython = lambda: object()
        display = types.ModuleType("IPython.display")
        display.display = lambda *a, **k: None
        saved = {k: sys.modules.get(k) for k in ("IPython", "IPython.display")}
        sys.modules.update({"IPython": ipython, "IPython.display": display})
        try:
            for s in range(1, steps + 1):
                try:
                    curve({"step": s, "reward/mean": 0.1 * s})
                except _Drawn:
                    pass
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

    run(Counting(every=5, last=4), 4)
    assert drawn == [1, 2, 3, 4]  # a 4-step run shows a curve at once
    drawn.clear()
    run(Counting(every=5, last=12), 12)
    assert drawn == [1, 2, 3, 4, 5, 10, 12]  # the last frame is the last step


# 7. the training cell's lines ----------------------------------------------------------------------------------

def test_the_complete_run_says_which_cells_train_longer_and_a_lowered_num_steps_is_named(tmp_path):
    from kit.trainers.trainer import complete_line

    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=2"), log=said.append)
    trainer.train()
    trainer.train()  # the training cell run again
    trainer.close()
    line = [s for s in said if "nothing to train" in s][0]
    assert "NUM_STEPS" in line and "config cell" in line and "resume cell" in line
    lowered = complete_line(80, 50, mirrored=False)
    assert "already trained 80 steps, more than num_steps=50" in lowered and "80 of 50" not in lowered


# 8. two runtimes training one run into one Drive folder -----------------------------------------------------------

def test_two_runtimes_writing_one_drive_folder_are_said(tmp_path):
    from kit import colab
    from kit.run.mirror import Mirror

    drive = tmp_path / "drive"
    said = []
    first = Trainer(cfg_for(tmp_path / "tab1", f"mirror_dir={drive}"), log=said.append)
    first.train(max_steps=2)
    first.mirror.flush()
    other = Mirror(tmp_path / "tab1", drive, **QUIET)  # a second runtime copying into the same folder
    other.runtime = {**other.runtime, "id": "another-runtime", "host": "colab-vm-2"}
    other.push().result()
    other.close()
    first.train()
    first.close()
    assert any("ANOTHER RUNTIME" in s and "colab-vm-2" in s for s in said), said
    again = []
    colab.start_or_resume(cfg_for(tmp_path / "tab3", f"mirror_dir={drive}"), log=again.append)
    assert not any("another runtime" in s for s in again), again  # this process wrote it last: no note
    (drive / "runtime.json").write_text(json.dumps({"id": "x", "host": "colab-vm-2", "time": time.time() - 60}))
    again.clear()
    colab.start_or_resume(cfg_for(tmp_path / "tab4", f"mirror_dir={drive}"), log=again.append)
    assert any("another runtime copied this run to Drive recently" in s and "colab-vm-2" in s for s in again), again


# 9. left from the last pass --------------------------------------------------------------------------------------

def test_the_run_folder_is_absolute_and_in_colab_the_same_after_a_restart(tmp_path, monkeypatch, in_colab):
    from kit import colab

    monkeypatch.chdir(tmp_path)  # a kernel restart with the install cell skipped: another working folder
    cfg = colab.notebook_config("tiny_cpu", "toy", {}, "run", **QUIET)
    assert cfg.run_dir == "/content/magrpo-kit/checkpoints/run"
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    cfg = colab.notebook_config("tiny_cpu", "toy", {}, "run", **QUIET)
    assert Path(cfg.run_dir).is_absolute() and Path(cfg.run_dir) == tmp_path / "checkpoints" / "run"


def test_a_one_run_comparison_draws_no_band_over_seeds(tmp_path):
    from kit.analysis.compare import compare_runs

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=2"), **QUIET)
    trainer.train()
    trainer.close()
    import matplotlib.pyplot as plt

    seen = []
    real = plt.Figure.savefig

    def saving(fig, *args, **kwargs):
        seen.extend(ax.get_title() for ax in fig.axes)
        return real(fig, *args, **kwargs)

    plt.Figure.savefig, saved = saving, plt.Figure.savefig
    try:
        compare_runs([run], out_dir=tmp_path / "cmp", **QUIET)
    finally:
        plt.Figure.savefig = saved
    assert seen and not any("range over seeds" in t for t in seen), seen


def test_the_summary_and_the_report_end_the_training_reward_at_the_same_number(tmp_path):
    from kit.analysis.runinfo import final_train_reward

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward/mean": (s % 7) / 3} for s in range(1, 41)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = Trainer.summary(types.SimpleNamespace(run_dir=run, step=40))
    assert summary["reward_end"] == pytest.approx(final_train_reward(rows)[0])


# the review of the fixes above ------------------------------------------------------------------------------------

def test_a_full_drive_still_gets_space_back_when_the_runtime_marker_cannot_be_written(tmp_path, monkeypatch):
    from kit.run import checkpoint, runtimes

    def full(path, value):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runtimes, "write_json", full)
    drive = tmp_path / "drive"
    trainer = Trainer(cfg_for(tmp_path / "run", "save_every=1", "keep_last=1", "keep_history=0",
                              f"mirror_dir={drive}"), **QUIET)
    trainer.train()
    trainer.close()
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000004"]


def test_the_training_cell_after_the_flush_says_no_false_failure(tmp_path, monkeypatch):
    from kit import colab, env

    drive = tmp_path / "drive"
    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", f"mirror_dir={drive}"), log=said.append)
    colab.train_to_end(trainer, every=100)
    monkeypatch.setattr(env, "unmounted_drive", lambda path: True)  # 01's last cell unmounted Drive
    said.clear()
    colab.train_to_end(trainer, every=100)  # the training cell run again
    assert not any("FAIL" in s or "brought up to date" in s for s in said), said


def test_logs_past_the_newest_checkpoint_do_not_make_drive_behind(tmp_path):
    from kit.run.mirror import behind

    drive = tmp_path / "drive"
    trainer = Trainer(cfg_for(tmp_path / "run", f"mirror_dir={drive}"), **QUIET)
    trainer.train(max_steps=3)  # checkpoint 2 on Drive, step 3 logged here only (a resume trains it again)
    trainer.mirror.flush()
    assert behind(tmp_path / "run", drive) is None
    trainer.close()


def test_a_dead_process_of_this_machine_is_no_other_runtime(tmp_path):
    import socket

    from kit import colab

    drive = tmp_path / "drive"
    first = Trainer(cfg_for(tmp_path / "old", "num_steps=2", f"mirror_dir={drive}"), **QUIET)
    first.train()
    first.close()
    (drive / "runtime.json").write_text(json.dumps({"id": "old-kernel", "host": socket.gethostname(),
                                                    "pid": 2 ** 22 + 12345, "time": time.time() - 30}))
    said = []
    colab.start_or_resume(cfg_for(tmp_path / "new", "num_steps=2", f"mirror_dir={drive}"), log=said.append)
    assert not any("another runtime" in s for s in said), said


def test_a_writing_run_evaluated_by_an_older_kit_is_judged_by_its_reward(tmp_path):
    from kit.analysis import report

    rows = [{"method": m, "step": 5, "pass@1": 0.0, "reward/mean": r, "num_samples": 2, "num_items": 3,
             "per_item": {"reward": [r, r, r], "correct": [0, 0, 0]}} for m, r in (("naive", 1.0), ("magrpo", 1.3))]
    text = report.table1_section({"baselines": rows, "evals": [], "config": {"task": "writing"}, "path": tmp_path})
    assert "Δ reward/mean (magrpo − method)" in text


def test_the_baselines_say_when_the_run_is_still_training(tmp_path):
    from kit.analysis import baselines

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=6"), **QUIET)
    trainer.train(max_steps=2)
    trainer.close()
    said = []
    baselines.compare(run, ["naive"], n=1, log=said.append)
    assert any("not finished (step 2 of 6)" in s for s in said), said


def test_the_flush_takes_what_the_cells_wrote_after_training_to_drive(tmp_path, in_colab):
    from kit import colab

    drive = tmp_path / "drive"
    cfg = cfg_for(tmp_path / "run", f"mirror_dir={drive}")
    colab.train_to_end(Trainer(cfg, **QUIET), every=100)
    (tmp_path / "run" / "eval" / "baselines.json").write_text("[]")  # 06's cells, after the trainer closed
    assert colab.flush_drive(cfg, log=lambda *_: None) is True
    assert (drive / "eval" / "baselines.json").read_text() == "[]"
