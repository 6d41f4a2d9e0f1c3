"""Colab and environment helpers: where we run, the GPU, Drive, secrets, and a run mirrored to Drive.

    in_colab(), smoke()             Colab? KIT_SMOKE=1 (the notebooks' CPU smoke mode, used by CI)
    gpu_summary()                   "NVIDIA A100-SXM4-40GB, 39.6 GiB" or a clear line on a CPU runtime
    mount_drive()                   mounts Google Drive once (only in Colab); None elsewhere
    secret("ANTHROPIC_API_KEY")     from the environment or Colab secrets; never printed
    Mirror(run_dir, mirror_dir)     copies checkpoints and logs to Drive after each save, in the background
    restore(mirror_dir, run_dir)    brings the newest complete checkpoint back after a disconnect
    notebook_config(...)            01_train's parameters cell as a validated TrainConfig (full mode needs a GPU)
    start_or_resume(cfg)            a Trainer for a new run, or for the newest one (restored from the mirror)
    train_to_end(trainer)           01's training cell: live curve, learning_curves.png, close (last Drive copy)
    run_to_analyse(run_name, drive) the run 02-05 look at: found by name on this disk or on Drive
    preset_smoke_test(preset)       00_setup's two-step PASS/FAIL check of a preset on its real model
    smoke_run()                     (KIT_SMOKE) a tiny two-step code-task run for the analysis notebooks

Why a mirror and not training straight on Drive: Drive is slow and can drop writes when a runtime dies. The
trainer writes each checkpoint locally (atomically), then the mirror copies it to Drive under a temporary name
and renames it only when the copy is whole, so a half-copied checkpoint never looks complete on Drive.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kit.rundir import DRIVE_FOLDER, LOCAL_ROOT

DRIVE_ROOT = "/content/drive"
_LOG_FILES = ("config.json", "metrics.jsonl", "rollouts.jsonl", "budget.json")


def in_colab() -> bool:
    try:
        import google.colab  # noqa: F401

        return True
    except ImportError:
        return False


def smoke() -> bool:
    """KIT_SMOKE=1: notebooks switch to the tiny CPU preset and a few steps (how CI runs them)."""
    return os.environ.get("KIT_SMOKE", "") not in ("", "0", "false", "False")


def gpu_summary() -> str:
    import torch

    if not torch.cuda.is_available():
        return ("no GPU: this runtime has only a CPU. In Colab choose Runtime > Change runtime type > GPU "
                "(A100 for the paper's recipe, T4 for colab_t4); the tiny_cpu preset still runs here")
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.1f} GiB"


def mount_drive(root: str = DRIVE_ROOT, log=print) -> Path | None:
    """Mount Google Drive once; outside Colab say so in one line and return None."""
    if not in_colab():
        log("[kit] not in Colab: no Drive, runs stay on this disk")
        return None
    mydrive = Path(root) / "MyDrive"
    if not mydrive.exists():
        from google.colab import drive

        drive.mount(root)
    return mydrive


def flush_drive(log=print) -> None:
    """Make sure everything written to Drive is uploaded (Colab only; unmounts Drive)."""
    if in_colab() and Path(DRIVE_ROOT, "MyDrive").exists():
        from google.colab import drive

        drive.flush_and_unmount()
        log("[kit] Drive flushed and unmounted")


def secret(name: str) -> str | None:
    """A secret from the environment or Colab's secrets panel, or None. The value is never printed or logged."""
    value = os.environ.get(name)
    if value:
        return value
    if in_colab():
        try:
            from google.colab import userdata

            return userdata.get(name)
        except Exception:  # not set, or notebook access not granted: the feature stays off
            return None
    return None


