"""Rewards: the Reward type, plain reward functions, weights, processors, and batched scoring.

A reward is the joint reward of one joint action. Three ways to give one, all accepted by the trainer:

    task.reward(item, completions) -> Reward(total, parts)      # a task's own, with named parts
    def my_reward(item, completions) -> float                    # a plain function (CoMLRL/TRL style)
    reward_funcs=[f, g], reward_weights=[1.0, 0.5]               # several, weighted, each logged separately
    def my_reward(item, completions, environment) -> float       # with an environment: its world (EnvView)

Processors (`scale(0.25)|clamp(-1,1)`, also `sigmoid`, `shift(x)`, `identity`) transform the combined total before
advantages (each reward's value under `multi_objective_aggregation=normalize_then_sum`); they compose left to right.

Logging from a reward: inside any reward function, `kit.tasks.rewards.log_metric("length", n)` records one value for
the joint action being scored (the last call per name wins). The values travel with the Reward (details["logged"]),
so they work in the trainer's thread, in worker threads and in worker processes; each step's mean lands in
metrics.jsonl as `reward_log/<name>`, in the live curve, and in the joint action's rollout row (`logged`). Outside
a scoring call (or from a thread the reward function starts itself) log_metric does nothing. Scoring a batch runs
either in the trainer's thread or in a pool of worker threads or processes (`reward_workers`, `reward_pool`);
code-executing rewards should use threads and start their own sandboxed subprocesses.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import math
import re
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Reward:
    """The joint reward of one joint action, its named components, and (optionally) what a task found while
    scoring (failing tests, errors) for its multi-turn feedback; details are not logged as metrics."""

    total: float
    parts: dict[str, float] = field(default_factory=dict)
    details: dict = field(default_factory=dict, compare=False)


def as_reward(value) -> Reward:
    if isinstance(value, Reward):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Reward(float(value))
    raise TypeError(f"a reward must be a float or a kit.tasks.rewards.Reward, got {type(value).__name__}: {value!r}")


# --- processors


def _scale(factor: float) -> Callable[[float], float]:
    return lambda x: x * factor


def _shift(value: float) -> Callable[[float], float]:
    return lambda x: x + value


def _clamp(low: float, high: float) -> Callable[[float], float]:
    return lambda x: min(max(x, low), high)


def _sigmoid() -> Callable[[float], float]:
    return lambda x: 1.0 / (1.0 + math.exp(-x))


def _identity() -> Callable[[float], float]:
    return lambda x: x


PROCESSORS = {"scale": _scale, "shift": _shift, "clamp": _clamp, "sigmoid": _sigmoid, "identity": _identity}


def compose(*fns: Callable[[float], float]) -> Callable[[float], float]:
    """Apply fns left to right."""

    def run(x: float) -> float:
        for f in fns:
            x = f(x)
        return x

    return run


@functools.lru_cache(maxsize=32)  # called per joint action; a spec is parsed once
def parse_processor(spec: str) -> Callable[[float], float]:
    """`"scale(0.25)|clamp(-1, 1)"` -> a function. Raises ValueError naming the bad piece."""
    fns = []
    for piece in (p.strip() for p in spec.split("|")):
        m = re.fullmatch(r"(\w+)\s*(?:\((.*)\))?", piece)
        if not m or m.group(1) not in PROCESSORS:
            raise ValueError(f"unknown processor {piece!r}; allowed: {', '.join(PROCESSORS)}, joined with |")
        args = [float(a) for a in m.group(2).split(",") if a.strip()] if m.group(2) else []
        try:
            fns.append(PROCESSORS[m.group(1)](*args))
        except TypeError:
            raise ValueError(f"processor {piece!r} takes other arguments") from None
    return compose(*fns)


# --- logging from a reward function

_LOGGED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("kit_reward_log", default=None)


def log_metric(name: str, value: float) -> None:
    """Record `value` under `name` for the joint action being scored (see the module docstring)."""
    logged = _LOGGED.get()
    if logged is not None:
        logged[str(name)] = float(value)


# --- combining


@dataclass
class RewardModel:
    """A task's reward and/or plain reward functions, weighted, then processed. Picklable if its parts are."""

    task: object | None = None
    funcs: list[Callable] = field(default_factory=list)
    weights: list[float] | None = None
    processor: str = "identity"

    def __post_init__(self):
        n = len(self.funcs) + self._has_task_reward()
        if n == 0:
            raise ValueError("no reward: give a task with a reward(item, completions) method or reward functions")
        if self.weights is not None and len(self.weights) != n:
            raise ValueError(f"reward_weights has {len(self.weights)} entries for {n} rewards "
                             f"(the task's own reward counts as the first)")

    def __call__(self, item: dict, completions: tuple[str, ...], environment=None) -> Reward:
        """Combined raw reward; parts hold the task's parts and each function's value by name. A reward function
        with an `environment` parameter also gets the joint action's world (kit.sandbox.envhost.EnvView; None in a
        run without an environment), as TRL passes its reward functions the environments."""
        sources = self._sources()
        weights = self.weights or [1.0] * len(sources)
        total, parts, details, unscored = 0.0, {}, {}, {}
        logged = {}
        token = _LOGGED.set(logged)  # this call's own dict: a thread or process scores one joint action at a time
        try:
            scored = [as_reward(fn(item, tuple(completions), environment=environment) if takes_environment(fn)
                                else fn(item, tuple(completions))) for fn in sources]
        finally:
            _LOGGED.reset(token)
        for i, (fn, w, r) in enumerate(zip(sources, weights, scored)):
            total += w * r.total
            parts.update(r.parts)
            own = dict(r.details)
            if own.pop("unscored", False):  # left out of the group's comparison: see impute_unscored
                unscored[_name(fn, i)] = w
            details.update(own)
            if len(sources) > 1 or not r.parts or _name(fn, i) in unscored:
                parts[_name(fn, i)] = r.total
        if unscored:
            details["unscored"] = unscored
        if logged:
            details["logged"] = logged
        return Reward(total, parts, details)

    def _sources(self) -> list[Callable]:
        return ([self.task.reward] if self._has_task_reward() else []) + list(self.funcs)

    def source_names(self) -> list[str]:
        """The name of each reward (the task's first), under which a Reward's parts hold its value."""
        return [_name(fn, i) for i, fn in enumerate(self._sources())]

    def source_values(self, reward: Reward) -> list[float]:
        """Each reward's own value in a combined Reward (after `impute_unscored`), in `source_names` order."""
        names = self.source_names()
        if len(names) == 1:
            return [reward.total]
        return [reward.parts[name] for name in names]

    def _has_task_reward(self) -> bool:
        from kit.tasks import has

        return self.task is not None and has(self.task, "reward")

    def process(self, total: float) -> float:
        return parse_processor(self.processor)(total)


