"""Writing tasks: every reward level pinned on hand-built texts, ramp end points, whole-word transitions, data.

Run: python -m pytest tests/test_writing.py
"""

import math

import pytest

from kit.tasks import get_task
from kit.tasks.writing import BANDS, level_reward, ramp, transition_categories

TLDR, ARXIV = BANDS["tldr"], BANDS["arxiv"]


def text(n_words: int, n_unique: int, prefix: str, head: tuple[str, ...] = ()) -> str:
    """`head` words, then tokens prefix0..prefix{k-1} cycled, n_words in all with n_unique distinct."""
    body = [f"{prefix}{i % (n_unique - len(head))}" for i in range(n_words - len(head))]
    return " ".join([*head, *body])


def parts(r):
    return tuple(round(r.parts[k], 4) for k in ("structure", "coordination", "vocabulary", "style"))


@pytest.mark.parametrize("x, expected", [(1.1, 0.0), (1.35, 0.5), (1.6, 1.0), (2.5, 1.0), (3.2, 1.0), (4.1, 0.5),
                                         (5.0, 0.0), (0.5, 0.0), (9.0, 0.0)])
def test_tldr_length_ratio_ramp(x, expected):
    assert ramp(x, TLDR.ratio_zero, TLDR.ratio_best) == pytest.approx(expected)


@pytest.mark.parametrize("x, expected", [(1.3, 0.0), (1.65, 0.5), (2.0, 1.0), (50.0, 1.0)])
def test_tldr_unique_ratio_ramp_is_open_ended(x, expected):
    assert ramp(x, TLDR.unique_zero, TLDR.unique_best) == pytest.approx(expected)


@pytest.mark.parametrize("x, expected", [(0.8, 0.0), (0.9, 0.5), (1.0, 1.0), (1.3, 1.0), (1.4, 0.5), (1.5, 0.0)])
def test_arxiv_length_ratio_ramp(x, expected):
    assert ramp(x, ARXIV.ratio_zero, ARXIV.ratio_best) == pytest.approx(expected)


@pytest.mark.parametrize("x, expected", [(0.5, 0.0), (0.6, 0.5), (0.7, 1.0), (1.3, 1.0), (1.5, 0.5), (1.7, 0.0)])
def test_arxiv_unique_ratio_ramp(x, expected):
    assert ramp(x, ARXIV.unique_zero, ARXIV.unique_best) == pytest.approx(expected)


def test_tldr_full_marks():
    first = text(10, 10, "a")
    second = " ".join(["however", "for", "example", "therefore", "first", "a0"] + [f"b{i}" for i in range(14)])
    r = level_reward(first, second, TLDR)  # ratio 2.0, unique 2.0, 4 categories, Jaccard 1/28 > cap
    assert parts(r) == (0.5, 1.0, 0.5, 1.0) and r.total == pytest.approx(3.0)


def test_tldr_structure_fails_below_8_words():
    assert parts(level_reward(text(7, 7, "a"), text(20, 20, "b"), TLDR)) == (0, 0, 0, 0)


def test_tldr_structure_fails_above_256_words():
    assert parts(level_reward(text(10, 10, "a"), text(257, 257, "b"), TLDR)) == (0, 0, 0, 0)


def test_tldr_ratio_at_the_lower_zero_stops_after_structure():
    r = level_reward(text(10, 10, "a"), text(11, 11, "b", ("however",)), TLDR)
    assert parts(r) == (0.5, 0.0, 0.0, 0.0)


def test_tldr_ratio_on_the_upper_ramp():
    r = level_reward(text(10, 10, "a"), text(41, 41, "b"), TLDR)  # ratio 4.1, unique 4.1, no style
    assert parts(r) == (0.5, 0.5, 0.5, 0.0)


def test_tldr_ratio_at_the_upper_zero_stops():
    assert parts(level_reward(text(10, 10, "a"), text(50, 50, "b"), TLDR)) == (0.5, 0.0, 0.0, 0.0)


def test_tldr_unique_ratio_at_1_3_gates_style_even_with_transitions():
    second = text(19, 13, "b", ("however",))  # 13 unique / 10 = 1.3
    assert parts(level_reward(text(10, 10, "a"), second, TLDR)) == (0.5, 1.0, 0.0, 0.0)


def test_tldr_unique_ratio_on_the_ramp():
    r = level_reward(text(20, 20, "a"), text(40, 33, "b"), TLDR)  # ratio 2.0, unique 33/20 = 1.65
    assert parts(r)[:3] == (0.5, 1.0, 0.25)


