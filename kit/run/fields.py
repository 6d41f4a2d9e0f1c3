"""TrainConfig as data: every field with its default and a one-line comment, the allowed choices, and the config's
files (types checked field by field on reading, `key=value` overrides, YAML/JSON, config.json). Validation of the
values together, loading with a preset and resume checks: kit/run/config.py, which re-exports what is here.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from kit.run.presets import PRESETS


@dataclass
class TrainConfig:
    # --- team and model
    model_name: str = "tiny"  # hub name, local path or short name (smollm2-135m) of the base; "tiny": built-in
    model_sources: dict = field(default_factory=dict)  # short name -> hub, package or the source a run recorded
    agent_models: list[str] | None = None  # one base per agent for heterogeneous teams (overrides model_name)
    num_agents: int = 2  # agents in the team
    share_adapter: bool = False  # one LoRA adapter (and optimizer) shared by all agents
    quantization: str = "auto"  # auto: 4-bit NF4 on CUDA, full precision on CPU; 4bit; none
    dtype: str = "auto"  # auto (CUDA: bf16/fp16; CPU: bf16 where native and the model is wide, else fp32), float32, ...
    device: str = "auto"  # auto, cpu, cuda, cuda:1 ...
    agent_devices: list[str] | None = None  # one device per agent (cuda:0, cuda:1 ...): each base on its own GPU
    gradient_checkpointing: bool = False  # trade compute for memory in the update
    share_prompts: bool = True  # forward each prompt once for its samples: generation, the update, critics and reward
    # models (not with gradient checkpointing, which drops the KV cache it reads); the same maths up to float rounding
    rollout_engine: str = "auto"  # auto (compiled on CUDA, hf on CPU), hf (PEFT eager), compiled (CUDA graphs)
    generation_weights: str = "auto"  # compiled engine: auto (a bf16/fp16 copy of a 4-bit base if it fits), copy, 4bit
    lora_r: int = 16  # LoRA rank
    lora_alpha: int = 32  # LoRA scaling numerator
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_target_modules: str | list[str] = "all-linear"  # peft target_modules
    # --- LLM judge (kit/judge/judge.py; needs ANTHROPIC_API_KEY, otherwise off with one line)
    judge_model: str | None = None  # e.g. claude-sonnet-4-5; None: no judge
    judge_budget_usd: float = 15.0  # hard cap on judge spend for the run (ledger in <run_dir>/budget.json)
    use_judge_reward: bool = False  # add the judge's rubric score as a reward function
    judge_feedback: bool = False  # multi-turn code: the judge's expert advice goes into the next-turn prompts
    judge_timeout_s: float = 30.0  # seconds one judge request may take before it is abandoned (then retried)
    judge_max_retries: int = 2  # retries of a request after a rate limit, 5xx or timeout (the SDK's backoff)
    judge_max_failures: int = 3  # judge calls failing in a row (after retries) that switch the judge off ...
    judge_cooldown_s: float = 300.0  # ... for this many seconds: those items are unscored, training goes on
    # --- task
    task: str = "toy"  # a module in kit/tasks (toy, code, writing, ...)
    task_args: dict = field(default_factory=dict)  # keyword arguments for the task's constructor
    num_eval_items: int = 16  # held-out items scored at each evaluation
    # --- an environment the agents act on with tools (kit/engine/tools.py; TRL's environment classes unchanged)
    environment: str | None = None  # "module.path:ClassName" or a class (a notebook's: "__main__:ClassName", sent by
    # value); one instance per joint rollout (the team's world)
    environment_args: dict = field(default_factory=dict)  # keyword arguments for its constructor (JSON values):
    # TRL's environment_factory with arguments (a partial or a lambda) as a config can hold it
    max_tool_calls: int = 4  # tool calls per agent per turn (TRL's max_tool_calling_iterations)
    tool_timeout_s: float = 30.0  # seconds one tool call may take (past it: an error result, every world restarted;
    # above CodeTests' own sandbox limit, 2 + 3 x (examples + 1) s, so a looping draft gets the sandbox's "timeout")
    tool_workers: int = 1  # environment processes: world w in process w % tool_workers, a round's calls in parallel
    # across them, in order within each world (kit/sandbox/envpool.py); a timeout restarts only its world's process
    # --- sampling
    num_generations: int = 4  # G: samples per agent per prompt (the group)
    max_new_tokens: int = 256  # completion length cap
    max_prompt_tokens: int | None = None  # truncate longer prompts (None: never)
    temperature: float = 0.7  # sampling temperature (> 0 while training)
    top_p: float = 0.9  # nucleus sampling mass, in (0, 1]
    top_k: int = 0  # top-k sampling (0: off)
    use_chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    # --- algorithm and critics (issue 31)
    algorithm: str = "magrpo"  # magrpo, iac, maac, centralized, madpo or marlhf (CoMLRL's trainers; README)
    critic_type: str = "v"  # iac/maac: v = V(prompt), q = Q(prompt, completion)
    use_separate_critic: bool = True  # iac: a critic adapter + head per agent; false: a head on the agent's own adapter
    baseline: str = "mean"  # critic_type q: Q minus the group mean of Q, or counterfactual (maac: COMA's)
    value_loss_coef: float = 0.6  # weight of the value loss mean (V - y)^2 (CoMLRL's default and form: no 0.5)
    value_clip_range: float | None = None  # clip V to V_old +- this in the value loss (num_iterations > 1)
    advantage_normalization: bool = True  # iac/maac: each agent's advantages to mean 0, std 1 over the step
    critic_learning_rate: float | None = None  # AdamW rate of the critics (None: learning_rate)
    critic_warmup_steps: int = 0  # iac/maac: the first steps fit the critics only, the actors wait
    gae_lambda: float = 0.0  # multi-turn and games: 0 = TD(0) (CoMLRL's), 1 = Monte Carlo, between: GAE
    # --- MAGRPO
    joint_mode: str = "aligned"  # aligned (G joint actions) or cross (G^N)
    num_turns: int = 1  # turns per episode; > 1 uses the task's feedback
    discount: float = 1.0  # weight of later turns in the return
    advantage_mode: str = "mean"  # mean (paper Eq. 1), rloo, max (MAReMax), raw (MAREINFORCE; "none" is the same)
    scale_rewards: str = "none"  # divide advantages by a reward std: group, batch or none (true/false: group/none)
    advantage_clip: float | None = None  # clamp advantages to [-c, c] (None: off)
    loss_type: str = "sum"  # sum (paper Eq. 2), grpo, dr_grpo, token_mean = dapo = bnpo (kit/maths/losses.py)
    mask_truncated_completions: bool = False  # completions cut at max_new_tokens (no EOS) leave the loss
    num_iterations: int = 1  # optimizer steps per batch of samples; > 1: the clipped-ratio loss (TRL's name)
    epsilon: float = 0.2  # the ratio is clipped below at 1 - epsilon (num_iterations > 1)
    epsilon_high: float | None = None  # ... and above at 1 + epsilon_high (DAPO's clip-higher; None: epsilon)
    rollout_correction: str = "auto"  # sampler vs trainer: auto, none, token_truncate, sequence_mask (README)
    rollout_is_cap: float = 2.0  # importance ratios above this are truncated (or their sequences masked)
    score_at_sampling_temperature: bool = True  # the update's log-probs at `temperature` (false: at 1, older runs)
    beta: float = 0.0  # KL weight to the base model (adapter off); 0 skips the reference pass
    # --- more of TRL's update options (issue 33; kit/maths/losses.py has the equations, README the papers)
    importance_sampling_level: str = "token"  # the ratio per token, or per completion (sequence: GSPO)
    delta: float | None = None  # cap the unclipped ratio at delta (INTELLECT-2's two-sided clip; None: off)
    sapo_temperature_pos: float = 1.0  # loss_type=sapo: the gate's temperature for positive advantages
    sapo_temperature_neg: float = 1.05  # ... and for negative ones
    off_policy_mask_threshold: float | None = None  # drop completions with A < 0 and mean KL(sampler || policy) above
    use_bias_correction_kl: bool = False  # the KL term's tokens weighted by their importance ratio
    top_entropy_quantile: float = 1.0  # the policy term on this top share of tokens by entropy (1: every token)
    entropy_coef: float = 0.0  # TRL's entropy bonus: mean entropy of the kept tokens (0: off, none computed)
    multi_objective_aggregation: str = "sum_then_normalize"  # or normalize_then_sum: each reward normalised first
    reward_weights: list[float] | None = None  # weights of the reward functions (None: all 1)
    reward_processor: str = "identity"  # applied before advantages, e.g. "scale(0.25)|clamp(-1,1)"
    reward_workers: int = 0  # 0: rewards in the trainer thread; > 0: a pool of this many workers
    reward_pool: str = "thread"  # thread or process (process: task and reward must be picklable)
    # --- credit assignment without a critic (issue 31)
    grouping: str = "node"  # multi-turn groups: node (an agent's G samples at a node, AT-GRPO's), turn, agent (README)
    local_reward_weight: float = 0.0  # r_i = (1 - w) team + w local_i, local_i = Reward.parts["local_<i>"] (0: team)
    role_baseline_decay: float = 0.95  # advantage_mode=role: b <- decay * b + (1 - decay) * the role's mean return
    leniency: float = 0.0  # cross: a sample's return is (1 - k) mean + k max over its partners' answers (lenient)
    leniency_decay_steps: int = 0  # leniency falls linearly to 0 over this many steps (0: constant)
    # --- optimisation
    num_steps: int = 200  # training steps (each: batch_size items, all agents, all turns)
    batch_size: int = 4  # items per step
    micro_batch_size: int = 0  # rows per forward/backward in the update (0: all of an agent's rows at once)
    learning_rate: float = 1e-4  # AdamW learning rate of every adapter
    weight_decay: float = 0.0  # AdamW weight decay
    warmup_steps: int = 0  # linear warm-up from 0 over this many steps, under every lr_scheduler
    lr_scheduler: str = "constant"  # after the warm-up: constant, linear or cosine decay to 0 at num_steps
    max_grad_norm: float = 1.0  # clip each agent's gradient norm (0: off)
    seed: int = 0  # drives weights init, data order, sampling: the same seed gives the same run
    # --- preferences (issue 32): MADPO and MARLHF (kit/maths/preference.py, kit/trainers/preference_trainer.py; CoMLRL's names)
    preference_num_candidates: int = 4  # joint answers sampled per prompt for pairs (one batched call, aligned)
    pair_selection: str = "reward_gap"  # reward_gap (largest reward gaps first), all, random (seeded)
    preference_pairs_per_sample: int | None = 2  # pairs kept per prompt (None: every pair that is not a tie)
    preference_source: str = "reward"  # who prefers: reward (the joint reward) or judge (Claude, both orders)
    dpo_beta: float = 0.1  # madpo: beta in -log sigmoid(beta * sum_i Delta_i)
    dpo_reference: str = "base"  # madpo: base (Delta minus the base's, adapter off: DPO) or none (CoMLRL's MADPO)
    preference_refresh_every: int = 1  # madpo: new candidates from the current policy every this many steps
    reward_num_items: int = 32  # marlhf: train items whose candidates give the reward model's pairs, per fit
    reward_heldout_fraction: float = 0.25  # marlhf: share of those items kept out of the fit (rm/heldout_accuracy)
    reward_learning_rate: float = 1e-3  # marlhf: AdamW rate of the reward model's adapter and head (CoMLRL's name)
    reward_num_train_epochs: int = 4  # marlhf: passes over the pairs per fit (CoMLRL's name)
    reward_train_batch_size: int = 8  # marlhf: pairs per reward-model step (CoMLRL's name)
    reward_refresh_every: int = 0  # marlhf: refit on pairs from the current policy every this many steps (0: once)
    reward_model_reads_prompts: bool = True  # marlhf: the model reads each agent's prompt, then its answer (false:
    # the answers alone, for a rubric on the answers only; a TLDR post read twice is ~5x the answers' tokens)
    reward_model_pooling: str = "last"  # marlhf: the head reads the last token, or the mean / sum over the text's
    # tokens (sum: a score per token added up, which can count words: kit/engine/heads.py)
    marlhf_rl_algorithm: str = "magrpo"  # marlhf: the RL stage on the learnt reward: magrpo, iac or maac (critics)
    # --- run directory, logging, checkpoints
    run_dir: str = "checkpoints/run"  # where config, metrics, rollouts and checkpoints go
    mirror_dir: str | None = None  # also copy logs and each checkpoint here after saving (a Drive folder)
    eval_every: int = 50  # evaluate on held-out items every this many steps (0: never)
    save_every: int = 100  # checkpoint every this many steps (0: only at the end)
    keep_last: int = 3  # full checkpoints kept (resume from these)
    keep_history: int = 10  # older checkpoints' adapters kept, spread over the run, for evaluation (0: none)
    log_rollouts: bool = True  # write every joint action to rollouts.jsonl
    use_wandb: bool = False  # also log to Weights & Biases (when installed)
    wandb_project: str = "magrpo-kit"  # wandb project name
    progress: bool = True  # show a tqdm progress bar


CHOICES = {
    "quantization": ("auto", "4bit", "none"),
    "rollout_engine": ("auto", "hf", "compiled"),
    "generation_weights": ("auto", "copy", "4bit"),
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "joint_mode": ("aligned", "cross"),
    "advantage_mode": ("mean", "rloo", "max", "raw", "none", "marginal", "role", "mareinforce", "marloo", "maremax"),
    "grouping": ("node", "turn", "agent"),
    "scale_rewards": ("group", "batch", "none"),
    "loss_type": ("sum", "grpo", "dr_grpo", "token_mean", "dapo", "bnpo", "cispo", "sapo"),
    "importance_sampling_level": ("token", "sequence"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    "rollout_correction": ("auto", "none", "token_truncate", "sequence_mask"),
    "lr_scheduler": ("constant", "linear", "cosine"),
    "reward_pool": ("thread", "process"),
    "algorithm": ("magrpo", "iac", "maac", "centralized", "madpo", "marlhf"),
    "critic_type": ("v", "q"),
    "baseline": ("mean", "counterfactual"),
    "pair_selection": ("reward_gap", "all", "random"),
    "preference_source": ("reward", "judge"),
    "dpo_reference": ("base", "none"),
    "marlhf_rl_algorithm": ("magrpo", "iac", "maac"),
    "reward_model_pooling": ("last", "mean", "sum"),
}


# Fields that do not change what is trained: a resumed run may differ in these. The rollout engine and its weights
# change how samples are drawn, not the objective (the trainer's policy gradient): under rollout_correction=auto
# the correction follows the sampler, and a resume that changes it says so from which step (Trainer._resume).
NON_TRAINING = {"run_dir", "mirror_dir", "judge_budget_usd", "judge_timeout_s", "judge_max_retries",
                "judge_max_failures", "judge_cooldown_s", "eval_every", "save_every", "keep_last", "keep_history",
                "log_rollouts", "use_wandb", "wandb_project", "progress", "reward_workers", "reward_pool",
                "tool_workers", "num_eval_items", "device", "agent_devices", "num_steps",
                "rollout_engine", "generation_weights", "share_prompts"}


class ConfigError(ValueError):
    """A bad config value; the message names the field, the value and what is allowed."""


def preset(name: str) -> TrainConfig:
    """The TrainConfig of preset `name` (kit/run/presets.py), a fresh copy each call."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} does not exist; allowed: {', '.join(PRESETS)}")
    return TrainConfig(**copy.deepcopy(PRESETS[name]))


