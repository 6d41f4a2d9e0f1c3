"""Preference pairs from the Claude judge: two joint answers compared in both orders, inside the judge's budget.

    judge = Judge(run_dir, model=..., budget_usd=...)          # kit/judge/judge.py: the same ledger, cache and breaker
    prefer = JudgePreference(judge, rubric)
    prefer(a, b, task)   -> 1 (a is better), -1 (b is better), 0 (a tie), None (unscored)
    judged_pairs(K, lambda i, j: prefer(answers[i], answers[j], task), "all", 2)   -> [(winner, loser), ...]

`task` is what the agents were asked (their prompts, `render_task`): the judge compares answers to it.

Position bias: a judge tends to favour the answer it reads first (or second). Every comparison is asked twice,
once with a shown as A and once with b shown as A; a preference counts only when both orders agree, and a
disagreement is a tie (no pair). Both requests go through `Judge.ask`, so each is reserved against the hard
dollar cap before it is sent, written to budget.json, and answered from the cache when asked again.

A judge gives labels, not scores, so `pair_selection=reward_gap` (which needs a score per answer) does not apply
to it: pairs are asked in (i, j) order (`all`) or a seeded random order (`random`) until
`preference_pairs_per_sample` of them are not ties.

`oracle_judge` is a `Judge` whose client is a rule, not the API: it reads the two answers back from the request,
scores each with a function of the completions (e.g. the writing task's own reward parts) and replies
`PREFER: A|B|TIE` with a token count, so tests and benchmarks run the real budget, ledger and cache, priced by
`kit.judge.judge.PRICES`, without a key or a network.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

COMPARE_SYSTEM = ("You are a strict, fair grader comparing two answers to the same task. Judge only against the "
                  "rubric; the order in which the answers are shown does not matter.")
_PREFER = re.compile(r"prefer\s*[:=]\s*\**\s*(A|B|tie)\b", re.I)
_ANSWER = re.compile(r"^Answer (A|B):\n", re.M)
_AGENT = re.compile(r"^\[agent \d+\]\n?", re.M)  # an empty last answer loses its newline to the layout


def render(completions) -> str:
    """A joint answer as the judge reads it (JudgeReward's layout)."""
    return "\n\n".join(f"[agent {i}]\n{c}" for i, c in enumerate(completions))


def render_task(prompts) -> str:
    """What the agents were asked, as the judge reads it."""
    return "\n\n".join(f"[agent {i} was asked]\n{p}" for i, p in enumerate(prompts))


def compare_prompt(rubric: str, first: str, second: str, task: str = "") -> str:
    return (f"Rubric:\n{rubric}\n\n" + (f"Task:\n{task}\n\n" if task else "") +
            f"Answer A:\n{first}\n\nAnswer B:\n{second}\n\n"
            "Which answer is better? End your reply with a line `PREFER: A`, `PREFER: B` or `PREFER: TIE`.")


def parse_preference(reply: str | None) -> int | None:
    """The last `PREFER: A|B|TIE` of a reply as 1 (A), -1 (B), 0 (tie); None if absent."""
    found = _PREFER.findall(reply or "")
    return {"a": 1, "b": -1, "tie": 0}[found[-1].lower()] if found else None


def both_orders(first: int | None, second: int | None) -> int | None:
    """A's verdict with a shown first, and with b shown first (where 1 means b): agreement or a tie (0)."""
    if first is None or second is None:
        return None
    return first if first == -second else 0


class JudgePreference:
    """prefer(a, b, task) over two joint answers (tuples of completions) to `task`: the judge asked in both
    orders."""

    def __init__(self, judge, rubric: str):
        self.judge, self.rubric = judge, rubric

    def __call__(self, a, b, task: str = "") -> int | None:
        if not self.judge.enabled:
            return None
        ra, rb = render(a), render(b)
        first = parse_preference(self.judge.ask(COMPARE_SYSTEM, compare_prompt(self.rubric, ra, rb, task)))
        second = parse_preference(self.judge.ask(COMPARE_SYSTEM, compare_prompt(self.rubric, rb, ra, task)))
        return both_orders(first, second)


def judged_pairs(num_candidates: int, prefer, mode: str = "all", num_pairs: int | None = None,
                 rng: np.random.Generator | None = None) -> list[tuple[int, int]]:
    """(winner, loser) pairs among K answers labelled by `prefer(i, j)` (1: i better, -1: j better, 0 or None:
    no pair), asked in (i < j) order (`all`) or a seeded random order (`random`) until `num_pairs` are found."""
    order = [(i, j) for i in range(num_candidates) for j in range(i + 1, num_candidates)]
    if mode == "random":
        if rng is None:
            raise ValueError("pair_selection=random needs a seeded rng")
        order = [order[k] for k in rng.permutation(len(order))]
    elif mode != "all":
        raise ValueError(f"pair_selection={mode!r} with judge pairs; allowed: all, random (a judge gives labels, "
                         "not the scores reward_gap ranks by)")
    pairs = []
    for i, j in order:
        if num_pairs is not None and len(pairs) >= num_pairs:
            break
        verdict = prefer(i, j)
        if verdict:
            pairs.append((i, j) if verdict > 0 else (j, i))
    return pairs


class _OracleMessages:
    """The `messages.create` of an Anthropic client, answered by a rule over the two answers in the request (or,
    for `Judge.score`'s request, over the one text: `SCORE:` 10 x score / score_max)."""

    def __init__(self, score, bias: str = "", score_max: float = 1.0):
        self.score, self.bias, self.score_max, self.calls = score, bias, score_max, 0

    def create(self, model, max_tokens, system, messages):
        prompt = messages[0]["content"]
        self.calls += 1
        if "\nText to score:\n" in prompt:
            text = prompt.split("\nText to score:\n")[1].split("\n\nEnd your reply")[0]
            value = self.score(tuple(c.strip() for c in _AGENT.split(text)[1:]))
            text = f"SCORE: {10 * value / self.score_max:.4f}"
        else:
            text = f"PREFER: {self.bias}" if self.bias else self._verdict(prompt)
        usage = SimpleNamespace(input_tokens=(len(system) + len(prompt)) // 4 + 8, output_tokens=6)
        return SimpleNamespace(content=[SimpleNamespace(text=text)], usage=usage)

    def _verdict(self, prompt: str) -> str:
        parts = _ANSWER.split(prompt)  # [rubric, "A", text A, "B", text B + the question]
        a, b = parts[2].rstrip("\n"), parts[4].split("\n\nWhich answer is better?")[0]
        sa, sb = (self.score(tuple(c.strip() for c in _AGENT.split(x)[1:])) for x in (a, b))
        return "PREFER: " + ("A" if sa > sb else "B" if sb > sa else "TIE")


def oracle_judge(run_dir, score, model: str = "claude-haiku-4-5", budget_usd: float = 15.0, bias: str = "",
                 log=print, score_max: float = 1.0):
    """A kit.judge.judge.Judge whose client answers by `score(completions) -> float` (higher is better; at most
    `score_max` for `Judge.score`); `bias` "A" or "B" makes it always prefer that position (a judge with nothing
    but position bias)."""
    from kit.judge.judge import Judge

    judge = Judge(run_dir, model, budget_usd, max_tokens=16, api_key="", log=lambda *_: None)
    judge.log = judge.budget.log = log
    judge.client = SimpleNamespace(messages=_OracleMessages(score, bias, score_max))
    return judge
