"""What the notebooks' cells call: one function per cell that does more than display.

    notebook_config(...)            01_train's parameters cell as a validated TrainConfig (full mode needs a GPU)
    start_or_resume(cfg)            a Trainer (GameTrainer for a game) for a new run or the newest one (from the mirror)
    train_to_end(trainer)           01's training cell: live curve, learning_curves.png, close (last Drive copy)
    run_to_analyse(run_name, drive) the run 02-05 look at: found by name on this disk or on Drive
    preset_smoke_test(preset)       00_setup's two-step PASS/FAIL check of a preset on its real model
    smoke_run()                     (KIT_SMOKE) a tiny two-step code-task run for the analysis notebooks
The environment helpers the cells use (smoke, gpu_summary, mount_drive, flush_drive, secret) come from
kit/env.py; the Drive mirror and restore from kit/rundir.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kit.env import (flush_drive, gpu_summary, in_colab, mount_drive, require_gpu, secret, secret_status,  # noqa: F401
                     smoke)
from kit.rundir import DRIVE_FOLDER, LOCAL_ROOT, restore


def start_or_resume(cfg, log=print, **trainer_kwargs):
    """A new run, or the existing one continued from its newest complete checkpoint (restored from
    `cfg.mirror_dir` first when the local copy is gone or behind). What "Run all" and the resume cell call."""
    from kit.config import check_resume
    from kit.game_trainer import trainer_class

    for saved in (Path(cfg.run_dir) / "config.json", Path(cfg.mirror_dir or cfg.run_dir) / "config.json"):
        if saved.exists():  # a changed setting is refused before copying from Drive and loading the model
            check_resume(saved, cfg)
    if cfg.mirror_dir:
        restore(cfg.mirror_dir, cfg.run_dir, log=log)
    resume = (Path(cfg.run_dir) / "config.json").exists()
    if resume:
        from kit.rundir import newest_step

        step = newest_step(cfg.run_dir)
        log(f"[kit] continuing the run in {cfg.run_dir} from its checkpoint at step {step}" if step >= 0 else
            f"[kit] {cfg.run_dir} holds a run stopped before its first checkpoint: starting it again from step 0")
    return trainer_class(cfg.task, cfg.algorithm)(cfg, resume=resume, log=log, **trainer_kwargs)


def train_to_end(trainer, every: int = 5) -> dict:
    """01_train's training cell: train with a live reward curve (the whole run, resumes included), save
    eval/learning_curves.png, then close the trainer, whose last Drive copy takes the figure along. The summary
    says where the last good Drive backup is (a failed one is warned about, never raised). Run again after the
    end, it only says that the run is complete."""
    from kit import plots

    summary = trainer.train(on_step=plots.LiveCurve(every, run_dir=trainer.run_dir))
    try:
        plots.learning_curves(trainer.run_dir, path=trainer.run_dir / "eval" / "learning_curves.png")
    finally:
        trainer.close()
    if trainer.mirror is not None:
        summary["backup"] = trainer.mirror.status()
    return summary


def run_to_analyse(run_name: str, drive: Path | None = None, drive_folder: str = DRIVE_FOLDER,
                   run_dir: str | Path | None = None, log=print) -> Path:
    """The run that 02-05 look at: `run_dir` when given; in smoke mode the tiny smoke run; otherwise the run
    01_train made under the same RUN_NAME, on this disk or on Drive (a new runtime only has the Drive copy)."""
    from kit.rundir import find_run

    if run_dir:
        found = Path(run_dir)
    elif smoke():
        found = smoke_run(log=log)
    else:
        found = find_run(run_name, drive, drive_folder)
    if not (found / "config.json").exists():
        raise FileNotFoundError(f"{found} is not a run folder (no config.json)")
    log(f"[kit] run: {found}")
    return found


def preset_smoke_test(preset: str, log=print) -> str:
    """00_setup's check: two training steps of `preset` on its real model in a throw-away folder.
    Returns the PASS line; raises (after a FAIL line) with the error."""
    import tempfile

    from kit.config import load_config
    from kit.game_trainer import trainer_class

    try:
        require_gpu(preset)
    except RuntimeError as err:
        log(f"FAIL: {err}")
        raise
    overrides = ["num_steps=2", "save_every=0", "eval_every=0", "batch_size=1", "num_generations=2",
                 "log_rollouts=false", "progress=false"]
    if load_config(preset).max_new_tokens > 64:
        overrides.append("max_new_tokens=64")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg = load_config(preset, overrides=[f"run_dir={tmp}/smoke", *overrides])
            trainer = trainer_class(cfg.task, cfg.algorithm)(cfg, log=log)
            try:
                summary = trainer.train()
            finally:
                trainer.close()
        except Exception:
            log(f"FAIL: {preset} could not train; the error follows")
            raise
    line = f"PASS: {preset} trained {summary['steps']} steps on {cfg.model_name}"
    log(line)
    return line


def smoke_run(log=print) -> Path:
    """A tiny CPU run on the code task (2 steps) for the notebooks' smoke mode; made once, then reused.
    Its folder is $KIT_SMOKE_DIR or checkpoints/smoke."""
    from kit.checkpoint import complete_checkpoints
    from kit.config import load_config

    run_dir = Path(os.environ.get("KIT_SMOKE_DIR", "checkpoints/smoke"))
    if complete_checkpoints(run_dir):
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={run_dir}", "task=code", "task_args={dataset: coop}", "num_steps=2", "batch_size=2",
        "num_generations=2", "max_new_tokens=16", "save_every=1", "eval_every=1", "num_eval_items=2",
        "progress=false"])
    trainer = start_or_resume(cfg, log=log)
    trainer.train()
    trainer.close()
    return run_dir


def notebook_config(preset: str, task: str, task_args: dict, run_name: str, drive: Path | None = None,
                    drive_folder: str = DRIVE_FOLDER, num_steps: int | None = None,
                    judge_model: str | None = None, judge_budget_usd: float = 15.0, smoke: bool = False, log=print,
                    save_every: int | None = None, algorithm: str = "magrpo"):
    """01_train's parameters as a validated TrainConfig: the run on this disk, mirrored to Drive when mounted.
    `smoke` (KIT_SMOKE=1) swaps in the tiny CPU preset and a few steps of the code task (a game task: the same
    game, 6 decisions per episode), mirrored (if at all) to its own Drive folder `<drive_folder>/_smoke/<run_name>`,
    never the real run's. Full mode needs a GPU."""
    from kit.config import from_dict, load_config, validate

    folder = Path(drive) / drive_folder if drive else None
    values = {"task": task, "task_args": dict(task_args), "run_dir": f"{LOCAL_ROOT}/{run_name}",
              "mirror_dir": str(folder / run_name) if folder else None,
              "algorithm": algorithm}  # magrpo, iac, maac, centralized (README: Algorithms)
    if num_steps:
        values["num_steps"] = num_steps
    if save_every is not None:  # 0: only the last step
        values["save_every"] = save_every
    if judge_model:
        values.update(judge_model=judge_model, use_judge_reward=True, judge_budget_usd=judge_budget_usd)
    if smoke:
        preset = "tiny_cpu"
        values.update(task="code", task_args={"dataset": "coop"}, num_steps=3, batch_size=2, num_generations=2,
                      max_new_tokens=16, save_every=1, eval_every=2, num_eval_items=2, judge_model=None,
                      use_judge_reward=False, run_dir=os.environ.get("KIT_SMOKE_DIR", "checkpoints/smoke") + "_train",
                      mirror_dir=str(folder / "_smoke" / run_name) if folder else None)
        if task == "game":  # the same game on the tiny model: its compact prompt, short episodes
            values.update(task="game", max_new_tokens=3, run_dir=values["run_dir"] + "_game",
                          task_args={"game": task_args.get("game", "tiny_hanabi"), "prompt_style": "compact",
                                     "max_decisions": 6})
    else:
        require_gpu(preset)
    cfg = validate(from_dict(values, load_config(preset)))
    if cfg.mirror_dir is None and not smoke:
        log("!" * 100 + "\n[kit] WARNING: Google Drive is not mounted, so NOTHING IS BACKED UP. Checkpoints stay on "
            "this runtime's disk and are lost when it disconnects.\n      Run the Drive cell (or "
            "colab.mount_drive()) before this one to mirror the run to Drive.\n" + "!" * 100)
    return cfg