class Mirror:
    """Copy a run directory's logs and complete checkpoints to another folder (Drive) in a background thread."""

    def __init__(self, run_dir: str | Path, mirror_dir: str | Path, keep_last: int = 3, keep_history: int = 0,
                 log=print):
        self.run_dir, self.mirror_dir = Path(run_dir), Path(mirror_dir)
        self.keep_last, self.keep_history = keep_last, keep_history
        self.log = log
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kit-mirror")  # one copy at a time, in order
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    def push(self) -> Future:
        """Queue a copy of everything new; returns at once."""
        future = self._pool.submit(self._copy)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def flush(self) -> None:
        """Wait for queued copies; raise the first copy error so a failing Drive is not silent."""
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)

    def _copy(self) -> None:
        from kit.checkpoint import HISTORY, complete_checkpoints, thin_history

        self.mirror_dir.mkdir(parents=True, exist_ok=True)
        for name in _LOG_FILES:
            _copy_file(self.run_dir / name, self.mirror_dir / name)
        if (self.run_dir / "eval").is_dir():
            for f in (self.run_dir / "eval").iterdir():
                if f.is_file():
                    _copy_file(f, self.mirror_dir / "eval" / f.name)
        for ckpt in reversed(complete_checkpoints(self.run_dir)):  # oldest first
            _copy_tree(ckpt, self.mirror_dir / "ckpt" / ckpt.name)
        for kept in reversed(complete_checkpoints(self.run_dir, HISTORY)):
            _copy_tree(kept, self.mirror_dir / HISTORY / kept.name)
        for old in complete_checkpoints(self.mirror_dir)[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
        thin_history(self.mirror_dir, self.keep_history)


def _copy_file(src: Path, dst: Path) -> None:
    if not src.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a checkpoint folder under a temporary name, then rename: never a half checkpoint at `dst`."""
    if (dst / "COMPLETE").exists():
        return
    tmp = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def restore(mirror_dir: str | Path, run_dir: str | Path, log=print) -> int | None:
    """Bring a mirrored run back to `run_dir` (after a disconnect wiped the local disk). Returns the newest
    complete checkpoint step now in `run_dir`, or None when the mirror holds no run."""
    from kit.checkpoint import HISTORY, complete_checkpoints

    mirror_dir, run_dir = Path(mirror_dir), Path(run_dir)
    if not (mirror_dir / "config.json").exists():
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    def newest(path):
        found = complete_checkpoints(path)
        return int(found[0].name.split("_")[-1]) if found else -1

    remote = complete_checkpoints(mirror_dir)
    if remote and newest(mirror_dir) > newest(run_dir):  # the mirror is ahead: take its logs and checkpoints
        for name in _LOG_FILES:
            _copy_file(mirror_dir / name, run_dir / name)
        for ckpt in remote:
            _copy_tree(ckpt, run_dir / "ckpt" / ckpt.name)
        for kept in complete_checkpoints(mirror_dir, HISTORY):
            _copy_tree(kept, run_dir / HISTORY / kept.name)
        log(f"[kit] restored {run_dir} from {mirror_dir} ({remote[0].name})")
    elif not (run_dir / "config.json").exists():
        _copy_file(mirror_dir / "config.json", run_dir / "config.json")
    step = newest(run_dir)
    return step if step >= 0 else None


def start_or_resume(cfg, log=print, **trainer_kwargs):
    """A new run, or the existing one continued from its newest complete checkpoint (restored from
    `cfg.mirror_dir` first when the local copy is gone or behind). What "Run all" and the resume cell call."""
    from kit.config import check_resume
    from kit.trainer import Trainer

    for saved in (Path(cfg.run_dir) / "config.json", Path(cfg.mirror_dir or cfg.run_dir) / "config.json"):
        if saved.exists():  # a changed setting is refused before copying from Drive and loading the model
            check_resume(saved, cfg)
    if cfg.mirror_dir:
        restore(cfg.mirror_dir, cfg.run_dir, log=log)
    resume = (Path(cfg.run_dir) / "config.json").exists()
    if resume:
        log(f"[kit] continuing the run in {cfg.run_dir}")
    return Trainer(cfg, resume=resume, log=log, **trainer_kwargs)


def train_to_end(trainer, every: int = 5) -> dict:
    """01_train's training cell: train with a live reward curve (the whole run, resumes included), save
    eval/learning_curves.png, then close the trainer, whose last Drive copy takes the figure along."""
    from kit import plots

    summary = trainer.train(on_step=plots.LiveCurve(every, run_dir=trainer.run_dir))
    try:
        plots.learning_curves(trainer.run_dir, path=trainer.run_dir / "eval" / "learning_curves.png")
    finally:
        trainer.close()
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
    from kit.trainer import Trainer

    require_gpu(preset)
    overrides = ["num_steps=2", "save_every=0", "eval_every=0", "batch_size=1", "num_generations=2",
                 "log_rollouts=false", "progress=false"]
    if preset != "tiny_cpu":
        overrides.append("max_new_tokens=64")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cfg = load_config(preset, overrides=[f"run_dir={tmp}/smoke", *overrides])
            trainer = Trainer(cfg, log=log)
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


def require_gpu(preset: str) -> None:
    """Full mode on a CPU runtime would load a billion-parameter model in fp32 and crawl: stop with the way out."""
    import torch

    if preset != "tiny_cpu" and not torch.cuda.is_available():
        raise RuntimeError(f"preset {preset!r} needs a GPU and this runtime has none. In Colab: Runtime > Change "
                           "runtime type > GPU (A100 for colab_a100, T4 for colab_t4), then Run all again. To try "
                           "the kit on a CPU, set PRESET = 'tiny_cpu' (or KIT_SMOKE=1 for the smoke run).")


def notebook_config(preset: str, task: str, task_args: dict, run_name: str, drive: Path | None = None,
                    drive_folder: str = DRIVE_FOLDER, num_steps: int | None = None,
                    judge_model: str | None = None, judge_budget_usd: float = 15.0, smoke: bool = False, log=print):
    """01_train's parameters as a validated TrainConfig: the run on this disk, mirrored to Drive when mounted.
    `smoke` (KIT_SMOKE=1) swaps in the tiny CPU preset and a few steps of the code task, mirrored (if at all) to
    its own Drive folder `<drive_folder>/_smoke/<run_name>`, never the real run's. Full mode needs a GPU."""
    from kit.config import from_dict, load_config, validate

    folder = Path(drive) / drive_folder if drive else None
    values = {"task": task, "task_args": dict(task_args), "run_dir": f"{LOCAL_ROOT}/{run_name}",
              "mirror_dir": str(folder / run_name) if folder else None}
    if num_steps:
        values["num_steps"] = num_steps
    if judge_model:
        values.update(judge_model=judge_model, use_judge_reward=True, judge_budget_usd=judge_budget_usd)
    if smoke:
        preset = "tiny_cpu"
        values.update(task="code", task_args={"dataset": "coop"}, num_steps=3, batch_size=2, num_generations=2,
                      max_new_tokens=16, save_every=1, eval_every=2, num_eval_items=2, judge_model=None,
                      use_judge_reward=False, run_dir=os.environ.get("KIT_SMOKE_DIR", "checkpoints/smoke") + "_train",
                      mirror_dir=str(folder / "_smoke" / run_name) if folder else None)
    else:
        require_gpu(preset)
    cfg = validate(from_dict(values, load_config(preset)))
    if cfg.mirror_dir is None and not smoke:
        log("!" * 100 + "\n[kit] WARNING: Google Drive is not mounted, so NOTHING IS BACKED UP. Checkpoints stay on "
            "this runtime's disk and are lost when it disconnects.\n      Run the Drive cell (or "
            "colab.mount_drive()) before this one to mirror the run to Drive.\n" + "!" * 100)
    return cfg
