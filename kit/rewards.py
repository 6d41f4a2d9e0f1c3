"""Rewards: the Reward type, plain reward functions, weights, processors, and batched scoring.

A reward is the joint reward of one joint action. Three ways to give one, all accepted by the trainer:

    task.reward(item, completions) -> Reward(total, parts)      # a task's own, with named parts
    def my_reward(item, completions) -> float                    # a plain function (CoMLRL/TRL style)
    reward_funcs=[f, g], reward_weights=[1.0, 0.5]               # several, weighted, each logged separately

Processors (`scale(0.25)|clamp(-1,1)`, also `sigmoid`, `shift(x)`, `identity`) transform the combined total before
advantages; they compose left to right. Scoring a batch runs either in the trainer's thread or in a pool of
worker threads or processes (`reward_workers`, `reward_pool`); code-executing rewards should use threads and
start their own sandboxed subprocesses.
"""

from __future__ import annotations

import functools
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
    raise TypeError(f"a reward must be a float or a kit.rewards.Reward, got {type(value).__name__}: {value!r}")


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

    def __call__(self, item: dict, completions: tuple[str, ...]) -> Reward:
        """Combined raw reward; parts hold the task's parts and each function's value by name."""
        sources = ([self.task.reward] if self._has_task_reward() else []) + list(self.funcs)
        weights = self.weights or [1.0] * len(sources)
        total, parts, details = 0.0, {}, {}
        for i, (fn, w) in enumerate(zip(sources, weights)):
            r = as_reward(fn(item, tuple(completions)))
            total += w * r.total
            parts.update(r.parts)
            details.update(r.details)
            if len(sources) > 1 or not r.parts:
                parts[_name(fn, i)] = r.total
        return Reward(total, parts, details)

    def _has_task_reward(self) -> bool:
        from kit.tasks import has

        return self.task is not None and has(self.task, "reward")

    def process(self, total: float) -> float:
        return parse_processor(self.processor)(total)


def _name(fn, i: int) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if name == "reward" and hasattr(fn, "__self__"):
        name = getattr(fn.__self__, "name", "task")
    return name if name != "<lambda>" else f"reward_{i}"


def _score_one(model: RewardModel, item: dict, completions: tuple[str, ...]) -> Reward:
    return model(item, completions)


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

    def submit(self, jobs: list[tuple[dict, tuple[str, ...]]]) -> list[Future]:
        if self.executor is None:
            out = []
            for item, comps in jobs:
                f: Future = Future()
                try:
                    f.set_result(self.model(item, comps))
                except BaseException as e:  # surfaces at .result(), like a pool's future
                    f.set_exception(e)
                out.append(f)
            return out
        return [self.executor.submit(_score_one, self.model, item, comps) for item, comps in jobs]

    def score(self, jobs: list[tuple[dict, tuple[str, ...]]]) -> list[Reward]:
        return [f.result() for f in self.submit(jobs)]

    def close(self):
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


class JudgeReward:
    """`reward_funcs=[JudgeReward(judge, rubric)]`: the judge's score of the joint output, 0 when unscored.

    Unscored items (judge off, over budget, failed call) get 0.0; their share is visible as the `judge_unscored`
    metric, since the trainer logs each reward function by name."""

    def __init__(self, judge, rubric: str, render=None):  # judge: a kit.judge.Judge
        self.judge, self.rubric = judge, rubric
        self.render = render or (lambda item, comps: "\n\n".join(f"[agent {i}]\n{c}" for i, c in enumerate(comps)))
        self.__name__ = "judge"

    def __call__(self, item: dict, completions: tuple[str, ...]):
        score = self.judge.score(self.rubric, self.render(item, completions)) if self.judge.enabled else None
        return Reward(score or 0.0, {"judge": score or 0.0, "judge_unscored": float(score is None)})


DEFAULT_RUBRIC = "How well do the agents' outputs fit together and solve the task? 10: excellent, 0: useless."


def reward_model_for(cfg, task, reward_funcs=(), log=print) -> RewardModel:
    """A run's reward, built one way for training and for evaluation: the task's own reward, plain reward
    functions, and the Claude judge when the config asks for it (its score as a reward, its advice as feedback),
    weighted by `reward_weights` (the task's reward first) and processed by `reward_processor`."""
    from kit.tasks import has

    funcs = list(reward_funcs)  # the judge, when asked for, comes last (after the task's reward and these)
    if cfg.judge_model and (cfg.use_judge_reward or cfg.judge_feedback):
        from kit.judge import Judge

        judge = Judge(cfg.run_dir, cfg.judge_model, cfg.judge_budget_usd, log=log)
        if cfg.use_judge_reward:
            funcs.append(JudgeReward(judge, getattr(task, "judge_rubric", None) or DEFAULT_RUBRIC))
        if cfg.judge_feedback:
            if not has(task, "attach_judge"):
                raise ValueError(f"judge_feedback=true but task {cfg.task!r} takes no judge feedback")
            task.attach_judge(judge)
    return RewardModel(task, funcs, cfg.reward_weights, cfg.reward_processor)

