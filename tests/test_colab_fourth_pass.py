"""Colab, fourth pass (issue 42): a stop during generation, a Drive that is no longer mounted, logs behind their
checkpoint on Drive, a stop while the last copy runs, CPU advice that cannot learn; one test per problem, each
fails on the code before its fix.

Run: python -m pytest tests/test_colab_fourth_pass.py
"""

from pathlib import Path

import pytest
import torch

from kit.run import rundir
from kit.run.config import load_config
from kit.trainers.game_trainer import trainer_class
from kit.trainers.trainer import Trainer

QUIET = dict(log=lambda *_: None)


def cfg_for(run_dir, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "progress=false", "num_steps=4", "batch_size=2",
                                              "num_generations=2", "eval_every=0", "save_every=2", *overrides])


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def pre_hooks(model) -> int:
    return sum(len(m._forward_pre_hooks) for m in model.modules())


# 1. a stop during generation ---------------------------------------------------------------------------------

def make(cfg):
    return trainer_class(cfg.task, cfg.algorithm)(cfg, **QUIET)


def reference(run_dir, *overrides) -> Path:
    """The same run, never stopped."""
    trainer = make(cfg_for(run_dir, *overrides))
    trainer.train()
    trainer.close()
    return run_dir


GAME = ["task=game", "task_args={game: tiny_hanabi}", "max_new_tokens=4"]


@pytest.mark.parametrize("overrides", [["rollout_engine=hf"], ["rollout_engine=compiled"], GAME],
                         ids=["hf", "compiled", "game"])
def test_a_stop_inside_generation_leaves_no_hook_and_the_run_continues_exactly(tmp_path, overrides):
    """Colab's stop (a KeyboardInterrupt) lands inside the engine's generate (PEFT's generate(adapter_names=...)
    for hf) at step 3: the training cell run again continues exactly like a run never stopped."""
    run = tmp_path / "run"
    trainer = make(cfg_for(run, *overrides))
    trainer.train(max_steps=2)
    model = trainer.team.models[0]
    sampler = getattr(trainer.team.engines[0], "gen", model)  # the compiled engine samples from its own model
    before = pre_hooks(model), pre_hooks(sampler), model.training

    def stop(module, args):
        raise KeyboardInterrupt

    handle = sampler.get_input_embeddings().register_forward_pre_hook(stop)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    handle.remove()
    assert trainer.step == 2
    assert (pre_hooks(model), pre_hooks(sampler), model.training) == before  # PEFT's adapter_names hooks are gone
    trainer.train()  # the training cell run again
    trainer.close()
    done = reference(tmp_path / "reference", *overrides)
    assert (run / "rollouts.jsonl").read_text() == (done / "rollouts.jsonl").read_text()
    assert without_timings(rundir.read_jsonl(run / "metrics.jsonl")) == \
        without_timings(rundir.read_jsonl(done / "metrics.jsonl"))


# 2. a Drive that is no longer mounted ------------------------------------------------------------------------

@pytest.fixture
def unmounted(tmp_path, monkeypatch):
    """Colab's Drive path after 01's last cell unmounted it: a plain folder, not a mount point."""
    from kit import env

    root = tmp_path / "content" / "drive"
    (root / "MyDrive").mkdir(parents=True)
    monkeypatch.setattr(env, "DRIVE_ROOT", str(root))
    return root


def test_the_mirror_copies_nothing_to_an_unmounted_drive_and_says_so(unmounted, tmp_path):
    from kit import colab

    mirror = unmounted / "MyDrive" / "magrpo-kit" / "runs" / "run"
    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=2", f"mirror_dir={mirror}"), log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert not mirror.exists()  # no plain folder of this disk at Drive's path
    assert summary["backup"].startswith("last good backup: none yet")
    failures = [s for s in said if "fail" in s.lower()]
    assert failures and all("Drive is not mounted" in s for s in failures), failures


def test_resume_does_not_trust_a_plain_folder_at_the_drive_path(unmounted, tmp_path):
    """A folder made at the Drive path while Drive was unmounted, ahead of this disk: not restored from."""
    from kit import colab

    mirror = unmounted / "MyDrive" / "runs" / "run"
    ahead = Trainer(cfg_for(mirror, "num_steps=2"), **QUIET)
    ahead.train()
    ahead.close()
    said = []
    trainer = colab.start_or_resume(cfg_for(tmp_path / "run", "num_steps=2", f"mirror_dir={mirror}"),
                                    log=said.append)
    assert trainer.step == 0 and not (tmp_path / "run" / "ckpt").exists()
    assert any("not restoring" in s and "Drive is not mounted" in s for s in said), said


