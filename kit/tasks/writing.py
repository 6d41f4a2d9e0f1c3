"""Writing tasks from the paper, two agents, one turn: TLDR summaries and arXiv abstract expansion.

    task=writing, task_args={kind: tldr}      agent 0 writes a concise summary of a post, agent 1 a detailed one
    task=writing, task_args={kind: arxiv}     both see an abstract; agent 0 writes background and motivation,
                                              agent 1 methodology and implications, neither covering the other's part

Reward (max 3.0), each level only when the previous one scored above 0; words are whitespace-separated tokens,
and both length measures use words (the reference code mixes words and characters):
    structure    (0.5)  both texts have a word count inside `length`
    coordination (1.0)  ratio = words(agent 1) / words(agent 0): 1.0 inside `ratio_best`, linear down to 0 at the
                        ends of `ratio_zero`
    vocabulary   (0.5)  ratio of unique words (agent 1 / agent 0), the same kind of band (`unique_best`,
                        `unique_zero`)
    style        (1.0)  0.4 x transition coverage (categories of transition words in agent 1's text, full at 4)
                        + 0.6 x min(Jaccard overlap of the two texts' content words, cap) / cap
Transition words and phrases match whole words only ("as" does not match inside "has"). All bands live in
`Bands` and can be overridden per run (`task_args={kind: tldr, bands: {ratio_best: [1.5, 3.0]}}`).
TLDR: lengths 8-256, ratio best [1.6, 3.2] with zeros at 1.1 and 5.0, unique ratio full at >= 2.0 from 1.3,
Jaccard cap 0.03. arXiv: lengths 128-256, ratio best [1.0, 1.3] with zeros at 0.8 and 1.5, unique ratio best
[0.7, 1.3] with zeros at 0.5 and 1.7, Jaccard cap 0.23.

Data: 30 bundled items per kind in kit/data/ (written for this kit; eval is the first 8), your own in the same format
(`data_file=my.yaml`: tldr items have id, subreddit, title, post; arxiv items id, title, abstract), or the hub
datasets by name for Colab (`source=hub`): trl-lib/tldr and OpenMLRL/arXiv_abstract.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from dataclasses import dataclass

from kit.tasks.rewards import Reward
from kit.tasks import check_arg, is_id, is_int, is_number, is_text, read_items

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")  # kit/data: in the package
INF = math.inf


@dataclass(frozen=True)
class Bands:
    length: tuple[int, int]  # words per text, inclusive
    ratio_best: tuple[float, float]  # words(agent 1) / words(agent 0) with full credit
    ratio_zero: tuple[float, float]  # where the linear ramps reach 0
    unique_best: tuple[float, float]  # unique-word ratio with full credit
    unique_zero: tuple[float, float]
    jaccard_cap: float  # content-word overlap at which style's overlap part is full
    transitions_for_full: int = 4  # transition categories in agent 1's text for full coverage


BANDS = {
    "tldr": Bands(length=(8, 256), ratio_best=(1.6, 3.2), ratio_zero=(1.1, 5.0), unique_best=(2.0, INF),
                  unique_zero=(1.3, INF), jaccard_cap=0.03),
    "arxiv": Bands(length=(128, 256), ratio_best=(1.0, 1.3), ratio_zero=(0.8, 1.5), unique_best=(0.7, 1.3),
                   unique_zero=(0.5, 1.7), jaccard_cap=0.23),
}

TRANSITIONS = {
    "addition": ["furthermore", "moreover", "in addition", "additionally", "also", "besides", "as well as"],
    "example": ["for example", "for instance", "such as", "in particular", "namely", "to illustrate"],
    "explanation": ["in other words", "that is", "in fact", "indeed", "specifically", "to clarify"],
    "cause": ["therefore", "thus", "as a result", "consequently", "because", "hence", "due to"],
    "contrast": ["however", "although", "on the other hand", "in contrast", "nevertheless", "whereas", "but"],
    "sequence": ["first", "second", "then", "next", "finally", "afterwards", "subsequently"],
    "emphasis": ["importantly", "notably", "above all", "clearly", "significantly"],
    "summary": ["in summary", "in conclusion", "overall", "in short", "to sum up", "ultimately"],
}
STOPWORDS = set("""a an the and or but if of to in on at by for with from as is are was were be been being it its
this that these those he she they we you i me my our your their them his her him us do does did have has had not
no so than then there here what which who whom when where why how all any some can could would should will may
might must just very too also into over under about after before up down out off again more most such only own
same other each few both""".split())
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    return text.split()


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def unique_words(text: str) -> int:
    return len(set(_WORD.findall(text.lower())))


def ramp(x: float, zero: tuple[float, float], best: tuple[float, float]) -> float:
    """1 inside `best`, linear down to 0 at the ends of `zero`, 0 outside; infinite ends allowed."""
    (z_lo, z_hi), (b_lo, b_hi) = zero, best
    if b_lo <= x <= b_hi:
        return 1.0
    if z_lo < x < b_lo:
        return (x - z_lo) / (b_lo - z_lo)
    if b_hi < x < z_hi:
        return (z_hi - x) / (z_hi - b_hi)
    return 0.0


@functools.lru_cache(maxsize=None)
def _phrase_pattern(phrase: str) -> re.Pattern:
    body = r"\s+".join(re.escape(part) for part in phrase.split())
    return re.compile(rf"(?<![\w'-]){body}(?![\w'-])", re.I)


def transition_categories(text: str) -> set[str]:
    """Categories with at least one transition word or phrase in `text`, matched as whole words."""
    return {cat for cat, phrases in TRANSITIONS.items() if any(_phrase_pattern(p).search(text) for p in phrases)}


def jaccard(a: str, b: str) -> float:
    sa, sb = content_words(a), content_words(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 0.0


def level_reward(first: str, second: str, bands: Bands) -> Reward:
    """The gated level reward of (agent 0's text, agent 1's text)."""
    parts = {"structure": 0.0, "coordination": 0.0, "vocabulary": 0.0, "style": 0.0}
    n0, n1 = len(words(first)), len(words(second))
    details = {"words": (n0, n1)}
    lo, hi = bands.length
    if not (lo <= n0 <= hi and lo <= n1 <= hi):
        return Reward(0.0, parts, details)
    parts["structure"] = 0.5
    ratio = n1 / n0
    parts["coordination"] = ramp(ratio, bands.ratio_zero, bands.ratio_best)
    details["length_ratio"] = ratio
    if parts["coordination"] <= 0:
        return Reward(sum(parts.values()), parts, details)
    u0 = unique_words(first)
    uratio = unique_words(second) / u0 if u0 else 0.0
    parts["vocabulary"] = 0.5 * ramp(uratio, bands.unique_zero, bands.unique_best)
    details["unique_ratio"] = uratio
    if parts["vocabulary"] <= 0:
        return Reward(sum(parts.values()), parts, details)
    cats = transition_categories(second)
    coverage = min(1.0, len(cats) / bands.transitions_for_full)
    overlap = min(jaccard(first, second), bands.jaccard_cap) / bands.jaccard_cap
    parts["style"] = 0.4 * coverage + 0.6 * overlap
    details.update(transitions=sorted(cats), jaccard=jaccard(first, second))
    return Reward(sum(parts.values()), parts, details)


PROMPTS = {
    "tldr": (
        "Summarize this Reddit post in one or two short sentences: a concise TL;DR.\n\n{text}\n\nConcise summary:",
        "Write a detailed summary of this Reddit post in one paragraph: the situation, what matters most, and the "
        "question the writer asks. A teammate writes a one-sentence TL;DR; yours adds the detail it leaves out."
        "\n\n{text}\n\nDetailed summary:"),
    "arxiv": (
        "Expand this paper abstract into the background and motivation part of an introduction (about 150-200 "
        "words): the problem, why it matters, and what earlier work leaves open. Do not describe the method or "
        "the results; a teammate writes those.\n\nAbstract: {text}\n\nBackground and motivation:",
        "Expand this paper abstract into the methodology and implications part of an introduction (about 150-200 "
        "words): how the approach works, what the results show, and what they mean. Do not write the background "
        "or motivation; a teammate writes those.\n\nAbstract: {text}\n\nMethodology and implications:"),
}
SINGLE = {
    "tldr": "Summarize this Reddit post twice: first a concise one- or two-sentence TL;DR, then a line with only "
            "###, then a detailed one-paragraph summary.\n\n{text}\n",
    "arxiv": "Expand this paper abstract into two introduction paragraphs (about 150-200 words each): background "
             "and motivation, then a line with only ###, then methodology and implications.\n\nAbstract: {text}\n",
}
RUBRIC = {
    "tldr": "Agent 0 should give an accurate one-sentence TL;DR and agent 1 an accurate, more detailed summary "
            "that adds to it without repeating it. 10: both accurate and complementary; 0: wrong or off-topic.",
    "arxiv": "Agent 0 should write background and motivation, agent 1 methodology and implications, both faithful "
             "to the abstract and not overlapping. 10: faithful, complementary, well written; 0: unrelated.",
}
_MARKER = re.compile(r"^\s*#{3,}\s*$", re.M)
HUB = {"tldr": "trl-lib/tldr", "arxiv": "OpenMLRL/arXiv_abstract"}


HEADLINE = "reward/mean"  # graded 0-3: pass@k (reward >= pass_threshold) is only a threshold on the grade


class WritingTask:
    name = "writing"
    headline = HEADLINE

    def __init__(self, num_agents: int = 2, kind: str = "tldr", source: str = "bundled", num_eval: int = 8,
                 max_items: int | None = None, pass_threshold: float = 2.5, bands: dict | None = None,
                 data_file: str | None = None):
        if num_agents != 2:
            raise ValueError(f"the writing tasks have two agents; got num_agents={num_agents}")
        check_arg(kind in BANDS, "kind", kind, ", ".join(BANDS))
        check_arg(source in ("bundled", "hub"), "source", source, f"bundled (kit/data/), hub ({HUB[kind]})")
        check_arg(is_int(num_eval) and num_eval >= 0, "num_eval", num_eval, "an integer >= 0")
        check_arg(max_items is None or (is_int(max_items) and max_items >= 1), "max_items", max_items,
                  "null or an integer >= 1")
        check_arg(is_number(pass_threshold), "pass_threshold", pass_threshold, "a number (a finite reward)")
        check_arg(data_file is None or (isinstance(data_file, str) and source == "bundled"), "data_file", data_file,
                  f"null, or the path of a YAML file of {kind} items in the format of kit/data/{kind}_samples.yaml "
                  "(with source=bundled)")
        self.num_agents, self.kind, self.source = num_agents, kind, source
        self.data_file = data_file or os.path.join(DATA_DIR, f"{kind}_samples.yaml")
        self.bands = BANDS[kind]
        if bands:  # task_args={kind: tldr, bands: {ratio_best: [1.5, 3.0]}}
            check_arg(isinstance(bands, dict), "bands", bands, "a mapping of band names to values")
            unknown = set(bands) - set(Bands.__dataclass_fields__)
            if unknown:
                raise ValueError(f"bands has unknown fields {sorted(unknown)}; allowed: "
                                 f"{', '.join(Bands.__dataclass_fields__)}")
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in bands.items()}
            self.bands = dataclasses.replace(self.bands, **fields)
        check_bands(self.bands)
        self.roles = ["concise", "detailed"] if kind == "tldr" else ["background", "method"]
        self.num_eval, self.max_items, self.pass_threshold = num_eval, max_items, pass_threshold
        self.judge_rubric = RUBRIC[kind]

    def load(self, split: str = "train") -> list[dict]:
        if split not in ("train", "eval"):
            raise ValueError(f"split={split!r}; allowed: train, eval")
        if self.source == "hub":
            return hub_items(self.kind, split)[: self.max_items]
        items = bundled_items(self.kind, self.data_file)
        chosen = items[: self.num_eval] if split == "eval" else items[self.num_eval:]
        return list(chosen[: self.max_items])

    def prompts(self, item: dict) -> list[str]:
        return [p.format(text=item["text"]) for p in PROMPTS[self.kind]]

    def reward(self, item: dict, completions: tuple[str, ...]) -> Reward:
        first, second = completions
        return level_reward(first.strip(), second.strip(), self.bands)

    def is_pass(self, reward: Reward) -> bool:
        return reward.total >= self.pass_threshold

    def single_prompt(self, item: dict) -> str:
        return SINGLE[self.kind].format(text=item["text"])

    def split_single(self, item: dict, text: str) -> tuple[str, str]:
        """The single-model baseline's text, split on the ### marker line (no marker: all of it is part 1)."""
        parts = _MARKER.split(text, maxsplit=1)
        return (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else (text.strip(), "")


def check_bands(bands: Bands) -> None:
    """Each band a pair low <= high (numbers; an end may be .inf), the cap > 0, the transitions count >= 1."""
    def pair(v):
        return isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                            and not math.isnan(x) for x in v) and v[0] <= v[1]

    for name in ("length", "ratio_best", "ratio_zero", "unique_best", "unique_zero"):
        check_arg(pair(getattr(bands, name)), f"bands.{name}", getattr(bands, name), "[low, high] numbers, low <= high")
    check_arg(is_number(bands.jaccard_cap) and bands.jaccard_cap > 0, "bands.jaccard_cap", bands.jaccard_cap,
              "a number > 0")
    check_arg(is_int(bands.transitions_for_full) and bands.transitions_for_full >= 1, "bands.transitions_for_full",
              bands.transitions_for_full, "an integer >= 1")


