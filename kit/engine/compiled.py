"""The `compiled` rollout engine: static KV cache, torch.compile with CUDA graphs, every agent's LoRA in one batch.

PEFT's mixed-adapter path (`adapter_names=[...]`) gathers rows per adapter in Python at every layer of every
decode step, and bitsandbytes' 4-bit layers dequantize at every call: decoding becomes bound by kernel
launches, and neither compiles into a CUDA graph. This engine keeps the update on PEFT and decodes with a
separate *generation model* built once per base:

- the same transformers class and config, on the same base weights: shared when they are already in the
  generation dtype (no copy), or a bf16/fp16 copy made once at load (dequantized from the 4-bit base, so the
  sampling policy is the trained policy), or the 4-bit layers themselves when a copy does not fit (with a
  compute-dtype copy of the few other tensors, which peft's k-bit preparation upcast to fp32: embeddings, norms,
  lm_head), so that the residual stream and the static KV cache are always in the generation dtype;
- every LoRA target layer replaced by `StackedLoRALinear`: the adapters' A and B stacked into two buffers
  (n, in, r) and (n, r, out), applied with two batched matmuls over the batch reshaped to (n, rows, ...),
  since the rows of each adapter sit in one contiguous block of equal size. No per-row gather, no
  data-dependent indexing: the whole decode step compiles into one CUDA graph;
- `sync()` copies the adapters' current weights into those buffers in place (their addresses, and so the
  captured graphs, stay valid); `kit.engine.rollout.generate` calls it before every engine call, so every optimizer
  step and every checkpoint load is seen, and the base is never copied again (LoRA tensors only: a few foreach
  kernels).

Shapes are bucketed so that a run compiles a few times, not every step: rows per adapter round up to a
power of two (up to 8) or a multiple of 8 (padding rows repeat a real prompt and are stopped at once), and the
static cache length rounds up to a multiple of 256 tokens. Prefill runs eagerly (any prompt length); only the
decode step is compiled, by transformers' own `generate` (its auto-compile for static caches). The first call
of a new shape is a short greedy warm-up whose time is reported as compile time (`perf/compile_s`).

On a CPU the same generation model runs eagerly (tests check it against PEFT in fp32); compilation is for
CUDA. Not covered: DoRA, LoRA on embeddings, per-adapter ranks that differ (these need `rollout_engine=hf`).
"""

from __future__ import annotations

import copy
import sys
import time

import torch
from torch import nn
from transformers import StoppingCriteria

from kit.engine.batching import decode_watchers
from kit.engine.sampling import sampled_logprobs, seeded_config

CACHE_BUCKET = 256  # static cache lengths are multiples of this
MAX_CACHES = 4  # static caches kept per engine (one per (rows, length) shape in use)


