"""Digit sum: a cooperative toy task the tiny model learns on a CPU in about a minute.

The prompt names a target t in 0..9N. Each of the N agents answers with one digit; the team scores when the
digits add up to t. No agent can earn the joint part alone: for most targets the right digit for agent 0
depends on what agent 1 says, so the two must settle on a split. The reward (max 1.0):

    format (max 0.2): 0.2 x the share of agents whose answer starts with a digit
    sum    (max 0.8): when all answered with a digit, 0.8 x max(0, 1 - |sum - t| / tolerance), tolerance 6

A random policy scores about 0.01; the best constant answer (ignoring the target) about 0.45, so a team
above 0.8 reads the target and has agreed on a split. Multi-turn: `feedback` tells each agent the team's sum and
its own digit, so the second turn can correct the first.

Items: every target once per split; eval uses the same targets (it measures the greedy policy, not
generalisation, which is what a toy can honestly show).
"""

from __future__ import annotations

from kit.tasks.rewards import Reward
from kit.tasks import check_arg, is_int, is_number


class DigitSum:
    name = "toy"

    def __init__(self, num_agents: int = 2, copies: int = 1, tolerance: float = 6.0, format_weight: float = 0.2,
                 max_target: int | None = None):
        check_arg(is_int(copies) and copies >= 1, "copies", copies, "an integer >= 1")
        check_arg(is_number(tolerance) and tolerance > 0, "tolerance", tolerance, "a number > 0")
        check_arg(is_number(format_weight) and 0 <= format_weight <= 1, "format_weight", format_weight,
                  "a number in [0, 1]")
        check_arg(max_target is None or (is_int(max_target) and max_target >= 0), "max_target", max_target,
                  "null or an integer >= 0")
        self.num_agents = num_agents
        self.roles = [f"digit_{i}" for i in range(num_agents)]
        self.copies = copies
        self.tolerance = tolerance
        self.format_weight = format_weight
        self.max_target = 9 * num_agents if max_target is None else max_target

    def load(self, split: str = "train") -> list[dict]:
        if split not in ("train", "eval"):
            raise ValueError(f"split={split!r}; allowed: train, eval")
        copies = self.copies if split == "train" else 1
        return [{"id": f"sum{t}_{c}", "target": t} for c in range(copies) for t in range(self.max_target + 1)]

    def prompts(self, item: dict) -> list[str]:
        return [f"a{i} sum {item['target']}" for i in range(self.num_agents)]

    @staticmethod
    def digit(text: str) -> int | None:
        text = text.strip()
        return int(text[0]) if text and text[0] in "0123456789" else None

    def reward(self, item: dict, completions: tuple[str, ...]) -> Reward:
        digits = [self.digit(c) for c in completions]
        fmt = self.format_weight * sum(d is not None for d in digits) / len(digits)
        total_sum = 0.0
        if all(d is not None for d in digits):
            total_sum = (1 - self.format_weight) * max(0.0, 1.0 - abs(sum(digits) - item["target"]) / self.tolerance)
        return Reward(fmt + total_sum, {"format": fmt, "sum": total_sum})

    def is_pass(self, reward: Reward) -> bool:
        """For pass@k: the digits add up to the target exactly."""
        return reward.total >= 1.0 - 1e-9

    def single_prompt(self, item: dict) -> str:
        """The single-model baseline: one model answers every agent's digit, in a row."""
        return f"all sum {item['target']}"

    def split_single(self, item: dict, text: str) -> tuple[str, ...]:
        text = text.strip()
        return tuple(text[i:i + 1] for i in range(self.num_agents))

    def feedback(self, item: dict, completions: tuple[str, ...], reward: Reward) -> list[str]:
        digits = [self.digit(c) for c in completions]
        got = sum(d for d in digits if d is not None)
        return [f"sum {item['target']} a{i} had {digits[i] if digits[i] is not None else '?'} got {got}"
                for i in range(self.num_agents)]


def make_task(num_agents: int = 2, **kwargs) -> DigitSum:
    return DigitSum(num_agents=num_agents, **kwargs)
