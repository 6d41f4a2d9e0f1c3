"""Checkpoints: atomic save, keep the last K, find and load the newest complete one.

Layout of `<run_dir>/ckpt/step_000100/`:

    adapters/<adapter>/      PEFT format (adapter_config.json + adapter_model.safetensors); load it with
                             PeftModel.from_pretrained(base, ".../adapters/agent_0")
    optim.pt                 per adapter: AdamW and LR-scheduler state
    models/<name>/           an algorithm's extra models (a critic, a reward model: kit/engine/heads.py), each its
                             PEFT adapter and head.safetensors; their optimizers and schedulers are in optim.pt
    rng.pt                   python, numpy and torch RNG states
    state.json               step, data-order state, anything else the trainer needs
    preferences.pt           MADPO/MARLHF: the pair buffer of every process (kit/trainers/preference_trainer.py)
    COMPLETE                 written last; a folder without it is never loaded

A checkpoint is written to `.tmp_step_...` and renamed when complete, so a crash mid-save leaves the previous
one intact.

Adapter history: a checkpoint pruned by `keep_last` is not deleted outright; its adapters and state.json move to
`<run_dir>/history/step_NNNNNN/` (the optimizer state, twice the adapters' size, is dropped). The history is
thinned to at most `keep_history` steps spread over the whole run (multiples of an interval that doubles as the
run grows), so evaluating "every checkpoint" shows the whole run, not only its end.

A folder that has COMPLETE but fails to load (a truncated file on a flaky Drive) is skipped with a
warning and the next older one is tried. The RNG state is the exception: one that cannot be restored (saved on a
machine with more GPUs, damaged) is only warned about, since every training step reseeds from (seed, step).
When EVERY complete checkpoint fails to load, resuming stops with `DamagedCheckpoints`, naming each one and why:
restarting from step 0 would cut the logs back and overwrite the checkpoints, losing the run. Starting over is
then an explicit choice (`--from-scratch`, `from_scratch=True`), and `set_aside` keeps the old files.
`check_resumable` reads the files alone (no model) so the trainer can say this before any model loads; it also
stops a run whose ckpt/ lost every complete checkpoint while history/ still holds some (pruning never does that).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

STEP_RE = re.compile(r"^step_(\d{6,})$")
HISTORY = "history"
EXTRA_FILES = ("preferences.pt",)  # `save(files=...)` names that resume needs and evaluation does not


def ckpt_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "ckpt"


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def step_seed(seed: int, step: int) -> int:
    """The seed of training step `step`: every step reseeds from (seed, step), so a resumed run repeats it."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**31 - 1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """python, numpy and torch RNG states, and one CUDA state per visible GPU (none without CUDA)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        # saved on a machine with more GPUs: only the devices that exist here have a state to take
        torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])


def restore_rng(path: Path) -> None:
    """Restore the RNG states saved in `path`, or warn and go on: the trainer reseeds python, numpy and torch from
    (seed, step) at every step, so a damaged or foreign RNG state must never cost a checkpoint its steps."""
    try:
        set_rng_state(torch.load(path, map_location="cpu", weights_only=False))
    except Exception as err:
        warnings.warn(f"RNG state {path} not restored ({type(err).__name__}: {err}); the run still continues "
                      "exactly: every step reseeds from (seed, step)", stacklevel=2)


