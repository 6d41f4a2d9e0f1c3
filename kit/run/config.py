"""TrainConfig loaded and validated: a preset, a file and overrides made into one checked config; resume checks.

The dataclass itself, its choices and its files are kit/run/fields.py (re-exported here); presets are
kit/run/presets.py.

    cfg = load_config(preset="tiny_cpu", path="my.yaml", overrides=["learning_rate=1e-4", "task=toy"])

Order: preset, then the file (YAML or JSON), then `key=value` overrides, then `validate`. Every problem is
reported before any model loads, with the field, the value and what is allowed. Names follow TRL and CoMLRL
where they exist (num_generations, max_new_tokens, temperature, top_p, learning_rate, beta, joint_mode,
num_turns, discount, advantage_mode, scale_rewards, loss_type).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

from kit.run.fields import (  # noqa: F401  (re-exported: kit.run.config is the config's one name)
    CHOICES, NON_TRAINING, SAVED_DEFAULTS, ConfigError, TrainConfig, _environment, _field_types, _float_types, _legacy,
    from_dict, load_file, parse_override, preset, save, saved_values, to_dict)


def load_config(preset_name: str | None = None, path: str | Path | None = None,
                overrides: list[str] | None = None, saved: bool = False) -> TrainConfig:
    """Preset, then file, then `key=value` overrides; validated. `saved`: the file is a run's config.json,
    whose missing fields mean what they meant when it was written (`saved_values`)."""
    cfg = preset(preset_name) if preset_name else TrainConfig()
    if path:
        values = load_file(path)
        if saved:
            values = saved_values(values)
        if "preset" in values:  # a file may name its preset
            cfg = preset(values.pop("preset"))
        cfg = from_dict(values, cfg)
    cfg = from_dict(dict(parse_override(o) for o in overrides or []), cfg)
    return validate(cfg)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError on the first bad value; return cfg unchanged otherwise."""
    cfg.scale_rewards = _legacy("scale_rewards", cfg.scale_rewards)  # True/False set from Python: group/none
    cfg.advantage_mode = _legacy("advantage_mode", cfg.advantage_mode)  # marloo set from Python: rloo
    cfg.environment = _environment(cfg.environment)  # a class set from Python: "module:ClassName"
    from_dict(dataclasses.asdict(cfg))  # types
    for name, hint in _field_types().items():  # inf and nan pass every range check below: refuse them first
        value = getattr(cfg, name)
        if float in _float_types(hint) and any(isinstance(v, float) and not math.isfinite(v)
                                               for v in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"{name}={value!r} is not allowed; allowed: a finite number (not inf or nan)")
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{name}={getattr(cfg, name)!r} is not allowed; allowed: {', '.join(allowed)}")

    def need(ok: bool, name: str, allowed: str):
        if not ok:
            raise ConfigError(f"{name}={getattr(cfg, name)!r} is not allowed; allowed: {allowed}")

    need(cfg.num_agents >= 1, "num_agents", "an integer >= 1")
    from kit.engine import weights

    for name, source in cfg.model_sources.items():
        problem = weights.check_source(name, str(source))
        if problem:
            raise ConfigError(f"model_sources={cfg.model_sources!r} is not allowed: {problem}")
    need(cfg.num_generations >= 2, "num_generations", "an integer >= 2 (the group baseline needs 2 samples)")
    need(0 < cfg.top_p <= 1, "top_p", "a number in (0, 1]")
    need(cfg.temperature > 0, "temperature", "a number > 0 (training samples; evaluation is greedy)")
    need(cfg.top_k >= 0, "top_k", "an integer >= 0")
    need(cfg.max_new_tokens >= 1, "max_new_tokens", "an integer >= 1")
    need(cfg.num_turns >= 1, "num_turns", "an integer >= 1")
    need(cfg.environment is None or (isinstance(cfg.environment, str) and cfg.environment.count(":") == 1),
         "environment", "null or 'module.path:ClassName' (a TRL-style environment class)")
    need(isinstance(cfg.environment_args, dict) and all(isinstance(k, str) for k in cfg.environment_args)
         and _json_values(cfg.environment_args), "environment_args",
         "a mapping of the environment constructor's keyword arguments to JSON values")
    need(not cfg.environment_args or bool(cfg.environment), "environment_args",
         "empty without an environment (they are its constructor's arguments)")
    need(cfg.max_tool_calls >= 0, "max_tool_calls", "an integer >= 0")
    need(cfg.tool_timeout_s > 0, "tool_timeout_s", "a number > 0")
    need(cfg.tool_workers >= 1, "tool_workers", "an integer >= 1 (the environment's processes)")
    need(cfg.tool_workers == 1 or bool(cfg.environment), "tool_workers",
         "1 without an environment (its processes run the environment's tools)")
    prefill = cfg.task_args.get("prefill") if cfg.task == "code" and isinstance(cfg.task_args, dict) else None
    need(prefill not in ("tool", "board", "discussion") or bool(cfg.environment), "task_args",
         "prefill: tool, board or discussion only with an environment that has the tools it calls: run_tests "
         "(environment=kit.tasks.environments:CodeTests) or post and read (kit.tasks.environments:Board); "
         "each answer starts as a call of one")
    need(prefill != "discussion" or cfg.max_tool_calls == 2, "max_tool_calls",
         "2 with prefill: discussion (each agent posts its draft, then reads the board: two calls, after which its "
         "answer is its final code; a third call would come before it)")
    if cfg.environment:
        need(cfg.joint_mode == "aligned", "joint_mode", "aligned with an environment (the agents' g-th samples act "
             "on one world; cross pairs samples that never met)")
        need(cfg.num_turns == 1, "num_turns", "1 with an environment (its tool rounds are the turns; a feedback turn "
             "on top of them is not built yet)")
        need(cfg.algorithm == "magrpo", "algorithm",
             "magrpo with an environment (the critics of iac and maac read the prompt and the final answer, not "
             "the tool calls and results that decide the reward; centralized, madpo and marlhf do not act)")
    need(0 <= cfg.discount <= 1, "discount", "a number in [0, 1]")
    need(cfg.advantage_clip is None or cfg.advantage_clip > 0, "advantage_clip", "null or a number > 0")
    need(cfg.beta >= 0, "beta", "a number >= 0")
    game = cfg.task == "game"
    need(cfg.advantage_mode != "marginal" or cfg.joint_mode == "cross", "advantage_mode",
         "marginal only with joint_mode=cross (aligned pairs each sample with one partner sample, so there is no "
         "mean over the partners' samples to take); or mean, rloo, max, raw, role with aligned")
    need(not (game and cfg.advantage_mode == "role" and cfg.joint_mode == "cross"), "advantage_mode",
         "role with joint_mode=aligned in games (cross games branch the first move; use marginal or mean there)")
    need(not game or cfg.grouping == "node", "grouping", "node for game tasks (a deal's G episodes are the group)")
    need(0 <= cfg.local_reward_weight <= 1, "local_reward_weight", "a number in [0, 1]")
    need(not game or cfg.local_reward_weight == 0, "local_reward_weight",
         "0 for game tasks (a game's return is its score; there are no local rewards)")
    need(0 <= cfg.role_baseline_decay < 1, "role_baseline_decay", "a number in [0, 1)")
    need(0 <= cfg.leniency <= 1, "leniency", "a number in [0, 1]")
    need(cfg.leniency == 0 or cfg.joint_mode == "cross", "leniency",
         "0 with joint_mode=aligned (a sample meets one partner answer, so its mean and max are the same): set "
         "joint_mode=cross")
    need(cfg.leniency == 0 or cfg.algorithm in ("magrpo", "marlhf"), "leniency",
         f"0 with algorithm={cfg.algorithm} (leniency shapes the group-relative returns of MAGRPO's advantages; "
         "critics, preference pairs and one centralized policy do not read them)")
    need(cfg.leniency_decay_steps >= 0, "leniency_decay_steps", "an integer >= 0")
    need(cfg.num_iterations >= 1, "num_iterations", "an integer >= 1 (1: on-policy, the paper's setting)")
    need(0 <= cfg.epsilon < 1, "epsilon", "a number in [0, 1)")
    need(cfg.epsilon_high is None or cfg.epsilon_high >= 0, "epsilon_high", "null (= epsilon) or a number >= 0")
    need(cfg.rollout_is_cap >= 1, "rollout_is_cap", "a number >= 1")
    high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    need(cfg.delta is None or cfg.delta > 1 + high, "delta", f"null or a number > 1 + epsilon_high ({1 + high:g})")
    need(cfg.sapo_temperature_pos > 0, "sapo_temperature_pos", "a number > 0")
    need(cfg.sapo_temperature_neg > 0, "sapo_temperature_neg", "a number > 0")
    need(cfg.off_policy_mask_threshold is None or cfg.off_policy_mask_threshold >= 0, "off_policy_mask_threshold",
         "null (off) or a number >= 0 (nats per token)")
    need(0 < cfg.top_entropy_quantile <= 1, "top_entropy_quantile", "a number in (0, 1] (1: every token)")
    need(cfg.entropy_coef >= 0, "entropy_coef", "a number >= 0")
    need(cfg.multi_objective_aggregation == "sum_then_normalize" or cfg.scale_rewards == "none",
         "multi_objective_aggregation", "sum_then_normalize with scale_rewards "
         f"{cfg.scale_rewards!r}: normalize_then_sum divides each reward by its group's std and the sum by its std "
         "over the step itself, so it needs scale_rewards=none")
    need(cfg.multi_objective_aggregation == "sum_then_normalize" or (
        cfg.advantage_mode != "role" and cfg.grouping == "node" and cfg.local_reward_weight == 0),
         "multi_objective_aggregation", "sum_then_normalize with advantage_mode=role, grouping other than node or "
         "local_reward_weight > 0 (normalize_then_sum takes each reward's group at a node, from the team's reward)")
    need(cfg.num_steps >= 1, "num_steps", "an integer >= 1")
    need(cfg.batch_size >= 1, "batch_size", "an integer >= 1")
    need(cfg.micro_batch_size >= 0, "micro_batch_size", "an integer >= 0")
    need(cfg.learning_rate > 0, "learning_rate", "a number > 0")
    need(cfg.weight_decay >= 0, "weight_decay", "a number >= 0")
    need(cfg.warmup_steps >= 0, "warmup_steps", "an integer >= 0")
    need(cfg.max_grad_norm >= 0, "max_grad_norm", "a number >= 0 (0: no clipping)")
    need(cfg.lora_r >= 1, "lora_r", "an integer >= 1")
    need(cfg.lora_alpha >= 1, "lora_alpha", "an integer >= 1")
    need(0 <= cfg.lora_dropout < 1, "lora_dropout", "a number in [0, 1)")
    need(cfg.eval_every >= 0, "eval_every", "an integer >= 0")
    need(cfg.save_every >= 0, "save_every", "an integer >= 0")
    need(cfg.keep_last >= 1, "keep_last", "an integer >= 1")
    need(cfg.keep_history >= 0, "keep_history", "an integer >= 0")
    need(cfg.reward_workers >= 0, "reward_workers", "an integer >= 0")
    need(cfg.judge_budget_usd >= 0, "judge_budget_usd", "a dollar amount >= 0")
    need(cfg.judge_timeout_s > 0, "judge_timeout_s", "a number of seconds > 0")
    need(cfg.judge_max_retries >= 0, "judge_max_retries", "an integer >= 0")
    need(cfg.judge_max_failures >= 1, "judge_max_failures", "an integer >= 1")
    need(cfg.judge_cooldown_s >= 0, "judge_cooldown_s", "a number of seconds >= 0")
    if cfg.judge_model is not None:
        from kit.judge.judge import PRICES, price_of

        try:
            price_of(cfg.judge_model)
        except ValueError:
            need(False, "judge_model", f"a model with a known price ({', '.join(PRICES)}...) or None")
    need(not (cfg.use_judge_reward or cfg.judge_feedback) or cfg.judge_model is not None, "judge_model",
         "a model name when use_judge_reward or judge_feedback is on")
    need(cfg.num_eval_items >= 0, "num_eval_items", "an integer >= 0")
    need(cfg.value_loss_coef > 0, "value_loss_coef", "a number > 0")
    need(cfg.value_clip_range is None or cfg.value_clip_range > 0, "value_clip_range", "null or a number > 0")
    need(cfg.critic_learning_rate is None or cfg.critic_learning_rate > 0, "critic_learning_rate",
         "null (= learning_rate) or a number > 0")
    need(cfg.critic_warmup_steps >= 0, "critic_warmup_steps", "an integer >= 0")
    need(0 <= cfg.gae_lambda <= 1, "gae_lambda", "a number in [0, 1] (0: TD(0), 1: Monte Carlo)")
    need(cfg.algorithm != "centralized" or cfg.task != "game", "algorithm",
         "magrpo, iac or maac for a game (centralized writes every part in one completion; in a turn-based game "
         "one policy in every seat is share_adapter=true)")
    rl = rl_algorithm(cfg)  # marlhf with marlhf_rl_algorithm=iac or maac trains critics as iac or maac do
    need(cfg.marlhf_rl_algorithm == "magrpo" or cfg.algorithm == "marlhf", "marlhf_rl_algorithm",
         f"magrpo with algorithm={cfg.algorithm} (it picks the RL stage of algorithm=marlhf only; for critics on the "
         "task's reward use algorithm=iac or maac)")
    need(cfg.reward_model_pooling == "last" or cfg.algorithm == "marlhf", "reward_model_pooling",
         f"last with algorithm={cfg.algorithm} (it shapes the reward model of algorithm=marlhf only)")
    need(cfg.use_separate_critic or cfg.algorithm == "iac", "use_separate_critic",
         f"true with algorithm={cfg.algorithm} (false puts a value head on each agent's own adapter: IAC's option "
         "only; MAAC's centralized critic reads every agent's prompt, so it has no one actor to sit on)")
    need(cfg.baseline == "mean" or (rl == "maac" and cfg.critic_type == "q"), "baseline",
         "mean, or counterfactual with algorithm=maac and critic_type=q (COMA's baseline needs a joint Q)")
    need(cfg.baseline == "mean" or cfg.joint_mode == "aligned", "baseline",
         "mean with joint_mode=cross (counterfactual swaps one agent's action in aligned joint actions)")
    critics = rl in ("iac", "maac")  # their advantages replace the group-relative ones (kit/trainers/critic.py)
    which = f"algorithm={cfg.algorithm}" + (f" and marlhf_rl_algorithm={rl}" if cfg.algorithm == "marlhf" else "")
    need(not critics or cfg.local_reward_weight == 0, "local_reward_weight",
         f"0 with {which} (its critics learn the team's return; local rewards do not reach them)")
    need(not critics or cfg.multi_objective_aggregation == "sum_then_normalize", "multi_objective_aggregation",
         f"sum_then_normalize with {which} (a critic learns one return, the weighted sum)")
    need(not critics or cfg.advantage_mode != "role", "advantage_mode",
         f"not role with {which} (the critic is the baseline)")
    need(not critics or cfg.scale_rewards == "none", "scale_rewards",
         f"none with {which} (the critics' advantages replace the group's; advantage_normalization scales them)")
    if critics and cfg.critic_type == "v" and cfg.advantage_normalization and cfg.batch_size == 1:
        if cfg.task == "game":
            warnings.warn(first_mover_warning(which), UserWarning, stacklevel=2)
        elif cfg.num_turns == 1:
            warnings.warn(constant_baseline_warning(which), UserWarning, stacklevel=2)
    need(cfg.algorithm != "marlhf" or (cfg.advantage_mode != "role"
                                      and cfg.multi_objective_aggregation == "sum_then_normalize"),
         "algorithm", "marlhf with advantage_mode other than role and multi_objective_aggregation="
         "sum_then_normalize (the reward model gives one score per joint action, after the task's rewards were "
         "scored: a role baseline or per-reward normalisation would read the task's reward, not the model's)")
    if cfg.algorithm in ("madpo", "marlhf"):  # the preference trainers (kit/trainers/preference_trainer.py)
        need(cfg.preference_num_candidates >= 2, "preference_num_candidates", "an integer >= 2 (a pair needs two)")
        need(cfg.preference_pairs_per_sample is None or cfg.preference_pairs_per_sample >= 1,
             "preference_pairs_per_sample", "null (every pair) or an integer >= 1")
        need(cfg.dpo_beta > 0, "dpo_beta", "a number > 0")
        need(cfg.preference_refresh_every >= 1, "preference_refresh_every", "an integer >= 1 (1: every step)")
        need(cfg.num_turns == 1, "num_turns", f"1 with algorithm={cfg.algorithm} (pairs of one-turn joint answers)")
        need(cfg.reward_num_items >= 2, "reward_num_items", "an integer >= 2")
        need(0 <= cfg.reward_heldout_fraction < 1, "reward_heldout_fraction", "a number in [0, 1)")
        need(cfg.reward_learning_rate > 0, "reward_learning_rate", "a number > 0")
        need(cfg.reward_num_train_epochs >= 1, "reward_num_train_epochs", "an integer >= 1")
        need(cfg.reward_train_batch_size >= 1, "reward_train_batch_size", "an integer >= 1")
        need(cfg.reward_refresh_every >= 0, "reward_refresh_every", "an integer >= 0 (0: fit once, at step 0)")
        need(cfg.task != "game", "algorithm", "magrpo for a game task (its episodes are not joint answers)")
        need(cfg.preference_source != "judge" or cfg.judge_model is not None, "judge_model",
             "a model name when preference_source=judge")
        need(cfg.preference_source != "judge" or cfg.pair_selection != "reward_gap", "pair_selection",
             "all or random when preference_source=judge (a judge gives labels, not the scores reward_gap ranks by)")
    need(bool(cfg.model_name), "model_name", "a hub name, a local path, or 'tiny'")
    if cfg.agent_models is not None:
        need(len(cfg.agent_models) == cfg.num_agents, "agent_models",
             f"a list of {cfg.num_agents} model names (one per agent, num_agents={cfg.num_agents})")
        need(not cfg.share_adapter or len(set(cfg.agent_models)) == 1, "agent_models",
             "a single base model when share_adapter=true (an adapter lives on one base)")
    if cfg.agent_devices is not None:
        need(len(cfg.agent_devices) == cfg.num_agents, "agent_devices",
             f"a list of {cfg.num_agents} devices (one per agent, num_agents={cfg.num_agents})")
        names = cfg.agent_models or [cfg.model_name] * cfg.num_agents
        need(all(len({d for d, n in zip(cfg.agent_devices, names) if n == name}) == 1 for name in names),
             "agent_devices", "the same device for agents on the same base (a base, with its adapters, lives on "
             "one device): give agent_models one entry per base you want on its own device")
    tasks = sorted(p.stem for p in (Path(__file__).parent.parent / "tasks").glob("*.py")
                   if "\ndef make_task(" in p.read_text())  # kit/tasks/ also holds the parts tasks share (rewards, ...)
    if cfg.task not in tasks:
        raise ConfigError(f"task={cfg.task!r} does not exist; allowed: {', '.join(tasks)}")
    from kit.tasks.rewards import parse_processor

    try:
        parse_processor(cfg.reward_processor)
    except ValueError as err:
        raise ConfigError(f"reward_processor={cfg.reward_processor!r}: {err}") from None
    if cfg.importance_sampling_level == "sequence" and cfg.loss_type not in SEQUENCE_LOSSES:
        warnings.warn(gspo_warning(cfg.loss_type), UserWarning, stacklevel=2)
    return cfg