def _field_types() -> dict[str, typing.Any]:
    return typing.get_type_hints(TrainConfig)


def _check_type(name: str, value, hint) -> object:
    """Return value coerced to the field's type (int -> float only), or raise ConfigError."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            try:
                return _check_type(name, value, arg)
            except ConfigError:
                pass
        raise ConfigError(f"{name}={value!r} has the wrong type; allowed: {_type_name(hint)}")
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={value!r} has the wrong type; allowed: {_type_name(hint)}")
        return [_check_type(name, v, item) for v in value]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is dict and isinstance(value, dict):
        return dict(value)
    if hint in (int, float, str, bool) and type(value) is hint:
        return value
    raise ConfigError(f"{name}={value!r} has the wrong type; allowed: {_type_name(hint)}")


def _float_types(hint) -> set:
    """The plain types a field's hint admits, list items included: float for `float | None`, `list[float]`."""
    args = typing.get_args(hint)
    return {hint} if not args else set().union(*(_float_types(a) for a in args))


def _type_name(hint) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


# What a run's config.json meant for a field it does not hold (written before the field existed), where that
# differs from today's default: the run resumes and is analysed as it was trained.
SAVED_DEFAULTS = {"rollout_correction": "none", "score_at_sampling_temperature": False}


def _legacy(key: str, value):
    """Values older configs hold for a field whose type has changed since, and other names of a value."""
    if key == "scale_rewards" and (isinstance(value, bool) or str(value).lower() in ("true", "false")):
        return "group" if str(value).lower() == "true" else "none"  # a bool, or one as a `key=value` string
    if key == "advantage_mode":  # CoMLRL's names (marloo ...): config.json holds the kit's (rloo ...)
        from kit.maths.magrpo import ADVANTAGE_ALIASES  # the maths' table (imports numpy: only when asked)

        return ADVANTAGE_ALIASES.get(value, value)
    return value