def test_the_config_cell_says_when_drive_is_not_mounted(unmounted, monkeypatch):
    from kit import colab

    said = []
    cfg = colab.notebook_config("tiny_cpu", "toy", {}, "run", unmounted / "MyDrive", log=said.append)
    assert cfg.mirror_dir and any("NOT MOUNTED" in s and "mount_drive()" in s for s in said), said


class FakeDrive:
    def __init__(self):
        self.calls = []

    def mount(self, root):
        self.calls.append(("mount", root))

    def flush_and_unmount(self):
        self.calls.append(("flush_and_unmount",))


@pytest.fixture
def in_colab(monkeypatch):
    import sys
    import types

    drive = FakeDrive()
    colab_module = types.ModuleType("google.colab")
    colab_module.drive = drive
    google = types.ModuleType("google")
    google.colab = colab_module
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab_module)
    return drive


def test_the_drive_cell_mounts_again_over_a_plain_folder(unmounted, in_colab):
    from kit import env

    left = unmounted / "MyDrive" / "magrpo-kit" / "runs" / "run" / "metrics.jsonl"
    left.parent.mkdir(parents=True)
    left.write_text("{}\n")
    said = []
    assert env.mount_drive(str(unmounted), log=said.append) == unmounted / "MyDrive"
    assert in_colab.calls == [("mount", str(unmounted))]
    assert not unmounted.exists() or not any(unmounted.iterdir())  # Colab mounts only on an empty folder
    assert any("never reached Drive" in s for s in said), said


def test_the_flush_says_that_drive_is_unmounted_and_how_to_mount_it_again(unmounted, in_colab, monkeypatch):
    from kit import env

    monkeypatch.setattr(env, "drive_mounted", lambda root=None: True)
    said = []
    env.flush_drive(log=said.append)
    assert in_colab.calls == [("flush_and_unmount",)]
    assert any("UNMOUNTED" in s and "mount_drive()" in s for s in said), said


# 4. Drive's logs behind its checkpoint -----------------------------------------------------------------------

def test_drive_never_holds_a_checkpoint_its_logs_do_not_reach(tmp_path, monkeypatch):
    """A Drive slower than save_every: the copy pushed at step 2 is slow on rollouts.jsonl (the big log) until
    step 4 is saved, then the runtime disconnects (every later copy fails). A new runtime restores from Drive and
    trains to the end: the logs have every step, as a run never stopped."""
    import errno
    import os
    import shutil
    import time

    from kit import colab
    from kit.run.mirror import Mirror

    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy, real_copy_all = shutil.copyfile, Mirror._copy_all
    calls = []

    def slow_copy(src, dst, *args, **kwargs):
        if len(calls) == 1 and os.fspath(src) == str(run / "rollouts.jsonl"):
            deadline = time.time() + 60
            while not (run / "ckpt" / "step_000004" / "COMPLETE").exists() and time.time() < deadline:
                time.sleep(0.05)
        return real_copy(src, dst, *args, **kwargs)

    def copy_all(self):
        calls.append(1)
        if len(calls) > 1:  # the runtime is gone: nothing more reaches Drive
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        return real_copy_all(self)

    monkeypatch.setattr(shutil, "copyfile", slow_copy)
    monkeypatch.setattr(Mirror, "_copy_all", copy_all)
    trainer = Trainer(cfg_for(run, f"mirror_dir={drive}"), **QUIET)
    colab.train_to_end(trainer, every=100)
    monkeypatch.undo()
    again = colab.start_or_resume(cfg_for(tmp_path / "new_runtime", f"mirror_dir={drive}"), **QUIET)
    colab.train_to_end(again, every=100)
    done = reference(tmp_path / "reference")
    assert without_timings(rundir.read_jsonl(tmp_path / "new_runtime" / "metrics.jsonl")) == \
        without_timings(rundir.read_jsonl(done / "metrics.jsonl"))