def save(run_dir: str | Path, step: int, team, optimizers: dict, schedulers: dict, state: dict,
         keep_last: int = 3, keep_history: int = 0, models: dict | None = None, files: dict | None = None) -> Path:
    """Write checkpoint `step` atomically and prune to the newest `keep_last` (older ones' adapters go to the
    thinned history of `keep_history` steps). Returns its folder. `models`: an algorithm's extra models by name
    (kit/engine/heads.py ScalarModel); `optimizers` / `schedulers` hold the agents' adapters and those models' alike.
    `files`: more state by file name (torch.save), e.g. MADPO's pair buffer; the history drops them with the
    optimizer state."""
    root = ckpt_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp, final = root / f".tmp_{step_name(step)}", root / step_name(step)
    if "default" in team.adapters:  # PEFT writes the default adapter at the top, others in a subfolder
        raise ValueError("adapter name 'default' is reserved; name adapters agent_i or shared")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "adapters").mkdir(parents=True)
    for adapter in team.adapters:
        team.model_of(team.agents_of_adapter(adapter)[0]).save_pretrained(tmp / "adapters", selected_adapters=[adapter])
    for model in (models or {}).values():
        model.save(tmp / "models")
    torch.save({a: {"optimizer": optimizers[a].state_dict(), "scheduler": schedulers[a].state_dict()}
                for a in optimizers}, tmp / "optim.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    for name, obj in (files or {}).items():
        torch.save(obj, tmp / name)
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2))
    with open(tmp / "COMPLETE", "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    prune(run_dir, keep_last, keep_history)
    return final


def complete_checkpoints(run_dir: str | Path, folder: str = "ckpt") -> list[Path]:
    """Complete checkpoint folders (under ckpt/, or `folder`="history"), newest first."""
    root = Path(run_dir) / folder
    if not root.exists():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    complete = []
    for _, p in sorted(found, reverse=True):
        if (p / "COMPLETE").exists():
            complete.append(p)
        else:
            warnings.warn(f"skipping incomplete checkpoint {p} (no COMPLETE marker)", stacklevel=2)
    return complete


def prune(run_dir: str | Path, keep_last: int, keep_history: int = 0) -> None:
    """Keep the newest `keep_last` checkpoints; move the adapters of older ones to the thinned history.

    Every change is one rename seen from outside: a checkpoint leaves ckpt/ whole (to a hidden name, where its
    optimizer state is dropped) and enters history/ whole, and a deleted one is renamed away before its files go.
    The Drive mirror reads these folders from another thread: it sees a folder whole or not at all, so a folder
    that vanished under it was superseded, never half-deleted (kit/run/mirror.py)."""
    for p in complete_checkpoints(run_dir)[keep_last:]:
        if keep_history > 0:
            history = Path(run_dir) / HISTORY
            history.mkdir(exist_ok=True)
            moving = history / f".tmp_{p.name}"
            shutil.rmtree(moving, ignore_errors=True)
            os.replace(p, moving)
            for name in ("optim.pt", "rng.pt", *EXTRA_FILES):
                (moving / name).unlink(missing_ok=True)
            remove(history / p.name)
            os.replace(moving, history / p.name)
        else:
            remove(p)
    thin_history(run_dir, keep_history)


def remove(path: Path) -> None:
    """Delete a checkpoint folder: renamed to a hidden name first, so it vanishes from its place at once."""
    if not path.exists():
        return
    gone = path.with_name(f".deleting_{path.name}")
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def thinned(steps: list[int], keep: int) -> set[int]:
    """At most `keep` of `steps`, evenly spread: the multiples of the smallest interval (the steps' gcd times a
    power of two) that leaves no more than `keep`. Stable: a step dropped once is never wanted back."""
    steps = sorted(set(steps))
    if keep <= 0 or not steps:
        return set()
    interval = math.gcd(*steps) or 1
    while len([s for s in steps if s % interval == 0]) > keep:
        interval *= 2
    return {s for s in steps if s % interval == 0}


def thin_history(run_dir: str | Path, keep_history: int) -> None:
    history = {int(p.name.split("_")[-1]): p for p in complete_checkpoints(run_dir, HISTORY)}
    wanted = thinned(list(history), keep_history)
    for step, p in history.items():
        if step not in wanted:
            remove(p)


def saved_steps(run_dir: str | Path) -> dict[int, Path]:
    """Every step whose adapters a run directory holds: full checkpoints and the adapter history, oldest first."""
    found = {int(p.name.split("_")[-1]): p for p in complete_checkpoints(run_dir, HISTORY)}
    found.update({int(p.name.split("_")[-1]): p for p in complete_checkpoints(run_dir)})
    return dict(sorted(found.items()))


def load_into(path: Path, team, optimizers: dict, schedulers: dict, models: dict | None = None) -> dict:
    """Load adapters, extra models, optimizers, schedulers and RNG state from `path`; returns state.json. The RNG
    state is the only part that may fail without failing the load (restore_rng)."""
    state = json.loads((path / "state.json").read_text())
    optim = torch.load(path / "optim.pt", map_location="cpu", weights_only=False)  # the step moves it
    load_adapters(path, team)
    for model in (models or {}).values():
        model.load(path / "models")
    for adapter in optimizers:
        optimizers[adapter].load_state_dict(optim[adapter]["optimizer"])
        schedulers[adapter].load_state_dict(optim[adapter]["scheduler"])
    restore_rng(path / "rng.pt")
    return state


def load_adapters(path: Path, team) -> int:
    """Load only the adapters' weights from a checkpoint (for evaluation); returns its step."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(path)
    for adapter in team.adapters:
        model = team.model_of(team.agents_of_adapter(adapter)[0])
        weights = load_file(str(path / "adapters" / adapter / "adapter_model.safetensors"),
                            device=str(next(model.parameters()).device))
        result = set_peft_model_state_dict(model, weights, adapter_name=adapter)
        missing = [k for k in result.missing_keys if "lora_" in k and f".{adapter}." in k]
        if missing:
            raise ValueError(f"checkpoint {path} lacks weights for adapter {adapter}: {missing[:3]}...")
    return json.loads((path / "state.json").read_text())["step"]


class DamagedCheckpoints(RuntimeError):
    """Every complete checkpoint of a run failed to load; the message names them and what to do."""


def resume_latest(run_dir: str | Path, team, optimizers: dict, schedulers: dict, log=print,
                  mirror_dir: str | Path | None = None, models: dict | None = None) -> dict | None:
    """Load the newest checkpoint that loads; skip broken ones with a warning. None when there is none (a run
    stopped before its first save). Raises DamagedCheckpoints when there are some and none loads."""
    damaged = []
    for path in complete_checkpoints(run_dir):
        try:
            state = load_into(path, team, optimizers, schedulers, models)
        except Exception as err:  # a corrupt file on disk must not end the run: fall back to an older one
            warnings.warn(f"skipping unreadable checkpoint {path}: {type(err).__name__}: {err}", stacklevel=2)
            damaged.append(f"{path.name} ({type(err).__name__}: {str(err)[:200]})")
            continue
        log(f"[kit] resumed from {path} (step {state['step']})")
        return state
    if damaged:
        raise DamagedCheckpoints(_all_damaged(run_dir, damaged, mirror_dir))
    return None


def unreadable(path: Path) -> str | None:
    """Why the files of checkpoint `path` cannot be read (state.json, optim.pt, every adapter's weights; no model
    needed), or None when they can."""
    from safetensors.torch import load_file

    try:
        json.loads((path / "state.json").read_text())
        torch.load(path / "optim.pt", map_location="cpu", weights_only=False)
        weights = sorted((path / "adapters").glob("*/adapter_model.safetensors"))
        if not weights:
            return "no adapters/<adapter>/adapter_model.safetensors"
        for f in weights + sorted((path / "models").glob("*/*.safetensors")):
            load_file(str(f))
    except Exception as err:
        return f"{type(err).__name__}: {str(err)[:200]}"
    return None


def check_resumable(run_dir: str | Path, mirror_dir: str | Path | None = None) -> None:
    """Raise DamagedCheckpoints when the run has complete checkpoints and not one of them can be read: what
    resume_latest would find, said before minutes of model loading."""
    damaged = []
    for path in complete_checkpoints(run_dir):
        why = unreadable(path)
        if why is None:
            return
        damaged.append(f"{path.name} ({why})")
    kept = complete_checkpoints(run_dir, HISTORY)
    if not damaged and kept:  # pruning always leaves one full checkpoint: ckpt/ lost them
        damaged.append(f"{ckpt_dir(run_dir)} holds no complete checkpoint, though {HISTORY}/ keeps the adapters of "
                       f"{', '.join(p.name for p in kept[:3])}: the full checkpoints are missing")
    if damaged:
        raise DamagedCheckpoints(_all_damaged(run_dir, damaged, mirror_dir))


def _all_damaged(run_dir, damaged: list[str], mirror_dir) -> str:
    backup = f"your Drive copy ({mirror_dir})" if mirror_dir else "a backup (e.g. the run's Drive folder)"
    return (f"every checkpoint of the run in {run_dir} is unreadable, so it cannot resume: {'; '.join(damaged)}. "
            f"Nothing was changed. Copy an undamaged checkpoint folder from {backup} into {ckpt_dir(run_dir)}/ and "
            "resume again, or start the run over with --from-scratch (Python: from_scratch=True), which moves the "
            "old checkpoints and logs to a previous_<time>/ folder in the run")


def set_aside(run_dir: str | Path) -> Path | None:
    """Move a run's checkpoints, adapter history and logs into `<run_dir>/previous_<UTC time>/` (what starting
    over does: nothing is deleted; the judge's ledger stays, since its spend is real). Returns that folder, or
    None when there was nothing to move."""
    import time

    run_dir = Path(run_dir)
    names = ("ckpt", HISTORY, "config.json", "metrics.jsonl", "rollouts.jsonl", "eval")
    found = [run_dir / n for n in names if (run_dir / n).exists()]
    if not found:
        return None
    aside = run_dir / time.strftime("previous_%Y%m%dT%H%M%SZ", time.gmtime())
    while aside.exists():
        aside = aside.with_name(aside.name + "_")
    aside.mkdir(parents=True)
    for path in found:
        os.replace(path, aside / path.name)
    return aside