def bucket_rows(n: int) -> int:
    """Rows per adapter block: 1, 2, 4, 8, then multiples of 8."""
    if n <= 8:
        return 1 << max(n - 1, 0).bit_length()
    return -(-n // 8) * 8


def bucket_len(n: int) -> int:
    return -(-n // CACHE_BUCKET) * CACHE_BUCKET


class Layout:
    """Which adapters the current batch holds, in block order (shared by every StackedLoRALinear)."""

    def __init__(self, num_adapters: int):
        self.all = tuple(range(num_adapters))
        self.active = self.all


class StackedLoRALinear(nn.Module):
    """base(x) + scaling * B_a A_a x for every row, with a = the adapter of the row's block.

    x: (R, T, in) with R = k * b rows, the b rows of each of the k active adapters contiguous.
    """

    def __init__(self, base_layer: nn.Module, num_adapters: int, rank: int, layout: Layout, dtype, device):
        super().__init__()
        self.base_layer = base_layer
        self.layout = layout
        in_f, out_f = base_layer.in_features, base_layer.out_features
        self.register_buffer("lora_A", torch.zeros(num_adapters, in_f, rank, dtype=dtype, device=device))  # A^T
        self.register_buffer("lora_B", torch.zeros(num_adapters, rank, out_f, dtype=dtype, device=device))  # s*B^T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # (R, T, out)
        A, B = self.lora_A, self.lora_B
        active = self.layout.active
        if active != self.layout.all:  # a Python constant for the compiler: one graph per layout
            A, B = A[list(active)], B[list(active)]
        h = x.reshape(len(active), -1, x.shape[-1]).to(A.dtype)  # (k, b*T, in)
        delta = torch.bmm(torch.bmm(h, A), B)  # (k, b*T, out)
        return y + delta.reshape(y.shape).to(y.dtype)


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def _check_supported(layers: dict, adapters: list[str]) -> int:
    """The common LoRA rank; ValueError naming what the engine cannot do."""
    ranks = set()
    for name, m in layers.items():
        for a in adapters:
            if a not in m.lora_A:
                raise ValueError(f"{name} has no LoRA for adapter {a!r} (or it is not a linear layer)")
            if m.use_dora.get(a) or getattr(m, "lora_bias", {}).get(a):
                raise ValueError(f"{name}: DoRA and LoRA biases are not supported by rollout_engine=compiled")
            ranks.add(m.r[a])
        if not hasattr(m.get_base_layer(), "in_features"):
            raise ValueError(f"{name}: LoRA on a {type(m.get_base_layer()).__name__} is not supported by "
                             "rollout_engine=compiled (linear layers only)")
    if len(ranks) != 1:
        raise ValueError(f"adapters of different ranks {sorted(ranks)} are not supported by rollout_engine=compiled")
    return ranks.pop()


def _is_4bit(layer) -> bool:
    """A bitsandbytes 4-bit linear (not PEFT's LoRA wrapper around one, which has the same class name)."""
    bnb = sys.modules.get("bitsandbytes")  # a 4-bit model has imported it already
    return bnb is not None and isinstance(layer, bnb.nn.Linear4bit)


def compute_dtype(model) -> torch.dtype:
    """The dtype the base computes in: a 4-bit layer's compute dtype, else its linear weights' dtype."""
    base = next(iter(_lora_layers(model).values())).get_base_layer()
    return getattr(base, "compute_dtype", None) or base.weight.dtype


def generation_bytes(model, dtype) -> int:
    """Bytes of a `dtype` copy of the base (LoRA excluded; tied tensors counted once)."""
    size = torch.tensor([], dtype=dtype).element_size()
    seen, total = set(), 0
    for name, m in model.named_modules():
        for p in m.parameters(recurse=False):
            if id(p) in seen or "lora_" in name:
                continue
            seen.add(id(p))
            total += (m.in_features * m.out_features if _is_4bit(m) and p is m.weight else p.numel()) * size
    return total


def choose_weights(model, weights: str, dtype, device: torch.device, log=print) -> str:
    """'share' (use the base tensors), 'copy' (a dtype copy made once) or '4bit' (the 4-bit layers themselves)."""
    quantized = any(_is_4bit(m) for m in model.modules())
    if weights == "copy":
        return "copy"
    if weights == "4bit":
        if not quantized:
            raise ValueError("generation_weights='4bit' needs a 4-bit base (quantization=4bit or auto on CUDA)")
        return "4bit"
    if not quantized:
        floats = {p.dtype for n, p in model.named_parameters() if "lora_" not in n and p.is_floating_point()}
        return "share" if floats <= {dtype} else "copy"
    need = generation_bytes(model, dtype)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        fits = need <= 0.5 * free  # the other half stays for the update's activations
        log(f"[kit] generation weights: {'a ' + str(dtype).split('.')[-1] + ' copy' if fits else '4-bit'} "
            f"({need / 2**30:.1f} GiB for a copy, {free / 2**30:.1f} GiB free of {total / 2**30:.1f})")
        return "copy" if fits else "4bit"
    return "copy"


def _set(root: nn.Module, dotted: str, value) -> None:
    path, _, leaf = dotted.rpartition(".")
    module = root.get_submodule(path) if path else root
    if leaf in module._parameters:
        module._parameters[leaf] = value if isinstance(value, nn.Parameter) else nn.Parameter(value, False)
    elif leaf in module._buffers:
        module._buffers[leaf] = value
    else:
        setattr(module, leaf, value)


def build_generation_model(peft_model, adapters: list[str], weights: str, dtype):
    """A plain transformers model on the base's weights with StackedLoRALinear in place of every LoRA layer.

    weights: 'share' | 'copy' | '4bit' (see `choose_weights`). Returns (model, {name: (layer, peft_layer)}).
    """
    from transformers import AutoModelForCausalLM

    src = peft_model.get_base_model()
    device = next(p.device for p in src.parameters())
    layers = _lora_layers(src)
    rank = _check_supported(layers, adapters)
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        gen = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    converted: dict[int, torch.Tensor] = {}  # id(source tensor) -> generation tensor, so ties stay ties

    def convert(t: torch.Tensor, is_param: bool):
        """A float parameter in the generation dtype: the same storage when it is in it, else a copy, made once.

        In every mode, 4bit included: peft's k-bit preparation upcasts embeddings, norms and lm_head to fp32, and
        generating on those would run an fp32 residual stream and an fp32 static KV cache (twice the memory)."""
        if not t.is_floating_point() or not is_param:
            return t
        if id(t) not in converted:
            converted[id(t)] = nn.Parameter(t.detach().to(device=device, dtype=dtype), requires_grad=False)
        return converted[id(t)]

    def linear(base: nn.Module) -> nn.Module:
        """The base layer itself, or its dtype copy (dequantized when it is 4-bit)."""
        if weights != "copy":
            return base
        if _is_4bit(base):
            from kit.engine.models import dequantize_4bit  # also reads bitsandbytes' CPU kernel layout (peft's does not)

            w = dequantize_4bit(base)
        else:
            w = base.weight.detach()
        lin = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        lin.weight = nn.Parameter(w.to(device=device, dtype=dtype), requires_grad=False)
        if base.bias is not None:
            lin.bias = nn.Parameter(base.bias.detach().to(device=device, dtype=dtype), requires_grad=False)
        return lin

    layout = Layout(len(adapters))
    pairs = {}
    for name, layer in layers.items():
        stacked = StackedLoRALinear(linear(layer.get_base_layer()), len(adapters), rank, layout, dtype, device)
        _set(gen, name, stacked)
        pairs[name] = (stacked, layer)
    inside = tuple(name + "." for name in layers)
    plain_4bit = [n for n, m in src.named_modules() if _is_4bit(m) and not n.startswith(inside)]  # no LoRA on them
    for name in plain_4bit:
        _set(gen, name, linear(src.get_submodule(name)))
    inside_lora = inside + tuple(name + "." for name in plain_4bit)
    for named in (src.named_parameters(remove_duplicate=False), src.named_buffers(remove_duplicate=False)):
        for name, t in named:
            if not name.startswith(inside_lora):
                _set(gen, name, convert(t, isinstance(t, nn.Parameter)))
    for name, module in gen.named_modules():  # plain tensor attributes (e.g. rotary's original_inv_freq)
        for key, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta:
                setattr(module, key, getattr(src.get_submodule(name), key).to(device))
    left = [n for n, t in list(gen.named_parameters()) + list(gen.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"generation model: no source tensor for {left[:5]}")
    gen.generation_config = copy.deepcopy(src.generation_config)
    gen.layout = layout
    return gen.eval(), pairs


class CompiledEngine:
    """Decodes every adapter's rows in one batch on a generation model (see the module docstring)."""

    name = "compiled"

    def __init__(self, peft_model, adapters: list[str], *, weights: str = "auto", dtype=None,
                 compile: bool | None = None, log=print):
        self.adapters = list(adapters)
        device = next(peft_model.parameters()).device
        dtype = dtype or compute_dtype(peft_model)
        self.weights = choose_weights(peft_model, weights, dtype, device, log)
        self.gen, self.pairs = build_generation_model(peft_model, self.adapters, self.weights, dtype)
        # 4-bit layers do not compile into CUDA graphs; they still get the static cache and stacked LoRA
        self.compile = (device.type == "cuda" and self.weights != "4bit") if compile is None else compile
        self.caches: dict[tuple[int, int], object] = {}
        self.warm: set = set()
        self.compile_seconds = 0.0  # cumulative, read by the rollout as a delta
        self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the adapters' current LoRA weights into the stacked buffers, in place (a few foreach kernels).

        `kit.engine.rollout.generate` calls it before every call: version counters would be cheaper to check, but fused
        optimizers do not bump them, and a stale adapter would silently sample from an old policy.
        """
        dst, src, dst_b, src_b, scales = [], [], [], [], []
        for stacked, layer in self.pairs.values():
            for i, a in enumerate(self.adapters):
                dst.append(stacked.lora_A[i])
                src.append(layer.lora_A[a].weight.t())
                dst_b.append(stacked.lora_B[i])
                src_b.append(layer.lora_B[a].weight.t())
                scales.append(float(layer.scaling[a]))
        torch._foreach_copy_(dst + dst_b, src + src_b)
        torch._foreach_mul_(dst_b, scales)

    def _cache(self, rows: int, length: int):
        from transformers import StaticCache

        key = (rows, length)
        cache = self.caches.pop(key, None)
        if cache is None:
            while len(self.caches) >= MAX_CACHES:
                self.caches.pop(next(iter(self.caches)))
            cache = StaticCache(config=self.gen.config, max_cache_len=length)
        else:
            cache.reset()
        self.caches[key] = cache  # most recently used last
        return cache

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, adapters: list[str],
                 generation_config, row_seeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompts (R, P), rows grouped by adapter -> completion ids (R, T), EOS then padding, and the
        sampler's log-probs of those tokens (R, T) (kit.engine.rollout.Engine)."""
        index = [self.adapters.index(a) for a in adapters]
        if index != sorted(index):
            raise ValueError("rows must be grouped by adapter (each adapter's rows in one contiguous block)")
        active = tuple(dict.fromkeys(index))
        block = bucket_rows(max(index.count(i) for i in active))
        rows, real = [], []  # rows of the padded batch (source row), and the batch positions of real rows
        for i in active:
            mine = [r for r, j in enumerate(index) if j == i]
            real += range(len(rows), len(rows) + len(mine))
            rows += mine + [mine[0]] * (block - len(mine))
        ids, att = input_ids[rows], attention_mask[rows]
        length = bucket_len(ids.shape[1] + generation_config.max_new_tokens)
        stopping = decode_watchers(generation_config.max_new_tokens)  # a progress bar's ticks, when one watches
        if len(rows) > len(real):
            padding = torch.ones(len(rows), dtype=torch.bool, device=ids.device)
            padding[real] = False
            stopping.append(_StopRows(padding))
        self.gen.layout.active = active
        shape = (active, len(rows), length)
        if self.compile and shape not in self.warm:
            t0 = time.perf_counter()
            warm = copy.deepcopy(generation_config)
            warm.do_sample, warm.max_new_tokens = False, 4
            warm.temperature, warm.top_p, warm.top_k = 1.0, 1.0, 50  # greedy, as in rollout.sampling_config
            self.gen.generate(input_ids=ids, attention_mask=att, past_key_values=self._cache(len(rows), length),
                              generation_config=warm)
            torch.cuda.synchronize()
            self.compile_seconds += time.perf_counter() - t0
            self.warm.add(shape)
        config, processors = seeded_config(generation_config, None if row_seeds is None else row_seeds[rows])
        config = copy.deepcopy(config)
        config.disable_compile = not self.compile
        seq = self.gen.generate(input_ids=ids, attention_mask=att, past_key_values=self._cache(len(rows), length),
                                generation_config=config, stopping_criteria=stopping, logits_processor=processors)
        completion = seq[:, ids.shape[1]:]
        return completion[real], sampled_logprobs(generation_config, processors, completion)[real]


class _StopRows(StoppingCriteria):
    """A stopping criterion that marks the padding rows finished from the first step."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return self.rows