def test_restore_refuses_a_checkpoint_newer_than_the_logs_on_drive(tmp_path):
    """Drive as an older kit (logs copied before checkpoints) could leave it: checkpoint 4, logs through step 2."""
    import shutil

    from kit import colab

    drive = tmp_path / "drive"
    shutil.copytree(reference(tmp_path / "reference"), drive)
    rundir.truncate_jsonl(drive / "metrics.jsonl", 2)
    rundir.truncate_jsonl(drive / "rollouts.jsonl", 2)
    said = []
    trainer = colab.start_or_resume(cfg_for(tmp_path / "run", f"mirror_dir={drive}"), log=said.append)
    assert trainer.step == 2
    assert any("step 4" in s and "logs" in s and "not restored" in s for s in said), said


def test_a_checkpoint_that_got_through_a_failing_copy_counts_and_the_mirror_still_prunes(tmp_path, monkeypatch):
    """Every copy fails at the adapter history (Drive full); the full checkpoints themselves get through."""
    import errno
    import os
    import shutil

    from kit import colab
    from kit.run import checkpoint

    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy = shutil.copyfile

    def failing_copy(src, dst, *args, **kwargs):
        if os.fspath(dst).startswith(str(drive / "history")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", failing_copy)
    trainer = Trainer(cfg_for(run, "save_every=1", "keep_last=1", "keep_history=3", f"mirror_dir={drive}"),
                      **QUIET)
    summary = colab.train_to_end(trainer, every=100)
    assert summary["backup"] == f"last good backup: step 4 ({drive})"
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000004"]  # pruned, not piling up


# 5. a stop while the training cell waits for the last Drive copy ------------------------------------------------

def test_a_stop_while_waiting_for_the_last_copy_is_said_and_the_cell_run_again_waits_for_it(tmp_path, monkeypatch):
    import os
    import shutil
    import threading

    from kit import colab

    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy, slow = shutil.copyfile, threading.Event()

    def slow_copy(src, dst, *args, **kwargs):  # a slow Drive: step 4's checkpoint takes its time
        if os.fspath(dst).startswith(str(drive / "ckpt")) and "step_000004" in os.fspath(dst):
            assert slow.wait(60)
        return real_copy(src, dst, *args, **kwargs)

    said = []

    def log(line):  # Colab's stop button, pressed as the cell starts to wait
        said.append(line)
        if "waiting for the copy to Drive" in line and not slow.is_set():
            slow.set()
            raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", slow_copy)
    trainer = Trainer(cfg_for(run, f"mirror_dir={drive}"), log=log)
    with pytest.raises(KeyboardInterrupt):
        colab.train_to_end(trainer, every=100)
    assert any("step 4" in s and "A stop here loses nothing" in s for s in said), said
    summary = colab.train_to_end(trainer, every=100)  # the training cell run again
    assert summary["backup"] == f"last good backup: step 4 ({drive})"


# 3. CPU advice that leads to a run that learns -----------------------------------------------------------------

def test_the_cpu_advice_names_a_task_the_tiny_model_learns(monkeypatch):
    from kit import colab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(colab.GPUNeeded) as refused:
        colab.notebook_config("colab_a100", "code", {"dataset": "humaneval"}, "x", **QUIET)
    assert "PRESET = 'tiny_cpu' with TASK = None" in str(refused.value)
    with pytest.raises(colab.GPUNeeded) as refused:
        colab.notebook_config("colab_hanabi", "game", {"game": "hanabi"}, "x", **QUIET)
    assert "PRESET = 'tiny_hanabi'" in str(refused.value) and "'game': 'tiny_hanabi'" in str(refused.value)


@pytest.mark.parametrize("preset, task, task_args, warned", [
    ("tiny_cpu", "code", {"dataset": "humaneval"}, True), ("tiny_cpu", "writing", {}, True),
    ("tiny_hanabi", "game", {"game": "hanabi"}, True), ("tiny_cpu", "toy", {}, False),
    ("tiny_hanabi", "game", {"game": "tiny_hanabi", "prompt_style": "compact"}, False)])
def test_the_config_cell_warns_when_the_tiny_model_cannot_learn_the_task(preset, task, task_args, warned):
    from kit import colab

    said = []
    colab.notebook_config(preset, task, task_args, "x", drive=Path("/tmp/not-drive"), log=said.append)
    assert any("cannot learn" in s and "TASK" in s for s in said) == warned, said


def test_the_cli_on_a_cpu_says_which_preset_to_pass(tmp_path, capsys, monkeypatch):
    from kit.__main__ import main as cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli(["train", "--preset", "colab_t4", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--preset tiny_cpu" in err and "PRESET =" not in err and "KIT_SMOKE" not in err


# low: going back to a checkpoint names the dropped steps, and the live curve drops them --------------------------

def test_going_back_to_a_checkpoint_names_the_dropped_steps_and_the_live_curve_drops_them(tmp_path, monkeypatch):
    from kit import colab
    from kit.analysis import plots

    said, curves = [], []
    trainer = Trainer(cfg_for(tmp_path / "run"), log=said.append)  # checkpoints at steps 2 and 4
    real_update = trainer.update

    def update(levels):  # the stop lands in step 4's update: step 3 is logged after checkpoint 2
        if trainer.step == 3 and not curves:
            curves.append(None)
            raise KeyboardInterrupt
        return real_update(levels)

    monkeypatch.setattr(trainer, "update", update)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()

    class Curve(plots.LiveCurve):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            curves.append(self)

    monkeypatch.setattr(plots, "LiveCurve", Curve)
    colab.train_to_end(trainer, every=100)
    assert any("going back to the newest checkpoint (step 2)" in s and "(step 3) is dropped" in s for s in said), said
    assert [r["step"] for r in curves[-1].rows] == [1, 2, 3, 4]


# low: smoke mode in a new runtime; a real model on a CPU runtime ---------------------------------------------------

def test_smoke_mode_in_a_new_runtime_takes_the_smoke_run_from_drive_without_training_it(tmp_path, monkeypatch):
    import json

    from kit import colab

    monkeypatch.setenv("KIT_SMOKE", "1")
    monkeypatch.setenv("KIT_SMOKE_DIR", str(tmp_path / "new_runtime" / "smoke"))
    drive = tmp_path / "MyDrive"
    on_drive = drive / rundir.DRIVE_FOLDER / "_smoke" / "mine"  # where 01 in smoke mode mirrored it
    steps = colab.notebook_config("tiny_cpu", "code", {}, "mine", smoke=True, **QUIET).num_steps
    (on_drive / "ckpt" / f"step_{steps:06d}").mkdir(parents=True)
    (on_drive / "ckpt" / f"step_{steps:06d}" / "COMPLETE").write_text("")
    (on_drive / "config.json").write_text("{}")
    (on_drive / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(steps + 1)))
    said = []
    found = colab.run_to_analyse("mine", drive, log=said.append)
    assert found == tmp_path / "new_runtime" / "smoke"
    assert (found / "ckpt" / f"step_{steps:06d}" / "COMPLETE").exists()
    assert not any("training it now" in s for s in said), said


def test_the_analysis_notebooks_say_when_a_real_model_will_run_on_a_cpu(tmp_path, monkeypatch):
    import json

    from kit import colab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model_name": "Qwen/Qwen2.5-Coder-3B-Instruct"}))
    said = []
    colab.run_to_analyse("run", run_dir=run, log=said.append)
    assert any("no GPU" in s and "Qwen/Qwen2.5-Coder-3B-Instruct" in s for s in said), said
    (run / "config.json").write_text(json.dumps({"model_name": "tiny"}))
    said.clear()
    colab.run_to_analyse("run", run_dir=run, log=said.append)
    assert not any("no GPU" in s for s in said), said


def test_04_on_a_run_of_another_task_says_the_same_clear_error_in_every_cell(tmp_path):
    from kit.analysis import schemes

    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=1"), **QUIET)  # the toy task
    trainer.train()
    trainer.close()
    for cell in (schemes.scheme_shares, schemes.fresh_shares):
        with pytest.raises(ValueError, match="schemes apply to the code task"):
            cell(tmp_path / "run")


def test_05_without_widgets_shows_the_breakdown_as_a_table():
    from kit.analysis import explore

    row = {"step": 3, "item": "HumanEval/0", "parts": {"tests": 1.0}, "reward": 1.0, "advantages": [0.25, -0.5]}
    table = explore.breakdown_table(row)
    assert "step 3, item HumanEval/0" in table and "| tests | 1.000 |" in table and "| advantage[1] | -0.500 |" in table
