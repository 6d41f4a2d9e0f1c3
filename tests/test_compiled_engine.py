"""The compiled rollout engine against PEFT, on the tiny model in fp32 (CPU: the same model, run eagerly).

Run: python -m pytest tests/test_compiled_engine.py
"""

import copy
import dataclasses

import pytest
import torch

from kit.engine.compiled import CompiledEngine, bucket_len, bucket_rows
from kit.engine.models import Team, adapter_parameters, attach_adapters, build_tiny_model, load_base, lora_config, \
    save_tiny_model
from kit.engine.rollout import generate

REQUESTS = [(0, "a0 sum 7"), (1, "a1 sum 7"), (0, "a much longer prompt for agent zero"), (1, "x")]


def make_team(num_agents=2, shared=False, engine="hf", seed=1, model=None, scale=0.3):
    if model is None:
        model, tok = build_tiny_model(0)
    else:
        model, tok = model
    names = ["shared"] if shared else [f"agent_{i}" for i in range(num_agents)]
    pm = attach_adapters(model, names, lora_config(8, 16, 0.0, "all-linear"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # fresh LoRA B is zero; give each adapter its own non-zero effect
        for name in names:
            for p in adapter_parameters(pm, name):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    adapter_of = names * num_agents if shared else names
    return Team([pm], [tok], [0] * num_agents, adapter_of, rollout_engine=engine)


def as_engine(team, engine):
    return dataclasses.replace(team, rollout_engine=engine, engines={})


@pytest.mark.parametrize("num_agents,shared", [(2, False), (3, False), (4, False), (3, True)])
def test_stacked_forward_equals_peft_per_adapter_forward(num_agents, shared):
    team = make_team(num_agents, shared)
    pm = team.models[0]
    engine = CompiledEngine(pm, team.adapters)
    assert engine.weights == "share"  # fp32 base on a CPU: no copy
    rows = 3
    ids = torch.randint(5, 90, (rows * len(team.adapters), 9), generator=torch.Generator().manual_seed(0))
    engine.gen.layout.active = tuple(range(len(team.adapters)))
    logits = engine.gen(input_ids=ids).logits
    for i, adapter in enumerate(team.adapters):
        pm.set_adapter(adapter)
        ref = pm(input_ids=ids[i * rows:(i + 1) * rows]).logits
        torch.testing.assert_close(logits[i * rows:(i + 1) * rows], ref, atol=1e-4, rtol=1e-4)


def test_greedy_rollouts_agree_with_the_hf_engine_tokens_masks_and_texts():
    team = make_team(2, scale=0.1)  # small enough that the warmed-up format (a digit, then EOS) survives
    hf = generate(team, REQUESTS * 2, 2, max_new_tokens=12, temperature=0)
    fast = generate(as_engine(team, "compiled"), REQUESTS * 2, 2, max_new_tokens=12, temperature=0)
    a, b = hf.segments[0], fast.segments[0]
    lengths = a.completion_mask.sum(1)
    assert lengths.max() > lengths.min()  # rows end at EOS at different steps: padding after EOS
    assert fast.texts == hf.texts
    for name in ("input_ids", "attention_mask", "completion_mask", "sample", "agent"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.prompt_len == b.prompt_len and fast.num_tokens == hf.num_tokens


def test_rows_of_each_adapter_form_one_contiguous_block():
    ro = generate(make_team(2), REQUESTS, 2, max_new_tokens=3, temperature=1.0)
    assert ro.segments[0].agent.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_uneven_blocks_are_padded_and_the_padding_rows_dropped():
    team = make_team(3)
    requests = [(0, "a0 sum 1"), (0, "a0 sum 22"), (0, "go 3"), (2, "x n 4")]  # blocks of 3, 0 and 1 rows
    hf = generate(team, requests, 1, max_new_tokens=10, temperature=0)
    fast = generate(as_engine(team, "compiled"), requests, 1, max_new_tokens=10, temperature=0)
    assert fast.texts == hf.texts
    assert torch.equal(fast.segments[0].completion_mask, hf.segments[0].completion_mask)


def test_engine_sees_each_optimizer_step_without_being_told():
    team = make_team(2)
    fast_team = as_engine(team, "compiled")
    prompts = [(a, f"a{a} sum {k}") for k in range(6) for a in (0, 1)]
    before = generate(fast_team, prompts, 1, max_new_tokens=6, temperature=0).texts
    params = adapter_parameters(team.models[0], "agent_1")
    opt = torch.optim.AdamW(params, lr=0.5, fused=True)  # fused AdamW does not bump tensor version counters
    for p in params:
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(3))
    opt.step()
    after = generate(fast_team, prompts, 1, max_new_tokens=6, temperature=0).texts
    assert after != before  # the step changed agent_1's greedy output ...
    assert after == generate(team, prompts, 1, max_new_tokens=6, temperature=0).texts  # ... and the engine saw it


def test_sampling_ignores_the_model_generation_config_defaults():
    team = make_team(2)
    clean = generate(team, REQUESTS, 1, max_new_tokens=8, temperature=0).texts
    gc = team.models[0].generation_config
    gc.repetition_penalty, gc.top_k, gc.no_repeat_ngram_size = 1e4, 1, 1  # a hub config would bring e.g. 1.05, 20
    for engine in ("hf", "compiled"):
        assert generate(as_engine(team, engine), REQUESTS, 1, max_new_tokens=8, temperature=0).texts == clean


def test_decode_step_traces_as_one_graph():
    """What CUDA graphs need: the decode forward with a static cache has no graph break."""
    from transformers import StaticCache

    team = make_team(2)
    engine = CompiledEngine(team.models[0], team.adapters)
    gen = engine.gen
    gen.layout.active = (0, 1)
    cache = StaticCache(config=gen.config, max_cache_len=16)
    ids = torch.randint(5, 90, (4, 5))
    gen(input_ids=ids, past_key_values=cache, use_cache=True)  # prefill
    torch._dynamo.reset()
    step = torch.compile(gen.forward, backend="eager", fullgraph=True, dynamic=False)
    out = step(input_ids=ids[:, :1], past_key_values=cache, use_cache=True,
               cache_position=torch.tensor([5]), position_ids=torch.full((4, 1), 5))
    assert out.logits.shape == (4, 1, gen.config.vocab_size)


def load_4bit_tiny(tmp_path, bitsandbytes_cpu_path=False):
    """The tiny model through load_base in 4-bit (fp32 compute on a CPU). bitsandbytes_cpu_path=True gives its
    layers back bitsandbytes' own default, which load_base turns off: repacking for its AVX512-BF16 CPU kernel on
    the first no-grad forward, where the CPU has that instruction set (elsewhere this changes nothing)."""
    import bitsandbytes as bnb

    model, tok = load_base(save_tiny_model(str(tmp_path / "tiny")), quantization="4bit", device="cpu",
                           log=lambda *_: None)
    if bitsandbytes_cpu_path:
        for m in model.modules():
            if hasattr(m, "support_avx512bf16_for_cpu"):
                m.support_avx512bf16_for_cpu = bnb.functional.has_avx512bf16()
    return model, tok


def dequantized_twin(pm):
    """What the `copy` generation weights claim to be: the same PEFT model with every 4-bit base layer replaced by
    an nn.Linear holding bitsandbytes' own dequantization of it, in fp32. Built before any forward, while every
    layer is in bitsandbytes' plain layout (a no-grad forward may repack it, see load_base), so it is the same on
    every CPU; it runs no bitsandbytes kernel."""
    import bitsandbytes as bnb

    twin = copy.deepcopy(pm)
    for name, m in list(twin.named_modules()):
        if isinstance(m, bnb.nn.Linear4bit):
            assert not getattr(m.weight.quant_state, "packing_format_for_cpu", False), name
            lin = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
            lin.weight = torch.nn.Parameter(bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state),
                                            requires_grad=False)
            if m.bias is not None:
                lin.bias = torch.nn.Parameter(m.bias.detach().clone(), requires_grad=False)
            twin.set_submodule(name, lin)
    return twin


def per_adapter_logits(pm, adapters, ids):
    """Each adapter's block of rows through PEFT, one adapter at a time (the engine's layout: equal blocks)."""
    rows = len(ids) // len(adapters)
    out = []
    with torch.no_grad():
        for i, adapter in enumerate(adapters):
            pm.set_adapter(adapter)
            out.append(pm(input_ids=ids[i * rows:(i + 1) * rows]).logits.float())
    return torch.cat(out)


def assert_copy_is_the_dequantized_base(engine, pm):
    """Every linear layer of a `copy` generation model holds exactly the dequantized 4-bit weight (and bias)."""
    import bitsandbytes as bnb

    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in engine.gen.modules())
    src = pm.get_base_model()
    checked = 0
    for name, m in src.named_modules():
        if isinstance(m, bnb.nn.Linear4bit):
            copied = engine.gen.get_submodule(name)  # the same name: StackedLoRALinear holds it as base_layer
            assert torch.equal(copied.weight, bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state)), \
                name
            if m.bias is not None:
                assert torch.equal(copied.bias, m.bias), name
            checked += 1
    assert checked == 14  # 2 layers x (q, k, v, o, gate, up, down)