class EnvironmentReward(RewardModel):
    """The reward model of a run whose environment owns the reward (get_reward()) and has no other reward: the
    trainer and evaluation read each world's reward from the rollout (kit/engine/tools.py); this keeps the run's
    reward_processor and the part's name, "environment". Whether the class has a get_reward() is checked when it is
    loaded (kit.trainers.assemble)."""

    def __init__(self, environment: str, processor: str = "identity"):
        def environment_reward(item, completions):
            raise RuntimeError(f"the environment {environment} owns the reward: it is read from get_reward() after "
                               "each rollout, not from the completions' text alone")

        environment_reward.__name__ = "environment"
        super().__init__(None, [environment_reward], None, processor)


def _name(fn, i: int) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if name == "reward" and hasattr(fn, "__self__"):
        name = getattr(fn.__self__, "name", "task")
    return name if name != "<lambda>" else f"reward_{i}"


def takes_environment(fn) -> bool:
    """Whether a reward function asks for the joint action's environment (a parameter named `environment`)."""
    try:
        return "environment" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _score_one(model: RewardModel, item: dict, completions: tuple[str, ...], *environment) -> Reward:
    return model(item, completions, *environment)


class Scorer:
    """Scores many joint actions; `submit` returns futures so the caller can work while they run."""

    def __init__(self, model: RewardModel, workers: int = 0, pool: str = "thread"):
        self.model = model
        self.executor: Executor | None = None
        if workers > 0:
            if pool == "process":
                import multiprocessing as mp

                # spawn: forking a process that holds torch threads can deadlock
                self.executor = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
            else:
                self.executor = ThreadPoolExecutor(workers)

    def submit(self, jobs: list[tuple]) -> list[Future]:
        """jobs: (item, completions) or (item, completions, environment) each; a future Reward per job."""
        if self.executor is None:
            out = []
            for job in jobs:
                f: Future = Future()
                try:
                    f.set_result(self.model(*job))
                except BaseException as e:  # surfaces at .result(), like a pool's future
                    f.set_exception(e)
                out.append(f)
            return out
        return [self.executor.submit(_score_one, self.model, *job) for job in jobs]

    def score(self, jobs: list[tuple[dict, tuple[str, ...]]]) -> list[Reward]:
        return [f.result() for f in self.submit(jobs)]

    def close(self):
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


