"""Built-in environments: TRL-style classes run by kit/sandbox/envhost.py, `environment=kit.tasks.environments:<Name>`.

    KeyHalves   an information game for two agents (task=rows, the rows of `key_rows`): each reaches one half of a
                secret key only through its own tools and submits it; the team scores the share of the key its two
                submissions rebuild. The optimum is exactly 1.0 (both read, both submit their half).
    Board       the sequential and discussion schedules as an environment, so they are trained, not only baselines:
                each agent may `post(text)` its draft and `read()` what its teammates posted (a teammate's post in
                the same round is seen when its call runs first: calls run in agent order, so the helper's post
                reaches main at once, the sequential schedule; drafts read in a later round: the discussion).
                Any task; its reward stays the task's.
    CodeTests   the code task with a test tool: `run_tests(code)` runs a draft against the problem's VISIBLE examples
                (its docstring's doctests and one-line `f(x) == y` examples) in the kit's sandbox, never its hidden
                asserts, after the problem's own code and with the team's latest tested definitions of the functions
                it does not define (main's draft runs with the helper's `aux`); the reward stays the level reward of
                the final answers (the task's own).

Each class is built once per world and reset with the world's row each step (TRL's "construct once, reset often").
"""

from __future__ import annotations

import ast
import doctest
import json
import random
import re
from pathlib import Path

from kit.tasks.codeparse import extract_code, parse_error, top_functions


class KeyHalves:
    """Two agents, `left` and `right`; the key is six digits, the left agent's half its first three, the right's the
    last three. get_reward = 0.25 for each agent that read its half + 0.5 x the share of the key's digits that the
    two submissions (left's then right's) put in their places. A team that does both steps scores exactly 1.0. An
    agent's first submission is final (a later one answers "already submitted" and changes nothing).
    get_agent_rewards = each role's own share: 0.5 if it read its half + 0.5 x the share of its half's digits its
    submission put in their places; their mean is get_reward. A key has exactly six characters (reset refuses
    others: the halves and the optimum of 1.0 depend on it)."""

    tools_by_role = {"left": ["read_left", "submit_left"], "right": ["read_right", "submit_right"]}

    def __init__(self):
        self.key, self.read, self.submitted = "", set(), {}

    def reset(self, key: str = "", **row) -> str:
        self.key = str(key)
        if len(self.key) != 6:
            raise ValueError(f"KeyHalves needs a key of six characters (a JSON string, e.g. \"012345\"); got "
                             f"{key!r}")
        self.read, self.submitted = set(), {}
        return "The key has six digits. Read your half with your read tool, then submit it with your submit tool."

    def read_left(self) -> str:
        """Read the left half of the key (its first three digits).

        Returns:
            The three digits.
        """
        self.read.add("left")
        return self.key[:3]

    def read_right(self) -> str:
        """Read the right half of the key (its last three digits).

        Returns:
            The three digits.
        """
        self.read.add("right")
        return self.key[3:]

    def submit_left(self, digits: str) -> str:
        """Submit the left half of the key.

        Args:
            digits: The three digits of the left half.
        """
        return self._submit("left", digits)

    def submit_right(self, digits: str) -> str:
        """Submit the right half of the key.

        Args:
            digits: The three digits of the right half.
        """
        return self._submit("right", digits)

    def _submit(self, side: str, digits) -> str:
        if side in self.submitted:  # a submission is final: a later one cannot overwrite it
            return f"already submitted ({self.submitted[side]}): a submission is final"
        self.submitted[side] = str(digits)
        return "submitted"

    def get_reward(self) -> float:
        return sum(self.get_agent_rewards().values()) / 2

    def get_agent_rewards(self) -> dict[str, float]:
        return {side: 0.5 * (side in self.read) + 0.5 * self._placed(side, half)
                for side, half in (("left", self.key[:3]), ("right", self.key[3:]))}

    def _placed(self, side: str, half: str) -> float:
        """The share of `half`'s digits that `side`'s submission put in their places."""
        digits = "".join(c for c in self.submitted.get(side, "") if c.isdigit())[:3].ljust(3)
        return sum(a == b for a, b in zip(digits, half)) / 3


def key_rows(path: str | Path, n: int, seed: int = 0) -> Path:
    """Write `n` rows of the KeyHalves game (a random six-digit key each) as JSONL; returns the path."""
    rng = random.Random(seed)
    prompt = ("Your team must hand in a secret key. Only your own tools can see your half of it. Call your tools "
              "to read your half and to submit it.")
    lines = [json.dumps({"id": f"key{i}", "prompt": prompt, "key": f"{rng.randrange(10**6):06d}"}) for i in range(n)]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