def test_4bit_copy_is_exactly_the_dequantized_base_and_matches_peft_on_it(tmp_path):
    team = make_team(2, model=load_4bit_tiny(tmp_path))
    pm = team.models[0]
    twin = dequantized_twin(pm)
    engine = CompiledEngine(pm, team.adapters, weights="copy")
    assert engine.weights == "copy"
    assert_copy_is_the_dequantized_base(engine, pm)
    ids = torch.randint(5, 90, (4, 7), generator=torch.Generator().manual_seed(0))
    engine.gen.layout.active = (0, 1)
    with torch.no_grad():
        logits = engine.gen(input_ids=ids).logits.float()
    # fp32 on both sides, no bitsandbytes kernel on either: the tolerance of the stacked-vs-PEFT test above
    torch.testing.assert_close(logits, per_adapter_logits(twin, team.adapters, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bitsandbytes_cpu_path", [False, True], ids=["load_base", "bitsandbytes_default"])
def test_4bit_generation_weights_match_peft_within_bitsandbytes_own_deviation(tmp_path, bitsandbytes_cpu_path):
    """generation_weights='4bit' runs bitsandbytes' no-grad 4-bit kernels, whose result depends on the machine (fp32
    dequantize-and-matmul, or on a CPU with AVX512-BF16 and bitsandbytes' default a bf16 kernel). What the kit
    adds (LoRA stacked around those layers, fp32 copies of embeddings and norms) is checked against the dequantized
    twin with a tolerance measured here: twice what bitsandbytes' kernels alone change in the logits of the base
    (adapters off) on this machine, since the adapters move the activations those kernels see, plus the fp32
    floor of the copy test. A wiring error moves the logits by the adapters' effect (several units); where the
    tolerance is not well below that, the test says so and skips."""
    team = make_team(2, model=load_4bit_tiny(tmp_path, bitsandbytes_cpu_path))
    pm = team.models[0]
    twin = dequantized_twin(pm)  # before bitsandbytes' first forward, which may repack its layers
    ids = torch.randint(5, 90, (4, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), pm.disable_adapter(), twin.disable_adapter():
        base_4bit, base_exact = pm(input_ids=ids).logits.float(), twin(input_ids=ids).logits.float()
    bnb_deviation = (base_4bit - base_exact).abs().max().item()
    ref = per_adapter_logits(twin, team.adapters, ids)
    effect = (ref - base_exact).abs().max().item()
    tol = 1e-4 + 2 * bnb_deviation
    if tol > 0.1 * effect:
        pytest.skip(f"bitsandbytes' 4-bit kernels on this machine change the base's logits by {bnb_deviation:.3g}: "
                    f"a tolerance of {tol:.3g} cannot tell a wiring error from the adapters' effect ({effect:.3g})")
    engine = CompiledEngine(pm, team.adapters, weights="4bit")
    assert engine.weights == "4bit"
    engine.gen.layout.active = (0, 1)
    with torch.no_grad():
        logits = engine.gen(input_ids=ids).logits.float()
    torch.testing.assert_close(logits, ref, atol=tol, rtol=0)


def test_4bit_copy_with_lora_on_some_layers_only(tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tok = load_4bit_tiny(tmp_path)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
                        adapter_name="agent_0")
    twin = dequantized_twin(pm)
    engine = CompiledEngine(pm, ["agent_0"], weights="copy")
    assert_copy_is_the_dequantized_base(engine, pm)  # o_proj, MLP (no LoRA): plain copies too
    ids = torch.randint(5, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(engine.gen(input_ids=ids).logits.float(), twin(input_ids=ids).logits.float(),
                                   atol=1e-4, rtol=1e-4)


def test_4bit_copy_of_a_base_repacked_for_the_cpu_kernel_is_still_its_dequantization(tmp_path):
    """bitsandbytes >= 0.49 repacks a 4-bit layer for its AVX512-BF16 CPU kernel on the first no-grad forward (not
    under load_base). Done here with bitsandbytes' own packing function, on any CPU: the copy must still be the
    layer's weight, not the packed bytes read as plain ones (peft's dequantize does that: logits off by ~10)."""
    import bitsandbytes as bnb

    pack = getattr(bnb.functional, "_convert_weight_packed_for_cpu", None)
    if pack is None:
        pytest.skip(f"bitsandbytes {bnb.__version__} does not repack 4-bit layers for a CPU kernel")
    model, tok = load_4bit_tiny(tmp_path)
    pm = attach_adapters(model, ["agent_0"], lora_config(8, 16, 0.0, "all-linear"))
    layers = {n: m for n, m in pm.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    plain = {n: bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state) for n, m in layers.items()}
    for m in layers.values():  # what Linear4bit.forward does on such a CPU
        m.weight.data, m.weight.quant_state = pack(m.weight.data, m.weight.quant_state)
    engine = CompiledEngine(pm, ["agent_0"], weights="copy")
    for name, m in layers.items():
        copied = engine.gen.get_submodule(name.removeprefix("base_model.model."))
        # the packed layer's scales are rounded to bf16 (half its epsilon, relative); a misread layout is off by O(1)
        torch.testing.assert_close(copied.weight, plain[name], rtol=torch.finfo(torch.bfloat16).eps, atol=0)
        assert m.weight.quant_state.packing_format_for_cpu  # the base layer itself is left as bitsandbytes had it


def test_load_base_keeps_one_4bit_layout_for_sampling_and_training(tmp_path):
    """load_base turns off bitsandbytes' CPU repacking: after a no-grad pass (sampling) every layer is as loaded,
    and the update's forward and backward still reach every adapter (with the repack, bitsandbytes 0.50 fails on
    the first biased layer). Where the CPU has no AVX512-BF16 nothing is repacked either way."""
    import bitsandbytes as bnb

    team = make_team(2, model=load_4bit_tiny(tmp_path))
    pm = team.models[0]
    ids = torch.randint(5, 90, (4, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pm(input_ids=ids)
    packed = [n for n, m in pm.named_modules()
              if isinstance(m, bnb.nn.Linear4bit) and getattr(m.weight.quant_state, "packing_format_for_cpu", False)]
    assert packed == []
    pm.set_adapter("agent_0")
    pm(input_ids=ids).logits.sum().backward()
    grads = [p.grad for p in adapter_parameters(pm, "agent_0")]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_4bit_generation_weights_decode_and_cache_in_the_compute_dtype(tmp_path):
    """peft's k-bit preparation upcasts embeddings and norms to fp32 for the update; generation gets bf16 copies,
    so its residual stream and static KV cache are bf16 (as on CUDA, with bf16 compute: load_base uses fp32 on a
    CPU)."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from kit.engine.rollout import sampling_config

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(save_tiny_model(str(tmp_path / "tiny")), quantization_config=quant,
                                                 dtype=torch.bfloat16, device_map={"": "cpu"})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # what load_base does
    pm = attach_adapters(model, ["agent_0", "agent_1"], lora_config(8, 16, 0.0, "all-linear"))
    embeddings = pm.get_base_model().get_input_embeddings().weight
    assert embeddings.dtype == torch.float32
    engine = CompiledEngine(pm, ["agent_0", "agent_1"], weights="4bit")
    gen = engine.gen
    floats = {n: p.dtype for n, p in gen.named_parameters() if p.is_floating_point() and ".base_layer." not in n}
    assert set(floats.values()) == {torch.bfloat16} and "model.norm.weight" in floats
    assert gen.get_output_embeddings().weight is gen.get_input_embeddings().weight  # still tied: one copy
    assert embeddings.dtype == torch.float32  # the update's tensors are untouched
    ids = torch.randint(5, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    engine.generate(ids, torch.ones_like(ids), ["agent_0", "agent_1"], sampling_config(2, 0, 1, 0, [1], 0))
    (cache,) = engine.caches.values()
    assert {layer.keys.dtype for layer in cache.layers} == {torch.bfloat16}


def test_buckets():
    assert [bucket_rows(n) for n in (1, 2, 3, 5, 8, 9, 16, 17)] == [1, 2, 4, 8, 8, 16, 16, 24]
    assert [bucket_len(n) for n in (1, 256, 257, 700)] == [256, 256, 512, 768]


def test_unsupported_adapters_fall_back_to_hf_on_auto_and_fail_clearly_on_compiled(monkeypatch):
    from peft import LoraConfig, get_peft_model

    import kit.engine.rollout as rollout

    model, tok = build_tiny_model(0)
    pm = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", use_dora=True), adapter_name="agent_0")
    with pytest.raises(ValueError, match="DoRA.*use rollout_engine=hf"):
        generate(Team([pm], [tok], [0], ["agent_0"], rollout_engine="compiled"), [(0, "x")], 1, max_new_tokens=2,
                 temperature=0)
    monkeypatch.setattr(rollout, "auto_engine", lambda device: "compiled")  # as on CUDA
    lines = []
    engine = rollout.engine_for(Team([pm], [tok], [0], ["agent_0"], rollout_engine="auto"), 0, log=lines.append)
    assert isinstance(engine, rollout.HFEngine)
    assert len(lines) == 1 and "DoRA" in lines[0] and "rollout_engine=hf" in lines[0]


def test_grouping_is_required():
    team = make_team(2)
    engine = CompiledEngine(team.models[0], team.adapters)
    ids = torch.ones(2, 3, dtype=torch.long)
    from kit.engine.rollout import sampling_config

    with pytest.raises(ValueError, match="grouped by adapter"):
        engine.generate(ids, torch.ones_like(ids), ["agent_1", "agent_0"], sampling_config(2, 0, 1, 0, [1], 0))