def saved_values(values: dict) -> dict:
    """A saved run's config.json values, completed with what each missing field meant when it was written."""
    defaults = to_dict(TrainConfig())
    return {**{k: SAVED_DEFAULTS.get(k, v) for k, v in defaults.items()}, **values}


def from_dict(values: dict, base: TrainConfig | None = None) -> TrainConfig:
    """A copy of `base` (defaults if None) with `values` applied; unknown keys and wrong types fail."""
    cfg = dataclasses.replace(base) if base is not None else TrainConfig()
    hints = _field_types()
    for key, value in values.items():
        value = _legacy(key, value)
        if key == "environment":
            value = _environment(value)
        if key not in hints:
            near = [f for f in hints if key.lower() in f or f in key.lower()]
            hint = f"; did you mean {', '.join(near)}?" if near else "; see kit/run/fields.py for the fields"
            raise ConfigError(f"unknown config field {key!r}{hint}")
        setattr(cfg, key, _check_type(key, value, hints[key]))
    return cfg


def _environment(value):
    """A class given as TRL's environment_factory takes it, as the config holds it: "module:ClassName"."""
    from kit.sandbox.envclass import EnvironmentClassError, spec_of

    try:
        return spec_of(value)
    except EnvironmentClassError as err:
        raise ConfigError(str(err)) from None


def parse_override(text: str) -> tuple[str, object]:
    """`key=value` with the value read as YAML (so 1e-4, true, [1, 2] and null work); str fields stay raw."""
    import yaml

    if "=" not in text:
        raise ConfigError(f"override {text!r} is not key=value")
    key, raw = (part.strip() for part in text.split("=", 1))
    if _field_types().get(key) is str:
        return key, raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", value):
        value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
    return key, value


def load_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid JSON: {err.msg} at line {err.lineno} column "
                              f"{err.colno}") from None
    else:
        import yaml

        from kit.tasks import yaml_problem

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of field: value")
    return data


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def save(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
