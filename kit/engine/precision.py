"""The precision a base model runs in: dtype=auto's choice per device, and the fp32 output layer of a bf16 base.

    dtype, why = choose_dtype("auto", torch.device("cpu"), hidden_size=896)   # bf16 where the CPU computes it
    fp32_head(model)                                                           # TRL's cast_lm_head_to_fp32

On CUDA, auto is bf16 (fp16 where the GPU lacks it). On a CPU, auto is bf16 only where the CPU computes it in
hardware (kit.env.cpu_bf16 reads its flags) and the model is wide enough to gain from it; everywhere else fp32. A bf16
base keeps the LoRA adapters in fp32 (PEFT's autocast_adapter_dtype: their gradients and Adam's state are fp32) and
gets an fp32 output layer here, so the sampler's logits and the update's log-probs are fp32 products of the same
weights; what still differs between them (the KV-cached decode against the update's full forward, rounded to bf16)
is what the rollout correction measures and weighs (kit/engine/rollout.py sampler_differs).

The compiled engine (rollout_engine=compiled, CUDA's default) decodes with its own bf16/fp16 copy of the weights, the
output layer included: there the sampler's head is not the update's, which the rollout correction weighs (sampler_differs
names the engine). Not covered: fp16 on a CPU (allowed when set, never chosen), a 4-bit base on a CPU (bitsandbytes'
own kernels).
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# dtype=auto on a CPU with native bf16 keeps a model this narrow in fp32: the built-in tiny model (hidden 64) took 38 s
# for its first step in bf16 against well under a second in fp32 on an AMX CPU (issue 77), while SmolLM2-135M (576)
# generated 2.6x and Qwen2.5-Coder-0.5B (896) 1.95x faster in bf16 there (bench/README.md, "What else a CPU offers").
BF16_MIN_HIDDEN = 256


def choose_dtype(dtype: str, device: torch.device, hidden_size: int | None = None, cpu=None) -> tuple[torch.dtype, str]:
    """(the dtype a base loads in, why): `dtype` itself unless it is auto. auto: bf16 on CUDA where supported, else
    fp16; on a CPU, bf16 where the CPU computes it natively (its own flags, kit.env.cpu_bf16) and the model is
    wide enough to gain from it (BF16_MIN_HIDDEN), else fp32. `cpu`: a kit.env.CpuBf16, for tests."""
    if dtype != "auto":
        return DTYPES[dtype], f"dtype={dtype}"
    if device.type == "cuda":
        return (torch.bfloat16, "CUDA with bf16") if torch.cuda.is_bf16_supported() else \
            (torch.float16, "CUDA without bf16")
    from kit.env import cpu_bf16

    cpu = cpu or cpu_bf16()
    if not cpu.native:
        return torch.float32, (f"this CPU has no native bf16 (none of avx512_bf16, amx_bf16, bf16 in {cpu.source}): "
                               "bf16 would be emulated, slower than fp32")
    if hidden_size is None or hidden_size < BF16_MIN_HIDDEN:
        return torch.float32, (f"native bf16 ({', '.join(cpu.flags)}), but a model of hidden size {hidden_size} "
                               f"(< {BF16_MIN_HIDDEN}) runs faster in fp32")
    return torch.bfloat16, f"this CPU computes bf16 natively ({', '.join(cpu.flags)})"


def resolve_dtype(dtype: str, device: torch.device, hidden_size: int | None = None) -> torch.dtype:
    return choose_dtype(dtype, device, hidden_size)[0]


def _float_input(module, args):
    return (args[0].float(), *args[1:])


def fp32_head(model) -> bool:
    """The output layer in fp32 on a bf16/fp16 base (TRL's cast_lm_head_to_fp32): its own fp32 copy of the weight
    (a tied embedding stays as it is) and its input cast to fp32, so the sampler's logits and the update's
    (kit/maths/losses.py reads the same weight) are fp32 products, not rounded to bf16's 8 bits. True when done."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.weight.dtype == torch.float32:
        return False
    new = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, dtype=torch.float32,
                          device=head.weight.device)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        if head.bias is not None:
            new.bias.copy_(head.bias)
    new.requires_grad_(False)
    new.register_forward_pre_hook(_float_input)
    model.set_output_embeddings(new)
    model.config.tie_word_embeddings = False  # never re-tied to the bf16 embedding
    return True
