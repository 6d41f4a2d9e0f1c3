"""Colab, third pass (issue 34): what misled a new user or filled their Drive, one test per problem; each fails on
the code before its fix.

Run: python -m pytest tests/test_colab_third_pass.py
"""

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest

from kit import checkpoint, colab
from kit.config import load_config
from kit.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent


def cfg_for(run_dir, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "progress=false", "num_steps=2", "batch_size=2",
                                              "num_generations=2", "eval_every=0", "save_every=1", *overrides])


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".partial" in p.name)


# 1. a Drive slower than save_every ----------------------------------------------------------------------------

def test_a_slow_drive_reports_no_failure_that_did_not_happen_and_leaves_no_partial_copy(tmp_path, monkeypatch):
    """The copy of step 1 is still reading it when the trainer's prune moves it to history/ (made certain, not
    left to timing: the copy waits until the prune has happened)."""
    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy, real_prune = shutil.copyfile, checkpoint.prune
    pruned = threading.Event()

    def prune(run_dir, keep_last, keep_history=0):
        real_prune(run_dir, keep_last, keep_history)
        if not (run / "ckpt" / "step_000001").exists():
            pruned.set()

    def slow_copy(src, dst, *args, **kwargs):
        if os.fspath(src).startswith(str(run / "ckpt" / "step_000001")):  # copytree passes DirEntry
            assert pruned.wait(120), "the trainer never pruned step 1"
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "prune", prune)
    monkeypatch.setattr(shutil, "copyfile", slow_copy)
    said = []
    trainer = Trainer(cfg_for(run, "num_steps=4", "keep_last=1", "keep_history=3", f"mirror_dir={drive}"),
                      log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert pruned.is_set()
    assert not [s for s in said if "fail" in s.lower()], said
    assert summary["backup"] == f"last good backup: step 4 ({drive})"
    assert leftovers(drive) == []
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000004"]
    assert [p.name for p in checkpoint.complete_checkpoints(drive, "history")] == \
        ["step_000003", "step_000002", "step_000001"]


def test_a_partial_copy_left_by_an_earlier_runtime_is_removed_by_the_next_copy(tmp_path):
    run, drive = tmp_path / "run", tmp_path / "drive"
    stale = drive / "ckpt" / ".step_000045.partial"
    (stale / "adapters").mkdir(parents=True)
    (stale / "optim.pt").write_bytes(b"x" * 1000)
    (drive / ".metrics.jsonl.partial").write_text("{}")
    trainer = Trainer(cfg_for(run, "num_steps=1", f"mirror_dir={drive}"), log=lambda *_: None)
    colab.train_to_end(trainer, every=100)
    assert leftovers(drive) == []
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000001"]


# 2. a full or read-only Drive --------------------------------------------------------------------------------

@pytest.mark.parametrize("code, reason", [(errno.ENOSPC, "Drive is full (No space left on device)"),
                                          (errno.EROFS, "Drive is read-only (Read-only file system)")])
def test_a_full_or_read_only_drive_is_one_clear_reason_said_once_and_leaves_no_partial_copy(tmp_path, monkeypatch,
                                                                                             code, reason):
    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy = shutil.copyfile

    def failing_copy(src, dst, *args, **kwargs):
        if os.fspath(dst).startswith(str(drive)):
            Path(dst).write_bytes(b"half a file")  # what a full disk leaves: the start of the file
            raise OSError(code, os.strerror(code), str(dst))
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", failing_copy)
    said = []
    trainer = Trainer(cfg_for(run, "num_steps=6", f"mirror_dir={drive}"), log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert summary["steps"] == 6 and summary["backup"].startswith("last good backup: none yet")
    failures = [s for s in said if "fail" in s.lower()]
    assert failures and all(reason in s for s in failures), failures
    assert not any("[(" in s or "Errno" in s for s in failures), failures  # no raw shutil.Error or errno
    assert sum("!!!!" in s for s in failures) == 1  # the loud banner once ...
    assert len(failures) <= 4  # ... then "still failing" now and then, not a line per save (7 copies failed)
    assert any("still failing" in s for s in failures)
    assert leftovers(drive) == []


# 7. an installable package: the notebooks import it, they do not move into the repository ---------------------

def setup_cell() -> str:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "02_evaluate.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if "colab.smoke()" in c.source)
    return "\n".join(line for line in source.splitlines() if not line.startswith("%"))


def test_the_setup_cell_stays_in_its_folder_where_the_kit_is_installed(tmp_path, monkeypatch):
    (tmp_path / "kit").mkdir()  # a checkout's kit/ above the notebook's folder, as in notebooks/
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.syspath_prepend(str(ROOT))  # `kit` importable: installed
    exec(compile(setup_cell(), "setup-cell", "exec"), {})
    assert Path.cwd() == tmp_path / "notebooks"