SEQUENCE_LOSSES = ("grpo", "sapo")  # a mean per completion: each completion's one ratio counts once


def _json_values(value) -> bool:
    """Whether `value` travels as JSON unchanged in meaning (no sets, dates, NaN or objects)."""
    import json

    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def gspo_warning(loss_type: str) -> str:
    """What a run with sequence-level ratios and a token-summing loss_type is told (TRL warns too)."""
    return (f"importance_sampling_level=sequence with loss_type={loss_type}: {loss_type} sums each completion's "
            "per-token terms, so each completion's one clipped ratio term is weighed by its length; that is not "
            "GSPO. GSPO (arXiv 2507.18071) is importance_sampling_level=sequence with loss_type=grpo (one term per "
            "completion, averaged)")


def constant_baseline_warning(which: str) -> str:
    """What a run whose V critic cannot reach the policy is told (bench/README.md, critics on SmolLM2 writing)."""
    return (f"{which} with critic_type=v, batch_size=1 and one turn: every row of a step answers one prompt, so the "
            "critic's value is one number per step, and advantage_normalization subtracts it away: the policy trains "
            "on its group's normalized rewards whatever the critic learns (with the gradient clipped every step, "
            "exactly as MAGRPO does). Use batch_size >= 2 or advantage_normalization=false for the critic to matter")