FIELDS = {
    "tldr": {"id": (is_id, "a name or number, unique in the file"), "subreddit": (is_text, "the subreddit's name"),
             "title": (is_text, "the post's title"), "post": (is_text, "the post's text")},
    "arxiv": {"id": (is_id, "a name or number, unique in the file"), "title": (is_text, "the paper's title"),
              "abstract": (is_text, "the abstract's text")},
}


@functools.lru_cache(maxsize=None)
def bundled_items(kind: str, path: str | None = None) -> tuple[dict, ...]:
    """The items of kit/data/<kind>_samples.yaml, or of `path` in the same format."""
    rows = read_items(path or os.path.join(DATA_DIR, f"{kind}_samples.yaml"), FIELDS[kind])
    if kind == "tldr":
        return tuple({"id": r["id"], "text": f"SUBREDDIT: r/{r['subreddit']}\nTITLE: {r['title']}\nPOST: {r['post']}"}
                     for r in rows)
    return tuple({"id": r["id"], "title": r["title"], "text": r["abstract"]} for r in rows)


@functools.lru_cache(maxsize=None)
def hub_items(kind: str, split: str) -> list[dict]:
    """The paper's hub datasets by name (Colab: needs `datasets` and network)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise RuntimeError("loading hub datasets needs the `datasets` package: pip install datasets") from None
    name = HUB[kind]
    hub_split = {"train": "train", "eval": "test"}[split]
    try:
        rows = load_dataset(name, split=hub_split)
    except Exception as err:
        raise RuntimeError(f"could not load {name!r} (split {hub_split!r}) from the hub: {err}. Check the network, "
                           "or use source=bundled") from None
    columns = ["prompt"] if kind == "tldr" else ["abstract", "abstract_text", "text"]
    column = next((c for c in columns if c in rows.column_names), None)
    if column is None:
        raise ValueError(f"{name!r} has columns {rows.column_names}; expected one of {columns}")
    return [{"id": f"{name}/{hub_split}/{i}", "text": str(row[column]).strip()} for i, row in enumerate(rows)]


def make_task(num_agents: int = 2, **kwargs) -> WritingTask:
    return WritingTask(num_agents=num_agents, **kwargs)
