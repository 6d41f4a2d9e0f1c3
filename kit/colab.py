"""What the notebooks' cells call: one function per cell that does more than display.

    notebook_config(...)            01_train's parameters cell as a validated TrainConfig (full mode needs a GPU)
    start_or_resume(cfg)            a Trainer (GameTrainer for a game) for a new run or the newest one (from the mirror)
    train_to_end(trainer)           01's training cell: live curve, learning_curves.png, close (last Drive copy)
    run_to_analyse(run_name, drive) the run 02-05 and 07 look at: found by name on this disk or on Drive
    evaluate_missing(run_dir, n)    07's first cell: kit eval, kit baselines (at the eval's samples per item) and
                                    fresh schemes, each only when its results are missing
    report_to_drive(report, ...)    07's copy of RESULTS.md beside the run on Drive (smoke mode: under _smoke/)
    preset_smoke_test(preset)       00_setup's two-step PASS/FAIL check of a preset on its real model
    smoke_run()                     (KIT_SMOKE) the smoke run 01_train makes, for the analysis notebooks; trained
                                    here once when 01 has not made it

Smoke mode never touches a real run's folders: its run lives in $KIT_SMOKE_DIR (default checkpoints/smoke) and is
mirrored, and its report copied, only under `<DRIVE_FOLDER>/_smoke/` on Drive.
The environment helpers the cells use (smoke, gpu_summary, mount_drive, secret) come from
kit/env.py; the Drive mirror and restore from kit/run/mirror.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kit.env import (GPUNeeded, cpu_advice, drive_mounted, gpu_summary, in_colab,  # noqa: F401
                     mount_drive, require_gpu, secret, secret_status, smoke, unmounted_drive)
from kit.run.mirror import restore
from kit.run.rundir import DRIVE_FOLDER, dropped, runs_root


def start_or_resume(cfg, log=print, **trainer_kwargs):
    """A new run, or the existing one continued from its newest complete checkpoint (restored from
    `cfg.mirror_dir` first when the local copy is gone or behind). What "Run all" and the resume cell call."""
    from kit.run.config import check_resume
    from kit.trainers.game_trainer import trainer_class

    for saved in (Path(cfg.run_dir) / "config.json", Path(cfg.mirror_dir or cfg.run_dir) / "config.json"):
        if saved.exists():  # a changed setting is refused before copying from Drive and loading the model
            check_resume(saved, cfg)
    if cfg.mirror_dir:
        restore(cfg.mirror_dir, cfg.run_dir, log=log)
    resume = (Path(cfg.run_dir) / "config.json").exists()
    if resume:
        from kit.run.rundir import newest_step

        step = newest_step(cfg.run_dir)
        log(f"[kit] continuing the run in {cfg.run_dir} from its checkpoint at step {step}{dropped(cfg.run_dir, step)}"
            if step >= 0 else
            f"[kit] {cfg.run_dir} holds a run stopped before its first checkpoint: starting it again from step 0"
            f"{dropped(cfg.run_dir, step)}")
    return trainer_class(cfg.task, cfg.algorithm)(cfg, resume=resume, log=log, **trainer_kwargs)


def flush_drive(cfg=None, root: str | None = None, log=print) -> bool:
    """01's and 06's last cell: flush and unmount Drive (kit.env.flush_drive). With the run's `cfg` it first copies
    to Drive what its copy of the run lacks (files the cells wrote after training too), then checks that Drive holds
    this runtime's newest checkpoint and logs; when it does not (Drive still failing), Drive stays mounted and the
    line says why and which cell catches it up. True when Drive was flushed."""
    from kit import env
    from kit.run.mirror import behind

    if env.in_colab() and not env.drive_mounted(root):
        log("[kit] Drive is not mounted: nothing to flush, and the run's copy on Drive was not checked (the Drive "
            "cell, colab.mount_drive(), mounts it again)")
        return False
    if cfg is not None and getattr(cfg, "mirror_dir", None) and env.in_colab():
        from kit.run.mirror import Mirror

        last = Mirror(cfg.run_dir, cfg.mirror_dir, cfg.keep_last, cfg.keep_history, log=log, training=False)
        last.push()  # what Drive lacks, and what the cells wrote after training (02-06's eval/ results) ...
        last.close()  # ... copied first; a failed copy is said here
        try:
            gap = behind(cfg.run_dir, cfg.mirror_dir)
        except OSError as err:
            from kit.run.mirror import reason

            log(f"[kit] WARNING: Drive's copy of the run could not be read ({reason(err)}): not flushed. Run the Drive "
                "cell, then the training cell (it copies what Drive lacks), then this cell")
            return False
        if gap:
            log("!" * 100 + f"\n[kit] WARNING: Drive is NOT up to date: {gap}.\n      Run the training cell again "
                "(it copies what Drive lacks and says how it went), then this cell. Drive stays mounted.\n"
                + "!" * 100)
            return False
        return env.flush_drive(root, log, checked=f" The run's copy ({cfg.mirror_dir}) holds this runtime's "
                                                  "newest checkpoint and logs (checked).")
    return env.flush_drive(root, log)


def train_to_end(trainer, every: int = 5) -> dict:
    """01_train's training cell: train with a live reward curve (the whole run, resumes included), save
    eval/learning_curves.png, then close the trainer, whose last Drive copy takes the figure along. The summary
    says where the last good Drive backup is (a failed one is warned about, never raised). Run again after the
    end, it only says that the run is complete."""
    from kit.analysis import plots

    summary = trainer.train(on_step=plots.LiveCurve(every, run_dir=trainer.run_dir, last=trainer.cfg.num_steps))
    try:
        plots.learning_curves(trainer.run_dir, path=trainer.run_dir / "eval" / "learning_curves.png")
    finally:
        trainer.close()
    if trainer.mirror is not None:
        summary["backup"] = trainer.mirror.status()
    return summary


def run_to_analyse(run_name: str, drive: Path | None = None, drive_folder: str = DRIVE_FOLDER,
                   run_dir: str | Path | None = None, log=print, samples: bool = True) -> Path:
    """The run that 02-05 look at: `run_dir` when given; in smoke mode the tiny smoke run; otherwise the run
    01_train made under the same RUN_NAME, on this disk or on Drive (a new runtime only has the Drive copy).
    `samples=False` (04, 05: they read the run's files; a cell that samples says its own estimate): no word on how
    long a real model's evaluations take on a CPU."""
    from kit.run.rundir import find_run

    if run_dir:
        found = Path(run_dir)
    elif smoke():
        found = smoke_run(run_name, drive, drive_folder, log=log)
    else:
        found = find_run(run_name, drive, drive_folder)
    if not (found / "config.json").exists():
        raise FileNotFoundError(f"{found} is not a run folder (no config.json)")
    log(f"[kit] run: {found}")
    model = json.loads((found / "config.json").read_text()).get("model_name", "tiny")
    if samples and model != "tiny" and not _has_gpu():  # said before a cell spends many minutes on a CPU
        if trained_on_cpu(found):  # a CPU preset's run: here is where it belongs (a GPU would load its fp32
            log(f"[kit] {model} runs on this CPU as it trained (dtype=auto: bf16 where the CPU computes it, else "
                "fp32): each evaluation takes minutes; "
                "the cells below say about how long before they start and show a bar")  # adapters on 4 bits)
        else:
            log(f"[kit] this runtime has no GPU: {model} will run on the CPU (bf16 or fp32), which is slow "
                "(minutes per evaluation). In Colab: Runtime > Change runtime type > GPU, then Run all again")
    return found


def trained_on_cpu(run_dir: str | Path) -> bool:
    """Whether a run trained on a CPU: its environment.json says no GPU; before one exists, its nearest preset is a
    CPU preset (smol_*, coder_*, tiny_cpu)."""
    from kit.analysis.runinfo import ENVIRONMENT, json_or_none, nearest_preset
    from kit.env import CPU_PRESET_PREFIXES

    env = json_or_none(Path(run_dir) / ENVIRONMENT)
    if env is not None:
        return not env.get("gpu")
    config = json_or_none(Path(run_dir) / "config.json") or {}
    return nearest_preset(config)[0].startswith(CPU_PRESET_PREFIXES)


def samples_per_item(run_dir: str | Path, smoke_n: int = 2) -> int:
    """The analysis notebooks' default N (samples per agent per item): smoke_n in smoke mode; 10 (pass@1..10) on a
    GPU or for the tiny model; 4 (pass@1 and pass@3) for a real model on a CPU, where one sample of every held-out
    item costs about a minute."""
    if smoke():
        return smoke_n
    model = (json.loads((Path(run_dir) / "config.json").read_text()).get("model_name", "tiny")
             if (Path(run_dir) / "config.json").exists() else "tiny")
    return 10 if model == "tiny" or _has_gpu() else 4


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def preset_smoke_test(preset: str, log=print) -> str:
    """00_setup's check: two training steps of `preset` on its real model in a throw-away folder.
    Returns the PASS line, or the FAIL line when the preset needs a GPU this runtime lacks (said once, no
    traceback); when training fails, raises after a FAIL line, since the traceback is then the diagnosis."""
    import tempfile

    from kit.run.config import load_config
    from kit.trainers.game_trainer import trainer_class

    try:
        require_gpu(preset)
    except GPUNeeded as err:  # said once, as a line: a traceback would say it again, and nothing is broken
        line = f"FAIL: {err}"
        log(line)
        return line
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


def smoke_dir() -> Path:
    """Where smoke mode's run lives: $KIT_SMOKE_DIR, or checkpoints/smoke."""
    return Path(os.environ.get("KIT_SMOKE_DIR", runs_root() / "smoke")).absolute()


def smoke_run(run_name: str = "magrpo_code", drive: Path | None = None, drive_folder: str = DRIVE_FOLDER,
              log=print) -> Path:
    """The run 01_train makes in smoke mode (notebook_config(..., smoke=True)), which 02-05 and 07 analyse in smoke
    mode. When 01 has not made it (or not to its end), it is trained here once, the same way (continued from
    its Drive copy under _smoke/ when there is one)."""
    from kit.run.rundir import newest_step

    cfg = notebook_config("tiny_cpu", "code", {"dataset": "coop"}, run_name, drive, drive_folder, smoke=True, log=log)
    if cfg.mirror_dir and newest_step(cfg.run_dir) < cfg.num_steps:  # a new runtime: Drive may hold it whole
        restore(cfg.mirror_dir, cfg.run_dir, log=log)
    if newest_step(cfg.run_dir) < cfg.num_steps:
        log(f"[kit] smoke mode: 01_train's smoke run ({cfg.run_dir}) is not there or not finished; training it now")
        trainer = start_or_resume(cfg, log=log)
        try:
            trainer.train()
        finally:
            trainer.close()
    return Path(cfg.run_dir)


def evaluate_missing(run_dir: str | Path, n: int, steps: str = "all", log=print) -> None:
    """What 07_report runs before the report: whatever is missing or older than the run's newest checkpoint. The
    held-out evaluation of every checkpoint (`steps="all"`; "newest": that one) that has no result yet; the baselines
    (Table 1) when there are none or their trained team is an older checkpoint than the newest; the code task's
    schemes on fresh samples when older than the newest checkpoint. A report made while the run trained is so caught
    up, and each part says what it adds. Table 1 samples as many completions per item as the held-out evaluation did,
    so its magrpo row is the same sampling as that section's row of the same checkpoint and the two tables agree."""
    from kit.analysis.evaluate import evaluate_run, load_eval_rows
    from kit.analysis.report import save_fresh_shares
    from kit.analysis.runinfo import json_or_none, read_run
    from kit.run.checkpoint import saved_steps

    eval_dir = Path(run_dir) / "eval"
    have = saved_steps(run_dir)
    newest = max(have) if have else None
    done = {int(p.stem.split("_")[1]) for p in eval_dir.glob("step_*.json") if p.stem.split("_")[1].isdigit()}
    wanted = [0, *sorted(have)] if steps == "all" else ([newest] if newest is not None else [0])
    missing = [s for s in wanted if s not in done]
    if missing:
        if done:
            log(f"[kit] held-out results exist for steps {sorted(done)}; evaluating the checkpoints they lack: "
                f"{missing}")
        evaluate_run(run_dir, missing, n=n, log=log)
    table = json_or_none(eval_dir / "baselines.json")
    team = next((r.get("step") for r in table or [] if r.get("method") == "magrpo"), None)
    if table is None or (newest is not None and team != newest):
        if table is not None:
            log(f"[kit] Table 1's trained team is step {team}, the run's newest checkpoint is {newest}: made again")
        from kit.analysis.baselines import compare

        rows = load_eval_rows(run_dir)
        same_n = rows[-1].get("num_samples", n) if rows else n
        if same_n != n:
            log(f"[kit] baselines at {same_n} samples per item, as the held-out evaluation (not {n}), so that "
                "Table 1 and the held-out section agree")
        compare(run_dir, ["naive"] if smoke() else None, n=same_n, log=log)
    fresh = eval_dir / "schemes_fresh.json"
    stale = newest is not None and fresh.exists() and fresh.stat().st_mtime < have[newest].stat().st_mtime
    if read_run(run_dir)["config"].get("task") == "code" and (not fresh.exists() or stale):
        if stale:
            log(f"[kit] the cooperation schemes on fresh samples are older than checkpoint {newest}: sampled again")
        save_fresh_shares(run_dir, n=n, log=log)  # cooperation schemes on fresh samples from the newest checkpoint


def report_to_drive(report: str | Path, run_dir: str | Path, drive: Path | None, drive_folder: str = DRIVE_FOLDER,
                    run_name: str | None = None, log=print) -> Path | None:
    """07's copy of a report folder (RESULTS.md and figures) beside the run on Drive, `<drive_folder>/<run>/report`
    (the mirror copies checkpoints and logs, not the report). In smoke mode it goes under `<drive_folder>/_smoke/
    <run_name>/`, where 01 mirrors the smoke run: never into a real run's folder. None without Drive."""
    if drive is None:
        return None
    folder = Path(drive) / drive_folder
    target = (folder / "_smoke" / (run_name or Path(run_dir).name) if smoke() else folder / Path(run_dir).name)
    target = target / "report"
    source = Path(report).parent
    if source.resolve() != target.resolve():
        shutil.copytree(source, target, dirs_exist_ok=True)
    log(f"report on Drive: {target}")
    return target


def cpu_cost(preset: str, cfg) -> str:
    """What a CPU run of this config will cost: the kit's measured minutes a step for the preset
    (kit.run.presets.CPU_MINUTES_PER_STEP), and this run's own median once it has logged steps."""
    from kit.run.presets import CPU_MINUTES_PER_STEP
    from kit.run.rundir import read_jsonl

    per_step = CPU_MINUTES_PER_STEP.get(preset)
    line = f"[kit] on a CPU: {cfg.num_steps} steps of {preset}"
    if per_step is not None:
        line += (f", about {per_step:g} minutes a step on 2 cores (the kit's measurement): about "
                 f"{per_step * cfg.num_steps:.0f} minutes of training, plus the held-out evaluations")
    else:
        line += ": no CPU measurement of this preset; the training cell shows the speed after its first step"
    metrics = Path(cfg.run_dir) / "metrics.jsonl"
    own = sorted(r["perf/step_s"] for r in (read_jsonl(metrics) if metrics.exists() else []) if "perf/step_s" in r)
    if own:
        line += f". This run's own steps: {own[len(own) // 2] / 60:.1f} minutes (median of {len(own)})"
    return line


def check_task_fits(cfg, preset: str, replaced: dict) -> None:
    """The task built from the config (no model, no data loaded): a task and task_args that do not fit each other,
    or a file that is not there, stop the config cell with what to set."""
    from kit.tasks import task_for

    try:
        task_for(cfg)
    except (ValueError, TypeError, OSError) as err:
        set_here = ", ".join(k.upper() for k in replaced) or "nothing"
        raise ValueError(f"this run cannot start: {err}\n      The parameters cell set {set_here} over preset "
                         f"{preset!r} (task {cfg.task!r}, task_args {cfg.task_args}). Set TASK_ARGS to what task "
                         f"{cfg.task!r} takes, or leave TASK, TASK_ARGS and ENVIRONMENT at None for the preset's own."
                         ) from None


def run_plan(cfg, preset: str, changed: dict) -> str:
    """One paragraph: what the run will do (model, task, data, environment, algorithm, steps) and which preset
    settings the parameters cell replaced."""
    data = cfg.task_args or "the task's defaults"
    lines = [f"[kit] the run: preset {preset!r}, model {cfg.model_name}, task {cfg.task!r} on {data}, "
             f"environment {cfg.environment or 'none'}, algorithm {cfg.algorithm}, {cfg.num_steps} steps"]
    if changed:
        lines.append("      replaced in the parameters cell: " + "; ".join(
            f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items()))
    else:
        lines.append("      every setting is the preset's")
    return "\n".join(lines)


def tiny_learns(cfg) -> bool:
    """Can the run's model learn its task: any real model, or the built-in tiny one on its toy task or the small
    tiny_hanabi game (the two it is tuned for, README: The tiny model)."""
    if cfg.model_name != "tiny":
        return True
    return cfg.task == "toy" or (cfg.task == "game" and cfg.task_args.get("game") == "tiny_hanabi")


def notebook_config(preset: str, task: str | None = None, task_args: dict | None = None, run_name: str = "run",
                    drive: Path | None = None, drive_folder: str = DRIVE_FOLDER, num_steps: int | None = None,
                    judge_model: str | None = None, judge_budget_usd: float = 15.0, smoke: bool = False, log=print,
                    save_every: int | None = None, algorithm: str | None = None, environment=None):
    """01_train's parameters as a validated TrainConfig: the run on this disk, mirrored to Drive when mounted.
    A parameter left None is the preset's (task, task_args, algorithm, environment, num_steps, save_every); one that
    is set replaces it, and the line this prints says which did. A task and task_args that do not fit each other are
    refused here, before any model loads. `smoke` (KIT_SMOKE=1) swaps in the tiny CPU preset and a few steps of the
    code task (a game task: the same game, 6 decisions per episode), mirrored (if at all) to its own Drive folder
    `<drive_folder>/_smoke/<run_name>`, never the real run's. Full mode needs a GPU, or a CPU preset."""
    from kit.run.config import from_dict, load_config, validate

    folder = Path(drive) / drive_folder if drive else None
    base = load_config(preset)
    values = {"run_dir": str(runs_root() / run_name), "mirror_dir": str(folder / run_name) if folder else None}
    given = {"task": task, "task_args": None if task_args is None else dict(task_args),
             "algorithm": algorithm,  # magrpo, iac, maac, centralized (README: Algorithms)
             "environment": environment}  # a TRL-style class the agents act on (README: Teams that act)
    replaced = {k: v for k, v in given.items() if v is not None}
    if "task" in replaced and replaced["task"] != base.task and "task_args" not in replaced:
        replaced["task_args"] = {}  # another task than the preset's: its own defaults, not the preset's task's args
    values.update(replaced)
    task = values.get("task", base.task)
    task_args = values.get("task_args", base.task_args)
    if num_steps:
        values["num_steps"] = num_steps
    if save_every is not None:  # 0: only the last step
        values["save_every"] = save_every
    if judge_model:
        values.update(judge_model=judge_model, use_judge_reward=True, judge_budget_usd=judge_budget_usd)
    if smoke:
        preset = "tiny_cpu"
        base = load_config(preset)
        values.update(task="code", task_args={"dataset": "coop"}, num_steps=3, batch_size=2, num_generations=2,
                      max_new_tokens=16, save_every=1, eval_every=2, num_eval_items=2, judge_model=None,
                      use_judge_reward=False, run_dir=str(smoke_dir()),  # smoke_run(): 02-05 and 07 analyse it
                      mirror_dir=str(folder / "_smoke" / run_name) if folder else None)
        if task == "game":  # the same game on the tiny model: its compact prompt, short episodes
            values.update(task="game", max_new_tokens=3, run_dir=values["run_dir"] + "_game",
                          task_args={"game": task_args.get("game", "tiny_hanabi"), "prompt_style": "compact",
                                     "max_decisions": 6})
    else:
        require_gpu(preset, task)
    cfg = validate(from_dict(values, base))
    if not smoke:
        check_task_fits(cfg, preset, replaced)
        asked = [*replaced, *(["num_steps"] if num_steps else []), *(["save_every"] if save_every is not None else [])]
        log(run_plan(cfg, preset, {k: (getattr(base, k), getattr(cfg, k)) for k in asked
                                   if getattr(base, k) != getattr(cfg, k)}))
    if not smoke and not _has_gpu() and cfg.model_name != "tiny":
        log(cpu_cost(preset, cfg))
    if not smoke and not tiny_learns(cfg):  # said before training, not after 30 minutes at reward 0
        on_cpu = {"code": "PRESET = 'coder_code' (Qwen2.5-Coder-0.5B, 2-3 min a step)",
                  "writing": "PRESET = 'smol_writing' (SmolLM2-135M, about a minute a step)"}.get(cfg.task)
        real = ("a GPU runtime (PRESET = 'colab_hanabi')" if cfg.task == "game" else
                "a GPU runtime (PRESET = 'colab_t4' or 'colab_a100')" + (f", or on a CPU {on_cpu}" if on_cpu else ""))
        log("!" * 100 + f"\n[kit] WARNING: the built-in tiny model ({preset}) cannot learn task {cfg.task!r} "
            f"{cfg.task_args}: it has never read text. What it can learn there is the answer's shape (a code "
            "task's structure part: a reward from 0.1 to about 0.6 in a short run); what it cannot is the content "
            "(no test passes, no summary reads well), however long it trains.\n      "
            f"{cpu_advice(cfg.task)}; this task needs a real model: {real}.\n" + "!" * 100)
    if cfg.mirror_dir and unmounted_drive(cfg.mirror_dir):  # e.g. 01's last cell unmounted it, then more training
        log("!" * 100 + f"\n[kit] WARNING: Google Drive is NOT MOUNTED ({Path(drive).parent} is not a mount point; "
            "01's last cell unmounts it), so nothing is backed up and the run on Drive is not read.\n      Run the "
            "Drive cell (colab.mount_drive()) again, then this cell.\n" + "!" * 100)
    if cfg.mirror_dir is None and not smoke:
        log("!" * 100 + "\n[kit] WARNING: Google Drive is not mounted, so NOTHING IS BACKED UP. Checkpoints stay on "
            "this runtime's disk and are lost when it disconnects.\n      Run the Drive cell (or "
            "colab.mount_drive()) before this one to mirror the run to Drive.\n" + "!" * 100)
    return cfg