def test_tldr_style_with_partial_overlap_and_no_transitions():
    first = text(20, 20, "a")
    second = " ".join(["a0"] + [f"b{i}" for i in range(39)])  # Jaccard 1/59 under the 0.03 cap
    r = level_reward(first, second, TLDR)
    assert r.parts["style"] == pytest.approx(0.6 * (1 / 59) / 0.03)
    assert r.total == pytest.approx(2.0 + 0.6 * (1 / 59) / 0.03)


def test_style_transition_coverage_counts_categories_up_to_four():
    first = text(10, 10, "a")
    second = " ".join(["however", "but", "although"] + [f"b{i}" for i in range(17)])  # one category: contrast
    assert level_reward(first, second, TLDR).parts["style"] == pytest.approx(0.4 * 1 / 4)


def test_arxiv_levels():
    assert parts(level_reward(text(150, 150, "a"), text(120, 120, "b"), ARXIV)) == (0, 0, 0, 0)  # < 128 words
    assert parts(level_reward(text(150, 150, "a"), text(150, 150, "b"), ARXIV)) == (0.5, 1.0, 0.5, 0.0)
    assert parts(level_reward(text(150, 150, "a"), text(135, 135, "b"), ARXIV))[:2] == (0.5, 0.5)  # ratio 0.9
    assert parts(level_reward(text(150, 150, "a"), text(225, 225, "b"), ARXIV)) == (0.5, 0.0, 0.0, 0.0)  # 1.5
    assert parts(level_reward(text(150, 150, "a"), text(150, 90, "b"), ARXIV))[:3] == (0.5, 1.0, 0.25)  # u 0.6


def test_arxiv_jaccard_cap():
    first = text(150, 150, "a")
    second = " ".join([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(100)])  # J = 50/250 = 0.2
    assert level_reward(first, second, ARXIV).parts["style"] == pytest.approx(0.6 * 0.2 / 0.23)


def test_transition_words_match_whole_words_and_phrases_only():
    assert transition_categories("He has butter, overalls and a firstly-made thenceforth plan") == set()
    assert transition_categories("As a result, it works. For\nexample, this.") == {"cause", "example"}
    assert transition_categories("HOWEVER it ended; in summary fine") == {"contrast", "summary"}
    assert "example" not in transition_categories("for examples")


def test_bundled_data_and_splits():
    for kind in ("tldr", "arxiv"):
        task = get_task("writing", 2, kind=kind)
        train, held_out = task.load("train"), task.load("eval")
        assert len(train) + len(held_out) >= 30 and len(held_out) == 8
        assert len({i["id"] for i in train + held_out}) == len(train) + len(held_out)
        concise, detailed = task.prompts(train[0])
        assert train[0]["text"] in concise and train[0]["text"] in detailed and concise != detailed


def test_single_model_baseline_splits_on_the_marker():
    task = get_task("writing", 2, kind="arxiv")
    item = task.load("eval")[0]
    assert "###" in task.single_prompt(item)
    assert task.split_single(item, "Background here.\n###\nMethod here.") == ("Background here.", "Method here.")
    assert task.split_single(item, "only one part") == ("only one part", "")


def test_bands_can_be_overridden_from_task_args():
    task = get_task("writing", 2, kind="tldr", bands={"ratio_best": [1.2, 3.2], "jaccard_cap": 0.1})
    assert task.bands.ratio_best == (1.2, 3.2) and task.bands.jaccard_cap == 0.1 and task.bands.length == (8, 256)
    with pytest.raises(ValueError, match="unknown fields"):
        get_task("writing", 2, bands={"ratio": 1})


def test_bad_task_args_are_named():
    with pytest.raises(ValueError, match="kind='poem'"):
        get_task("writing", 2, kind="poem")
    with pytest.raises(ValueError, match="source='web'"):
        get_task("writing", 2, source="web")


def test_hub_loader_reads_the_named_dataset(monkeypatch):
    datasets = pytest.importorskip("datasets")
    from kit.tasks import writing

    seen = {}

    def fake(name, split):
        seen[name] = split
        return datasets.Dataset.from_list([{"prompt": f"POST {i}", "completion": "x"} for i in range(5)])

    monkeypatch.setattr(datasets, "load_dataset", fake)
    writing.hub_items.cache_clear()
    items = get_task("writing", 2, kind="tldr", source="hub").load("eval")
    assert seen == {"trl-lib/tldr": "test"} and [i["text"] for i in items][:2] == ["POST 0", "POST 1"]
    writing.hub_items.cache_clear()


def test_tiny_model_trains_a_step_on_a_writing_task(tmp_path):
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'w'}", "progress=false", "task=writing",
                                             "task_args={kind: tldr}", "num_steps=1", "batch_size=2",
                                             "num_generations=2", "max_new_tokens=8", "eval_every=0"])
    trainer = Trainer(cfg, log=lambda *_: None)
    summary = trainer.train()
    assert summary["steps"] == 1 and not math.isnan(summary["reward_end"])