class JudgeReward:
    """`reward_funcs=[JudgeReward(judge, rubric)]`: the judge's score of the joint output, in [0, 1].

    An unscored joint action (judge off, over budget, breaker open, failed call, no score in the reply) is not a
    bad one: it returns 0.0 marked `unscored` (details), and `impute_unscored`, applied by the trainer to each
    group before advantages, replaces its judge term by the mean of the scored ones in the group, so the judge
    term gives it no advantage either way (a group with none scored keeps 0.0 everywhere: a constant, no
    advantage). The `judge_unscored` part (1.0 or 0.0) says which; its metric `reward/judge_unscored` is the share
    of a step's joint actions left unscored."""

    def __init__(self, judge, rubric: str, render=None):  # judge: a kit.judge.judge.Judge
        self.judge, self.rubric = judge, rubric
        self.render = render or (lambda item, comps: "\n\n".join(f"[agent {i}]\n{c}" for i, c in enumerate(comps)))
        self.__name__ = "judge"

    def __call__(self, item: dict, completions: tuple[str, ...]):
        score = self.judge.score(self.rubric, self.render(item, completions)) if self.judge.enabled else None
        return Reward(score or 0.0, {"judge": score or 0.0, "judge_unscored": float(score is None)},
                      {"unscored": score is None})


def impute_unscored(group: list[Reward]) -> list[Reward]:
    """The rewards of one group (the joint actions whose returns one advantage baseline compares), with every
    unscored term (`details["unscored"]`: {part name: weight}, set by RewardModel) replaced by the mean of that
    term over the group's scored joint actions; the total moves by weight x (mean - 0). The group's mean of the
    term is then that of the scored ones and an unscored joint action sits exactly on it: the term contributes
    no advantage to it, and the scored ones are compared among themselves. Where none is scored the term stays
    0.0 for all (a constant). A joint action with nothing unscored is returned as it is."""
    names = {name for r in group for name in (r.details or {}).get("unscored", {})}
    if not names:
        return group
    out = list(group)
    for name in names:
        scored = [r.parts.get(name, 0.0) for r in group if name not in (r.details or {}).get("unscored", {})]
        if not scored:
            continue
        mean = sum(scored) / len(scored)
        for i, r in enumerate(out):
            weight = (r.details or {}).get("unscored", {}).get(name)
            if weight is not None:
                out[i] = Reward(r.total + weight * (mean - r.parts.get(name, 0.0)), {**r.parts, name: mean},
                                r.details)
    return out


DEFAULT_RUBRIC = "How well do the agents' outputs fit together and solve the task? 10: excellent, 0: useless."


def reward_model_for(cfg, task, reward_funcs=(), log=print) -> RewardModel:
    """A run's reward, built one way for training and for evaluation: the task's own reward, plain reward
    functions, and the Claude judge when the config asks for it (its score as a reward, its advice as feedback),
    weighted by `reward_weights` (the task's reward first) and processed by `reward_processor`."""
    from kit.tasks import has

    funcs = list(reward_funcs)  # the judge, when asked for, comes last (after the task's reward and these)
    if cfg.judge_model and (cfg.use_judge_reward or cfg.judge_feedback):
        from kit.judge.judge import Judge

        judge = Judge(cfg.run_dir, cfg.judge_model, cfg.judge_budget_usd, timeout=cfg.judge_timeout_s,
                      max_retries=cfg.judge_max_retries, max_failures=cfg.judge_max_failures,
                      cooldown_s=cfg.judge_cooldown_s, log=log)
        if cfg.use_judge_reward:
            funcs.append(JudgeReward(judge, getattr(task, "judge_rubric", None) or DEFAULT_RUBRIC))
        if cfg.judge_feedback:
            if not has(task, "attach_judge"):
                raise ValueError(f"judge_feedback=true but task {cfg.task!r} takes no judge feedback")
            task.attach_judge(judge)
    if getattr(cfg, "environment", None) and not funcs and not has(task, "reward"):
        return EnvironmentReward(cfg.environment, cfg.reward_processor)
    return RewardModel(task, funcs, cfg.reward_weights, cfg.reward_processor)

