"""Colab, fourth pass (issue 42): a stop during generation, a Drive that is no longer mounted, logs behind their
checkpoint on Drive, a stop while the last copy runs, CPU advice that cannot learn; one test per problem, each
fails on the code before its fix.

Run: python -m pytest tests/test_colab_fourth_pass.py
"""

from pathlib import Path

import pytest
import torch

from kit import rundir
from kit.config import load_config
from kit.game_trainer import trainer_class

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
