"""Adapters and batched rollout on the tiny model. Run: python -m pytest tests/test_models_rollout.py"""

import warnings

import pytest
import torch

from kit.run.config import TrainConfig, load_config
from kit.engine.models import (Team, adapter_parameters, attach_adapters, build_team, build_tiny_model, load_base,
                        lora_config, save_tiny_model)
from kit.engine.rollout import completion_mask, encode_prompt, format_prompt, generate
from kit.engine.forward import completion_logprobs


def make_team(num_agents=2, perturb=True):
    model, tok = build_tiny_model(0)
    names = [f"agent_{i}" for i in range(num_agents)]
    pm = attach_adapters(model, names, lora_config(8, 16, 0.0, "all-linear"))
    if perturb:  # fresh LoRA B is zero; give each adapter its own non-zero effect
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name in names:
                for p in adapter_parameters(pm, name):
                    p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return Team([pm], [tok], [0] * num_agents, names)


REQUESTS = [(0, "a0 sum 7"), (1, "a1 sum 7"), (0, "a much longer prompt for agent zero"), (1, "x")]


def test_batched_mixed_adapter_greedy_equals_per_agent_generation():
    team = make_team()
    batched = generate(team, REQUESTS, 2, max_new_tokens=10, temperature=0)
    for agent in (0, 1):
        mine = [k for k, (a, _) in enumerate(REQUESTS) if a == agent]
        alone = generate(team, [REQUESTS[k] for k in mine], 2, max_new_tokens=10, temperature=0)
        assert [batched.texts[k] for k in mine] == alone.texts


def test_rows_are_routed_to_their_own_adapter():
    team = make_team()
    ro = generate(team, [(0, "same prompt"), (1, "same prompt")], 1, max_new_tokens=10, temperature=0)
    assert ro.texts[0] != ro.texts[1]


def test_one_generate_call_per_base_for_all_agents_and_samples(monkeypatch):
    team = make_team()
    calls = []
    real = team.models[0].generate
    monkeypatch.setattr(team.models[0], "generate", lambda **kw: calls.append(kw["input_ids"].shape) or real(**kw))
    generate(team, REQUESTS, 3, max_new_tokens=4, temperature=1.0)
    assert calls == [calls[0]] and calls[0][0] == len(REQUESTS) * 3


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    _, tok = build_tiny_model(0)
    assert format_prompt(tok, "hi") == "<|user|>hi<|assistant|>"
    assert format_prompt(tok, "hi", use_chat_template=False) == "hi"


def test_a_long_prompt_loses_the_middle_of_its_content_never_the_chat_template():
    _, tok = build_tiny_model(0)  # one token per character; the template adds <|user|> and <|assistant|>
    prompt = "Task: add." + "x" * 100 + "def f(a, b):"
    ids = encode_prompt(tok, prompt, max_tokens=32)  # room for 30 content tokens: the first 15 and the last 15
    assert len(ids) == 32
    assert tok.decode(ids) == "<|user|>" + prompt[:15] + prompt[-15:] + "<|assistant|>"
    assert tok.decode(encode_prompt(tok, prompt, use_chat_template=False, max_tokens=9)) == prompt[:4] + prompt[-5:]


def test_prompts_within_max_prompt_tokens_are_unchanged():
    team = make_team()
    short = generate(team, REQUESTS, 1, max_new_tokens=4, temperature=0)
    limited = generate(team, REQUESTS, 1, max_new_tokens=4, temperature=0, max_prompt_tokens=64)
    assert torch.equal(short.segments[0].input_ids, limited.segments[0].input_ids)
    _, tok = build_tiny_model(0)
    assert encode_prompt(tok, "hi", max_tokens=4) == tok("<|user|>hi<|assistant|>", add_special_tokens=False).input_ids


def test_generation_starts_after_the_assistant_header_of_a_truncated_prompt():
    team = make_team()
    ro = generate(team, [(0, "a0 sum 7 " * 20), (1, "x")], 1, max_new_tokens=3, temperature=0, max_prompt_tokens=16)
    seg, tok = ro.segments[0], team.tokenizers[0]
    assert seg.prompt_len == 16
    assert all(tok.convert_ids_to_tokens(int(row[seg.prompt_len - 1])) == "<|assistant|>" for row in seg.input_ids)
    with pytest.raises(ValueError, match="max_prompt_tokens=2 leaves no room"):
        generate(team, [(0, "a0 sum 7")], 1, max_new_tokens=3, temperature=0, max_prompt_tokens=2)