def first_mover_warning(which: str) -> str:
    """constant_baseline_warning's case in a game: one deal a step (bench/README.md, game E on SmolLM2)."""
    return (f"{which} with critic_type=v and batch_size=1 on a game: a step's episodes all start from one deal, so "
            "the first mover's first decision has one state and the critic one value there, which "
            "advantage_normalization subtracts away with the mean. A player who decides only there (player 0 of "
            "tiny_hanabi) trains on its normalized returns whatever the critic learns, as under MAGRPO. Use "
            "batch_size >= 2 (deals a step) or advantage_normalization=false for the critic to matter there")


def rl_algorithm(cfg: TrainConfig) -> str:
    """The algorithm of the policy update: marlhf's RL stage (marlhf_rl_algorithm) on its learnt reward, else the
    run's own algorithm (magrpo, iac, maac, centralized, madpo)."""
    return cfg.marlhf_rl_algorithm if cfg.algorithm == "marlhf" else cfg.algorithm


def training_diff(old: dict, new: TrainConfig) -> list[str]:
    """Fields that change training and differ between a saved config and a new one, as 'field: old -> new'."""
    cur = to_dict(new)
    old = {k: _legacy(k, v) for k, v in saved_values(old).items()}
    diff = []
    for key in sorted(set(old) | set(cur)):
        if key in NON_TRAINING and not (key == "num_steps" and cur.get("lr_scheduler") != "constant"):
            continue
        if old.get(key) != cur.get(key):
            diff.append(f"{key}: {old.get(key)!r} -> {cur.get(key)!r}")
    return diff


def adopt_model_sources(saved: str | Path, cfg: TrainConfig) -> None:
    """A short model name resolved when the run started (kit/engine/weights.py) resolves the same on resume: take the
    saved source for every name the new config leaves open or asks for only by kind (hub, package)."""
    recorded = saved_values(load_file(saved)).get("model_sources") or {}
    for name, source in recorded.items():
        asked = cfg.model_sources.get(name)
        if asked is None or asked == source.split(":", 1)[0]:
            cfg.model_sources = {**cfg.model_sources, name: source}


def check_resume(saved: str | Path, cfg: TrainConfig) -> None:
    """Refuse to continue the run whose config.json is `saved` with settings that change training."""
    diff = training_diff(load_file(saved), cfg)
    if diff:
        raise ValueError(f"cannot resume the run in {Path(saved).parent}: these fields change training and differ "
                         "from the saved run: " + "; ".join(diff) + ". Set them back, or start a new run in another "
                         "run_dir (notebooks: another RUN_NAME)")