class Board:
    """A board the team shares: `post` a draft, `read` the teammates' (see the module docstring).

    A post is labelled with its author's role, which the kit sets as `caller` before each call (envhost's third
    optional part), not with an argument: the untrained 0.5B coder filled an `author` argument with its schema's
    description ("Your role, so that teammates know whose draft it is.") in 18 of the 25 posts that gave one, and
    none with a role (the discussion runs of seeds 23-24, bench/README.md), so no agent could tell whose draft it
    read. `read` marks the reader's own posts "(you)" (a team of two agents of one role cannot be told apart: give
    the roles different names). Run without the kit (no caller), posts are "agent 1", "agent 2", ... in order.

    `next_step` (environment_args), when given, ends every result: what to do after the call. The untrained 0.5B
    coder, told only that its calls were spent, wrote its call again as its answer (every joint action 0,
    bench/README.md); the code task's sentence: "Now give your final code in a ```python block, without a call."."""

    caller = ""  # the role of the agent whose call runs (set by the kit)

    def __init__(self, next_step: str = ""):
        self.posts: list[tuple[str, str]] = []
        self.next_step = str(next_step)

    def reset(self, **item) -> str:
        self.posts = []
        return "Your team shares a board: post your draft for your teammates, and read theirs, with your tools."

    def post(self, text: str) -> str:
        """Post a draft on the team's board for your teammates to read.

        Args:
            text: The draft (code or text) to share.
        """
        self.posts.append((self.caller or f"agent {len(self.posts) + 1}", str(text)))
        return self._then(f"posted ({len(self.posts)} on the board)")

    def read(self) -> str:
        """Read every draft on the team's board.

        Returns:
            The drafts, each with its author's role, oldest first.
        """
        if not self.posts:
            return self._then("the board is empty")
        return self._then("\n\n".join(f"[{author}{' (you)' if self.caller and author == self.caller else ''}]\n{text}"
                                       for author, text in self.posts))

    def _then(self, result: str) -> str:
        return f"{result}\n{self.next_step}" if self.next_step else result


# what a run_tests result ends with: the next step, as a final answer is what the reward reads (the untrained 0.5B coder,
# told nothing, sent the same call again until its calls ran out: bench/README.md, "CodeTests"). FIX reads right with
# or without a call left (the environment does not know the budget; before, it said "call run_tests again", and
# NO_CALLS_LEFT after it said the opposite to an agent on its last call)
DONE = "Now give your final code in a ```python block, without a call."
FIX = ("Fix the code and give your final code in a ```python block (test it with run_tests first if you have a call "
       "left).")