def test_completion_mask_keeps_the_first_eos_and_drops_what_follows():
    comp = torch.tensor([[5, 6, 1, 0, 0], [5, 6, 7, 8, 9]])  # eos id 1
    assert completion_mask(comp, [1]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_update_logprobs_match_scoring_each_row_alone():
    team = make_team()
    ro = generate(team, REQUESTS, 1, max_new_tokens=6, temperature=0)
    seg = ro.segments[0].rows([0])
    model, tok = team.models[0], team.tokenizers[0]
    model.set_adapter("agent_0")
    with torch.no_grad():
        batched = completion_logprobs(model, seg)
    for row, sample in enumerate(seg.sample.tolist()):
        prompt = tok(format_prompt(tok, REQUESTS[sample][1]), return_tensors="pt", add_special_tokens=False).input_ids
        n = int(seg.completion_mask[row].sum())
        comp = seg.input_ids[row, -seg.completion_mask.shape[1]:][:n][None]
        with torch.no_grad():
            logits = model(torch.cat([prompt, comp], 1)).logits[0, prompt.shape[1] - 1:-1]
        alone = torch.log_softmax(logits, -1).gather(-1, comp[0][:, None]).squeeze(-1)
        torch.testing.assert_close(batched[row, :n], alone, atol=1e-5, rtol=1e-5)


def test_a_step_for_agent_0_moves_only_agent_0_and_never_the_base():
    team = make_team(perturb=False)
    model = team.models[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = adapter_parameters(model, "agent_0")
    opt = torch.optim.AdamW(params, lr=1e-2)
    ro = generate(team, REQUESTS, 2, max_new_tokens=4, temperature=1.0)
    model.set_adapter("agent_0")
    model.train()
    seg = ro.segments[0].rows([0])
    loss = -completion_logprobs(model, seg).sum()
    loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n and ".agent_0." in n for n in changed)


def test_tiny_adapter_can_move_the_output_distribution():
    team = make_team(perturb=False)
    model, tok = team.models[0], team.tokenizers[0]
    ids = tok(["a0 sum 3"], return_tensors="pt").input_ids
    target = tok.convert_tokens_to_ids("7")
    model.set_adapter("agent_0")
    opt = torch.optim.AdamW(adapter_parameters(model, "agent_0"), lr=3e-3)
    with torch.no_grad():
        p0 = model(ids).logits[0, -1].softmax(-1)[target].item()
    for _ in range(30):
        loss = -model(ids).logits[0, -1].log_softmax(-1)[target]
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        p1 = model(ids).logits[0, -1].softmax(-1)[target].item()
    assert p0 < 0.3 and p1 > 0.9


def test_tiny_model_is_deterministic():
    a, _ = build_tiny_model(0)
    b, _ = build_tiny_model(0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_shared_adapter_team_has_one_adapter():
    team = build_team(TrainConfig(share_adapter=True, num_agents=3))
    assert team.adapters == ["shared"] and team.adapter_of == ["shared"] * 3


def test_heterogeneous_team_loads_one_base_per_model(tmp_path):
    path = save_tiny_model(str(tmp_path / "tiny"))
    team = build_team(TrainConfig(agent_models=["tiny", path], quantization="none"))
    assert len(team.models) == 2 and team.base_of == [0, 1]
    ro = generate(team, [(0, "a0 sum 3"), (1, "a1 sum 3")], 2, max_new_tokens=3, temperature=1.0)
    assert len(ro.segments) == 2 and all(len(t) == 2 for t in ro.texts)


def test_cpu_load_without_cuda_says_so_in_one_line(tmp_path):
    path = save_tiny_model(str(tmp_path / "tiny"))
    lines = []
    load_base(path, quantization="auto", device="cpu", log=lines.append)
    assert len(lines) == 1 and "full precision (float32)" in lines[0] and "bf16" in lines[0]  # which, and why


def test_bad_hub_name_says_what_to_do(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at import time, so also patch the constant: no network wait
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match="local folder"):
        load_base("no-such-org/no-such-model", device="cpu", log=lambda *_: None)


def test_4bit_nf4_loading_and_generation_run_on_cpu(tmp_path):
    """bitsandbytes runs 4-bit layers on a CPU (slowly): the kit's CUDA path, exercised here."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    path = save_tiny_model(str(tmp_path / "tiny"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_base(path, quantization="4bit", device="cpu", log=lambda *_: None)
    linear4 = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert linear4 and linear4[0].weight.quant_type == "nf4"
    pm = attach_adapters(model, ["agent_0", "agent_1"], lora_config(8, 16, 0.0, "all-linear"))
    team = Team([pm], [tok], [0, 0], ["agent_0", "agent_1"])
    ro = generate(team, [(0, "a0 sum 3"), (1, "a1 sum 3")], 2, max_new_tokens=3, temperature=1.0)
    assert ro.num_tokens > 0


def test_chunked_head_logprobs_equal_the_models_own_logits_with_and_without_adapter():
    import kit.engine.forward as forward
    from kit.maths.losses import token_logprobs

    team = make_team()
    model = team.models[0]
    seg = generate(team, REQUESTS, 2, max_new_tokens=6, temperature=1.0).segments[0]
    model.set_adapter("agent_1")
    assert forward._decoder_and_head(model) is not None  # the tiny model takes the chunked path
    T = seg.completion_mask.shape[1]

    def from_logits():
        logits = model(input_ids=seg.input_ids, attention_mask=seg.attention_mask,
                       position_ids=forward.position_ids(seg.attention_mask), logits_to_keep=T + 1).logits
        return token_logprobs(logits[:, :-1], seg.input_ids[:, -T:])

    with model.disable_adapter():  # the KL reference pass
        torch.testing.assert_close(completion_logprobs(model, seg), from_logits(), atol=1e-5, rtol=1e-5)
    fast, ref = completion_logprobs(model, seg), from_logits()
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    params = adapter_parameters(model, "agent_1")
    fast_grads = torch.autograd.grad((fast * seg.completion_mask).sum(), params)
    ref_grads = torch.autograd.grad((ref * seg.completion_mask).sum(), params)
    for a, b in zip(fast_grads, ref_grads):  # fp32, summed in another order
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


# --- dtype=auto on a CPU (issue 77): bf16 only where the CPU computes it and the model gains from it

X86_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
X86_AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_bf16_is_read_from_the_cpus_own_flags():
    from kit.env import cpu_bf16

    assert cpu_bf16(X86_AMX).native and cpu_bf16(X86_AMX).flags == ("avx512_bf16", "amx_bf16")
    assert cpu_bf16(ARM_BF16).flags == ("bf16",)
    assert not cpu_bf16(X86_AVX2).native and cpu_bf16(X86_AVX2).flags == ()
    assert not cpu_bf16("flags : avx2 bf16x\n").native  # whole words only


def test_auto_dtype_on_a_cpu_is_bf16_only_where_native_and_the_model_is_wide():
    from kit.engine.precision import BF16_MIN_HIDDEN, choose_dtype
    from kit.env import cpu_bf16

    cpu = torch.device("cpu")
    assert choose_dtype("auto", cpu, 896, cpu_bf16(X86_AMX))[0] == torch.bfloat16
    dtype, why = choose_dtype("auto", cpu, 896, cpu_bf16(X86_AVX2))
    assert dtype == torch.float32 and "emulated" in why
    dtype, why = choose_dtype("auto", cpu, 64, cpu_bf16(X86_AMX))  # the tiny model
    assert dtype == torch.float32 and str(BF16_MIN_HIDDEN) in why
    assert choose_dtype("float32", cpu, 896, cpu_bf16(X86_AMX))[0] == torch.float32  # what is set wins
    assert choose_dtype("bfloat16", cpu, 64, cpu_bf16(X86_AVX2))[0] == torch.bfloat16


def test_a_bf16_base_on_a_cpu_keeps_its_adapters_and_output_layer_in_fp32():
    """The base in bf16, the LoRA weights (so their gradients and Adam's state) and the head in fp32; the head's
    own copy, so the tied bf16 embedding is untouched; the logits the sampler reads are fp32 products."""
    cfg = load_config("tiny_cpu", overrides=["dtype=bfloat16"])
    team = build_team(cfg, log=lambda *_: None)
    model = team.models[0]
    hf = model.get_base_model()
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    assert hf.get_input_embeddings().weight.dtype == torch.bfloat16
    head = hf.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and head.weight is not hf.get_input_embeddings().weight
    hidden = torch.randn(2, 3, hf.config.hidden_size, dtype=torch.bfloat16)
    assert torch.equal(head(hidden), hidden.float() @ head.weight.t())
    assert team.precision[0]["dtype"] == "bfloat16" and team.precision[0]["output_layer"] == "float32"


def test_a_bf16_model_loaded_from_a_folder_gets_the_fp32_output_layer_too(tmp_path):
    """The path every real model takes (AutoModelForCausalLM from a folder), not only the built-in tiny model's."""
    path = save_tiny_model(str(tmp_path / "tiny"))
    model, _ = load_base(path, dtype="bfloat16", device="cpu", log=lambda *_: None)
    assert model.get_output_embeddings().weight.dtype == torch.float32
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16 and not model.config.tie_word_embeddings
    assert load_base(path, device="cpu", log=lambda *_: None)[0].get_output_embeddings().weight.dtype == torch.float32
