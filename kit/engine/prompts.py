"""A prompt whose answer is started for the model: what a task returns and the sampler reads (kit/engine/rollout.py).

Its own module (no imports) so that tasks and the sampler both read it without importing each other.
"""


class Prompt(str):
    """A prompt whose answer is started for the model: `Prompt(text, answer_start="```python\\ndef aux(")`.

    The sampler puts `answer_start` after the chat template's assistant header (a prefilled answer, as
    `continue_final_message` does in transformers' chat templates) and returns it in front of each completion, so
    the reward, schemes and logs read the whole answer; the update scores only the tokens that were sampled. It
    is a str everywhere else (logs, critics, judges read the prompt as it is).

    `final_start`, for an agent with tools: the text its answer is started with after the results of its last
    allowed call (kit/engine/tools.py), when that answer can no longer be a call; off the loss mask, and in front
    of the text the reward reads, as `answer_start` is. `round_starts`, for an agent with tools: `round_starts[i]`
    starts its text of round i + 1, after the results of its calls of round i, while it has calls left (a schedule
    of calls: the code task's `prefill: discussion` posts a draft in round 0 and starts round 1 as a read); a round
    past them is the agent's own."""

    answer_start: str = ""
    final_start: str = ""
    round_starts: tuple = ()

    def __new__(cls, text: str, answer_start: str = "", final_start: str = "", round_starts: tuple = ()):
        _check_rounds(round_starts)
        self = super().__new__(cls, text)
        self.answer_start, self.final_start, self.round_starts = answer_start, final_start, tuple(round_starts)
        return self

    def __reduce__(self):  # pickled (a process pool, the distributed run) with its starts
        return Prompt, (str(self), self.answer_start, self.final_start, self.round_starts)


def answer_start(prompt: str) -> str:
    """The text a prompt's answer is started with ("" for a plain str)."""
    return getattr(prompt, "answer_start", "")


def final_start(prompt: str) -> str:
    """The text a prompt's answer after its last allowed tool call is started with ("" for a plain str)."""
    return getattr(prompt, "final_start", "")


def _check_rounds(round_starts) -> None:
    if isinstance(round_starts, str) or not all(isinstance(s, str) for s in round_starts):
        raise TypeError(f"round_starts={round_starts!r}: give a tuple of strings, one per round after the first "
                        "(a single start as a one-element tuple)")


def round_starts(prompt: str) -> tuple:
    return getattr(prompt, "round_starts", ())


def round_start(prompt: str, round_: int) -> str:
    """The text an agent's round `round_` (>= 1, with calls left) is started with ("" past its round_starts)."""
    given = round_starts(prompt)
    return given[round_ - 1] if 0 < round_ <= len(given) else ""


def starts(prompt: str) -> dict:
    """A prompt's answer starts as keyword arguments, to build another Prompt or Chat with them."""
    return dict(answer_start=answer_start(prompt), final_start=final_start(prompt), round_starts=round_starts(prompt))


class Chat(str):
    """A prompt given as chat messages (`[{"role": "system" | "user" | "assistant", "content": ...}]`, a JSONL row's
    `prompt` as TRL reads it): the sampler renders the messages with the chat template; everywhere else it is the
    messages' text, one "role: content" line each. Its answer starts are a Prompt's."""

    messages: list = []
    answer_start: str = ""
    final_start: str = ""
    round_starts: tuple = ()

    def __new__(cls, messages: list, answer_start: str = "", final_start: str = "", round_starts: tuple = ()):
        _check_rounds(round_starts)
        self = super().__new__(cls, "\n".join(f"{m['role']}: {m['content']}" for m in messages))
        self.messages = [dict(m) for m in messages]
        self.answer_start, self.final_start, self.round_starts = answer_start, final_start, tuple(round_starts)
        return self

    def __reduce__(self):  # pickled with its starts, which the sampler reads
        return Chat, (self.messages, self.answer_start, self.final_start, self.round_starts)