class CodeTests:
    """The code task's helper and main may call `run_tests(code)` on a draft before answering: the draft runs in the
    kit's sandbox against the problem's visible examples (`visible_examples`: its docstring's), never the hidden
    asserts.

    A draft runs as the answer will: after the problem's own code (its imports, e.g. HumanEval's `from typing import
    List`), and with the team's latest tested definitions of the functions it does not define itself (main's draft
    that calls `aux` runs with the helper's last tested `aux`; the world is the team's, and calls run in agent order,
    so the helper's draft of a round reaches main's draft of the same round). A draft without the entry point, and
    no tested one of it to run with (the helper's `aux` in the first round), only runs; one that does not parse is
    said to, with its own line, and nothing runs. A draft sent in a ```python fence runs as its code. Each result
    ends with the next step (DONE, FIX): the reward reads the final answer."""

    def __init__(self):
        self.prompt, self.entry_point, self.context, self.examples = "", "", "", []
        self.drafts: dict[str, str] = {}  # function name -> the source of its latest tested definition

    def reset(self, prompt: str = "", entry_point: str = "", context: str = "", **item) -> str | None:
        """Tells the agents of the tool when the problem has examples to run (else they are told nothing: the tool
        could only say that the code runs)."""
        self.prompt, self.entry_point, self.context = str(prompt), str(entry_point), str(context or "")
        self.examples, self.drafts = visible_examples(self.prompt, self.entry_point), {}
        if self.examples:
            return (f"You can check a draft before you answer: run_tests(code) runs it (with your teammate's latest "
                    f"tested functions that it calls) on the docstring's {len(self.examples)} example(s) and says "
                    f"which pass. Then give your final code.")
        return None

    def run_tests(self, code: str) -> str:
        """Run a draft of the code against the problem's visible examples.

        Args:
            code: The Python code to run (the functions the answer defines).

        Returns:
            Which examples passed, and why the others failed.
        """
        from kit.sandbox.sandbox import run

        draft = extract_code(str(code)) or str(code)
        broken = parse_error(draft)  # as the reward's syntax level reads it
        if broken:  # said with the draft's own line (the program's lines count the problem's code and other drafts)
            line = (broken.text or "").strip()[:120]
            where = f" (line {broken.lineno}" + (f": {line})" if line else ")") if broken.lineno else ""
            return f"the code does not parse: {type(broken).__name__}: {broken.msg}{where}\n{FIX}"
        mine = top_functions(draft)
        program = "\n\n".join(part.strip("\n") for part in (
            self.context, *(src for name, src in self.drafts.items() if name not in mine), draft) if part.strip())
        self.drafts.update(mine)
        untested = not self.examples or bool(self.entry_point) and self.entry_point not in self.drafts
        if untested:  # nothing to check (a helper's aux before any draft of the entry point only runs)
            result = run(program + "\n", [])
            why = ("no visible examples" if not self.examples
                   else f"the examples call {self.entry_point}, which no tested draft defines yet")
            ran = f"the code ran with an error: {result.error}" if result.error else "the code ran"
            return f"{why}; {ran}\n{FIX if result.error else DONE}"
        result = run(program + "\n", self.examples, context=self.context,  # the checker has the problem's code too,
                     call_names=[self.entry_point] if self.entry_point else ())  # as in the task's reward
        lines = [f"{'ok' if ok else 'FAILED'}: {test}" + ("" if ok else f" ({why})")
                 for test, ok, why in zip(self.examples, result.passed, result.reasons)]
        if not lines:
            return f"the code did not run: {result.error}\n{FIX}"
        return "\n".join(lines) + "\n" + (DONE if all(result.passed) else FIX)


def visible_examples(prompt: str, entry_point: str = "") -> list[str]:
    """The examples a problem's statement shows, as asserts: its doctests (`>>> f(1)` then `2` -> `assert f(1) == 2`),
    then, given the entry point, its one-line examples in the other forms HumanEval writes them in (`f(1) == 2`,
    `f(1) ==> 2`, `f(1) => 2`, `f(1) ➞ 2`, `f(1) -> 2`, `f(1)  # returns 2`, `f(1) returns 2`; `true`/`false` read as
    Python's). A one-line example is kept only when it is a call of the entry point on literal arguments and its value
    is a literal (`is_happy(a) => False` names a variable the draft cannot have, `f(5) -> 5 - 1 = 4` is no value):
    an example that cannot run would fail every draft. Each assert once, in the order written."""
    out = []
    for example in doctest.DocTestParser().get_examples(prompt):
        source = example.source.strip()
        want = example.want.split('"""')[0].split("'''")[0].strip()  # the docstring's end is not the value
        if source and want and "\n" not in source:
            out.append(f"assert {source} == {want}")
    if entry_point:
        call = re.compile(rf"(?<![\w.]){re.escape(entry_point)}\s*\(")
        for line in prompt.splitlines():
            start = call.search(line)
            if start and not line.lstrip().startswith(">>>"):
                out.append(_line_example(line[start.start():], entry_point))
    return list(dict.fromkeys(test for test in out if test))


# what separates a call from its value in HumanEval's one-line examples, longest first at each position
_GIVES = re.compile(r"==>|=>|==|➞|->|→|#\s*(?:returns?|=>|->|==>)|\bshould return\b|\breturns?\b")
_WORDS = {"true": "True", "false": "False"}


def _line_example(text: str, entry_point: str) -> str:
    """`text` (a line from the entry point's call on) as `assert <call> == <value>`, split at the first separator
    that leaves a call of the entry point on literals and a literal value; "" when none does."""
    for gives in _GIVES.finditer(text):
        left, right = text[:gives.start()].strip(), text[gives.end():].strip().rstrip(".,;").strip()
        right = _WORDS.get(right, right)
        try:
            call, value = ast.parse(left, mode="eval").body, ast.parse(right, mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry_point
                and all(map(_literal, [value, *call.args, *(kw.value for kw in call.keywords)]))):
            return f"assert {left} == {right}"  # a starred argument is no literal
    return ""


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True
