"""One place that turns a config into the parts of a run; the Trainer receives them and is the loop.

    run = assemble(cfg)                      # what Trainer(cfg) does first; every trainer family goes through it
    run.team, run.task, run.reward_model, run.algorithm, run.optimizers, ...

In order: the config validated; the run directory looked at (start over, resume, or refuse a changed setting,
before any model loads); the weights of every short model name resolved once, on the main process, and pinned for
every process (so a multi-process run never trains one process on the hub's weights and another on the packaged
copy, and config.json records what each loaded); the task and its reward model (a trainer family may build its
own: `reward_model`); the items; the team of adapters on one base; the sampler and its rollout correction; one
optimizer and schedule per adapter; the algorithm and its models (kit/trainers/critic.py); the reward scorer; the
Drive mirror. Nothing here trains, and nothing is written but the run directory itself.

What it does not cover: which trainer class a task needs (kit/trainers/game_trainer.py: trainer_class).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from kit.run import checkpoint, rundir
from kit.run.mirror import Mirror
from kit.run import config as config_mod
from kit.run.config import TrainConfig, validate
from kit.run.distributed import Dist
from kit.tasks import describe, has
from kit.engine.tools import sampler_for
from kit.tasks.rewards import EnvironmentReward, Scorer, reward_model_for
from kit.engine.rollout import Sampler, rollout_correction
from kit.trainers.critic import algorithm_for


@dataclass
class Run:
    """The built parts of a run: what the loop reads."""

    cfg: TrainConfig  # the team's config (centralized: one agent writing every part)
    run_cfg: TrainConfig  # the run's config, as config.json saves it
    dist: Dist
    log: Callable
    run_dir: Path
    resume: bool  # a run is there and continues
    task: Any
    reward_model: Any
    train_items: list
    eval_items: list
    team: Any
    sampler: Any
    correction: str
    optimizers: dict
    schedulers: dict
    algorithm: Any
    scorer: Scorer
    mirror: Any


def lr_schedule(optimizer, cfg: TrainConfig):
    """The learning rate of each step: a linear warm-up over `warmup_steps` for every schedule, then constant,
    linear decay or cosine decay to 0 at `num_steps` (transformers' schedules, stepped once per training step).

        lr_k = learning_rate * k / warmup_steps          for step k < warmup_steps (k = 0, 1, ...: the first is 0)
        lr_k = learning_rate * f((k - w) / (num_steps - w))   after it; f = 1, 1 - x, or (1 + cos(pi x)) / 2
    """
    from transformers import get_scheduler

    # transformers' "constant" ignores num_warmup_steps; its warm-up twin is the same schedule once warm
    name = "constant_with_warmup" if cfg.lr_scheduler == "constant" else cfg.lr_scheduler
    return get_scheduler(name, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.num_steps)


def pin_weights(cfg: TrainConfig, dist: Dist, log=print) -> None:
    """Resolve every short model name of the config once, on the main process, and pin the source it found in
    cfg.model_sources on every process (a full source string: the hub's commit, or the packaged file's hash).

    Another process then loads exactly that: the same hub commit, or the same packaged copy; if the hub does not
    answer it for a hub pin, it stops with the reason instead of training on other weights."""
    from kit.engine import weights

    names = [n for n in dict.fromkeys(cfg.agent_models or [cfg.model_name]) if weights.is_short_name(n)]
    if not names:
        return
    pins = None
    if dist.is_main:
        pins = {n: weights.resolve(n, cfg.model_sources.get(n), log=log)[1] for n in names}
    pins = dist.gather(pins)[0]  # the main process's, on every process (the others wait for its fetch)
    cfg.model_sources = {**cfg.model_sources, **pins}


def assemble(cfg: TrainConfig, task=None, reward_funcs=None, team=None, resume: bool = False, log=print,
             sampler=None, from_scratch: bool = False, reward_model: Callable | None = None) -> Run:
    """Build a run's parts from its config (see the module docstring). `reward_model(cfg, task, reward_funcs, log)`
    replaces the default reward model (a game scores its own episodes)."""
    from kit.engine.centralized import team_config, wrap

    cfg = validate(cfg)  # the run's config (config.json); team_cfg: the team's (centralized: one agent)
    team_cfg = team_config(cfg)
    dist = Dist()  # one process, or this one's place among several (accelerate launch / torchrun)
    log = log if dist.is_main else (lambda *_: None)
    run_dir = Path(cfg.run_dir)
    saved = run_dir / rundir.CONFIG
    exists = saved.exists()
    if exists and from_scratch:  # asked to start over: the old run's files move aside, nothing is deleted
        if dist.is_main:
            for place in (run_dir, *([cfg.mirror_dir] if cfg.mirror_dir else [])):
                aside = checkpoint.set_aside(place)
                if aside is not None:
                    log(f"[kit] starting over: the previous run's files in {place} moved to {aside}")
        exists = False
    dist.barrier()  # every process has looked before the main one writes config.json
    if exists and not resume:
        raise FileExistsError(f"run_dir {str(run_dir)!r} already holds a run; resume it (resume=True, "
                              "--resume) or choose another run_dir")
    if exists:  # refuse a changed setting, or a run whose checkpoints are all damaged, before model loading
        config_mod.adopt_model_sources(saved, cfg)  # a resume loads the weights the run started on
        config_mod.check_resume(saved, cfg)
        checkpoint.check_resumable(run_dir, cfg.mirror_dir)
    elif resume:
        log(f"[kit] nothing to resume in {run_dir} (no run there yet): starting a new run")
    resume = exists
    if dist.world > cfg.batch_size:
        raise ValueError(f"{dist.world} processes share batch_size={cfg.batch_size} items per step: give "
                         f"every process at least one (batch_size >= {dist.world})")
    if dist.world > 1 and cfg.agent_devices:
        raise ValueError("agent_devices places each base on its own GPU within ONE process; it does not combine "
                         "with several processes: launch one process, or drop agent_devices for data "
                         "parallelism (README: More than one GPU)")
    if task is None:
        from kit.tasks import task_for

        task = task_for(cfg)
    task = wrap(cfg, task)
    build_reward = reward_model or (lambda cfg, task, funcs, log: reward_model_for(cfg, task, funcs, log=log))
    rewards = build_reward(cfg, task, reward_funcs or (), log)  # an environment's get_reward(): EnvironmentReward
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        names = getattr(rewards, "source_names", lambda: None)()
        if names is None or len(set(names)) < len(names):
            raise ValueError(f"multi_objective_aggregation=normalize_then_sum needs reward functions with distinct "
                             f"names (each reward is normalised on its own); got {names}")
    log(f"[kit] {describe(task)}")
    if cfg.num_turns > 1 and not has(task, "feedback"):
        raise ValueError(f"num_turns={cfg.num_turns} needs a task with feedback(item, completions, reward)")
    train_items = task.load("train")
    eval_items = task.load("eval")[: cfg.num_eval_items]
    if not train_items:
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no train items")
    if team is None:
        from kit.engine.models import build_team
        from kit.sandbox.envclass import notebook_class, restore_from_run

        restore_from_run(cfg.environment, run_dir, log)  # a resume in a runtime where the class's cell has not run
        notebook_class(cfg.environment or "")  # a notebook's environment class is defined: said before the model loads
        pin_weights(cfg, dist, log)
        team = build_team(dataclasses.replace(cfg, device=dist.device(cfg.device)), log=log)
    cfg.model_sources = team_cfg.model_sources = {**cfg.model_sources, **team.sources}  # recorded in config.json
    team.roles = list(getattr(task, "roles", [])) or [f"agent_{i}" for i in range(cfg.num_agents)]
    sampler = sampler or sampler_for(team, cfg, log)  # with an environment: its agents act (kit/engine/tools.py)
    host = getattr(sampler, "host", None)  # the environment's, when the team acts on one
    if isinstance(rewards, EnvironmentReward) and not getattr(host, "has_reward", False):
        raise ValueError(f"environment={cfg.environment!r} has no get_reward() and task {cfg.task!r} has no reward: "
                         "give the class a get_reward() -> float, or pass reward functions")
    # an environment owning the reward owns each agent's share of it too (local_reward_weight > 0)
    if host is not None and cfg.local_reward_weight > 0 and host.has_reward and not host.has_agent_rewards:
        raise ValueError(f"local_reward_weight={cfg.local_reward_weight} mixes each agent's own reward into its "
                         f"return, and environment={cfg.environment!r} owns the reward (get_reward) but gives no "
                         "share per agent: give the class a get_agent_rewards() ({role: number}, or a list in the "
                         "team's order), or set local_reward_weight=0")
    if host is not None and cfg.local_reward_weight > 0 and host.has_agent_rewards and not host.has_reward:
        raise ValueError(f"environment={cfg.environment!r} has get_agent_rewards() but no get_reward(): the shares "
                         "would be ignored (the task's reward functions score the team); give the class a "
                         "get_reward() -> float, or let the reward functions return the parts local_0 ..")
    correction = rollout_correction(cfg, team, log)  # none, token_truncate or sequence_mask
    optimizers, schedulers = {}, {}
    for adapter in team.adapters:
        opt = torch.optim.AdamW(team.parameters_of(adapter), lr=cfg.learning_rate,
                                weight_decay=cfg.weight_decay)
        optimizers[adapter] = opt
        schedulers[adapter] = lr_schedule(opt, cfg)
    # the algorithm (kit/trainers/critic.py): its advantages, its own models (critics) and their fit after the update
    algorithm = algorithm_for(cfg, team, log, lr_schedule)
    scorer = Scorer(rewards, cfg.reward_workers, cfg.reward_pool)
    mirror = None
    if dist.is_main:  # one writer: the other processes only compute
        run_dir.mkdir(parents=True, exist_ok=True)
        from kit.sandbox.envclass import keep_with_run

        keep_with_run(cfg.environment, run_dir)  # a notebook's class kept by value with the run (02-07 reopen it)
    if cfg.mirror_dir and dist.is_main:
        mirror = Mirror(run_dir, cfg.mirror_dir, cfg.keep_last, cfg.keep_history, log=log)
    return Run(cfg=team_cfg, run_cfg=cfg, dist=dist, log=log, run_dir=run_dir, resume=resume, task=task,
               reward_model=rewards, train_items=train_items, eval_items=eval_items, team=team, sampler=sampler,
               correction=correction, optimizers=optimizers, schedulers=schedulers, algorithm=algorithm,
               scorer=scorer, mirror=mirror)
