"""Base models, tokenizers and one LoRA adapter per agent.

A team is one (or, for heterogeneous teams, a few) frozen base models with PEFT LoRA adapters on top:
agent i uses adapter `agent_i` (or the single adapter `shared` when `share_adapter=True`). Agents that sit on
the same base are generated together in one `generate` call, each row routed to its adapter through PEFT's
`adapter_names`; see `kit/engine/rollout.py`.

On CUDA the base is loaded in 4-bit NF4 through bitsandbytes; on a CPU the kit says so in one line and uses full
precision. `quantization="4bit"` forces the 4-bit path on a CPU too (slow, used only to test it).

The built-in tiny model (`model_name="tiny"`) is a real `Qwen2ForCausalLM` (the architecture of
Qwen2.5-Coder) with random weights drawn from a fixed seed and a character-level tokenizer built from code, so
it needs no download and is identical on every run of a machine. It exists for tests and the CPU demo. Two
choices make it learnable: a unit-gain init (std 1/sqrt(hidden)) with tied embeddings, so the output can depend on
the prompt and the logits have room to move, and a 60-step deterministic warm-up that teaches the answer format
of short prompts (one digit, then <eos>) with random digits, as a pretrained model would already know a format.

Several GPUs: `agent_devices` puts each base of a heterogeneous team on its own device (model parallelism by agent,
in one process); data parallelism over items is kit/run/distributed.py. Not covered: one base split over GPUs
(`device_map="auto"`), full fine-tuning (the kit trains adapters only).
"""

from __future__ import annotations

import copy
import functools
import logging
import warnings
from dataclasses import dataclass, field

import torch

# resolve_dtype: callers import it from here
from kit.engine.precision import choose_dtype, fp32_head, resolve_dtype  # noqa: F401

TINY = "tiny"
# Characters the tiny tokenizer knows: printable ASCII plus newline and tab, so it can read and write code.
TINY_CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
TINY_SPECIALS = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}<eos>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class _DropBitsandbytesCpuKernelNotice(logging.Filter):
    """bitsandbytes 0.50, imported (by peft or transformers) on a CPU with AVX512-BF16 and without the `kernels`
    package, logs "Failed to load CPU gemm_4bit_forward from kernels-community ... pip install kernels". That kernel
    serves only 4-bit layers repacked into bitsandbytes' CPU layout, which load_base turns off (see there), so the
    kit never calls it, and `pip install kernels` would only make bitsandbytes fetch it from the Hub at import. The
    line tells a newcomer to do something that changes nothing: drop that one message, nothing else of the logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


# On the logger itself (getLogger makes it before bitsandbytes does), before anything of the kit imports peft.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropBitsandbytesCpuKernelNotice())


def build_tiny_tokenizer():
    """A character-level tokenizer with a chat template, built from code (no files, no network)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIALS + TINY_CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def build_tiny_model(seed: int = 0, hidden_size: int = 64, num_layers: int = 2, warmup_steps: int = 60):
    """A small Qwen2 causal LM with seeded random weights; returns (model, tokenizer)."""
    from transformers import Qwen2ForCausalLM

    tok = build_tiny_tokenizer()
    model = Qwen2ForCausalLM(_tiny_config(tok, hidden_size, num_layers))
    model.load_state_dict(_tiny_weights(seed, hidden_size, num_layers, warmup_steps))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval(), tok


def _tiny_config(tok, hidden_size: int, num_layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        # Unit-gain init (std 1/sqrt(hidden)) instead of the usual 0.02: with 0.02 and a final RMSNorm no logit
        # can exceed ~1.3 and attention carries ~3% of the residual stream, so the output ignores the prompt
        # and no adapter can make any answer likely. A real pretrained model has neither problem.
        initializer_range=hidden_size ** -0.5,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )


@functools.lru_cache(maxsize=4)
def _tiny_weights(seed: int, hidden_size: int, num_layers: int, warmup_steps: int) -> dict:
    """The tiny model's weights, built once per process (the warm-up takes seconds); callers get copies."""
    from transformers import Qwen2ForCausalLM

    tok = build_tiny_tokenizer()
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen2ForCausalLM(_tiny_config(tok, hidden_size, num_layers))
        if warmup_steps:
            _warm_up(model, tok, warmup_steps, seed)
    finally:
        torch.random.set_rng_state(rng_state)  # building the model must not disturb the caller's RNG stream
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _warm_up(model, tok, steps: int, seed: int) -> None:
    """Teach the random model the answer format of short prompts: one digit, then <eos>.

    A pretrained LM already knows how to answer; a random one spreads its mass over ~100 characters, so an RL
    task whose answers are digits would see almost no reward. The digits here are uniformly random and
    independent of the prompt, so the model learns the format and nothing about any task's solution.
    """
    import random as _random

    rng = _random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    tok.padding_side = "left"
    digit_ids = torch.tensor(tok.convert_tokens_to_ids([str(d) for d in range(10)]))
    model.train()
    for _ in range(steps):
        prompts = [f"{rng.choice(['a0', 'a1', 'a2', 'x'])} {rng.choice(['sum', 'n', 'go'])} {rng.randint(0, 99)}"
                   for _ in range(32)]
        texts = [p if rng.random() < 0.5 else tok.apply_chat_template([{"role": "user", "content": p}],
                                                                          tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        answers = torch.randint(0, 10, (len(texts),), generator=gen)
        ids = torch.cat([enc["input_ids"], digit_ids[answers][:, None],
                         torch.full((len(texts), 1), tok.eos_token_id)], 1)
        att = torch.cat([enc["attention_mask"], torch.ones(len(texts), 2, dtype=torch.long)], 1)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits[:, -3:-1]  # (B, 2, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, -2:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def save_tiny_model(path: str, seed: int = 0) -> str:
    """Write the tiny model and tokenizer to `path` (a normal HF folder), e.g. to test loading by path."""
    model, tok = build_tiny_model(seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise ValueError(f"device={device!r} but this machine has {count or 'no'} CUDA GPU(s): use device=auto "
                             "(the GPU when there is one, else the CPU) or device=cpu")
    return dev


def load_base(name: str, *, quantization: str = "auto", dtype: str = "auto", device: str = "auto",
              gradient_checkpointing: bool = False, seed: int = 0, log=print, revision: str | None = None):
    """Load a base causal LM and its tokenizer by hub name, local path or short name (kit/engine/weights.py, e.g.
    smollm2-135m: the hub where it answers, else a packaged copy); returns (model, tokenizer).

    quantization: "auto" (4-bit NF4 on CUDA, full precision on a CPU), "4bit" (always), "none".
    revision: the hub commit to load (a resumed run's; None: the newest).
    """
    from kit.engine import weights

    if weights.is_short_name(name):
        name, source = weights.resolve(name, log=log)
        revision = weights.hub_revision(source)
    dev = resolve_device(device)
    if name == TINY:
        model, tok = build_tiny_model(seed)
        if quantization == "4bit":
            raise ValueError("quantization='4bit' needs a model on disk; save it first with "
                             "kit.engine.models.save_tiny_model(path) and load that path")
        # auto: fp32 on every device (hidden 64: a narrow model gains nothing from bf16; CUDA runs it as before)
        torch_dtype = torch.float32 if dtype == "auto" else resolve_dtype(dtype, dev)
        model = model.to(dev, torch_dtype)
        if dev.type == "cpu":
            fp32_head(model)
        return model, tok

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    use_4bit = quantization == "4bit" or (quantization == "auto" and dev.type == "cuda")
    hidden = None
    if dtype == "auto" and dev.type != "cuda":
        try:
            hidden = getattr(AutoConfig.from_pretrained(name, **({"revision": revision} if revision else {})),
                             "hidden_size", None)
        except (OSError, ValueError):  # the model's own load below says what is wrong
            pass
    torch_dtype, why = choose_dtype(dtype, dev, hidden)
    if quantization == "auto" and dev.type != "cuda":
        what = "full precision (float32)" if torch_dtype == torch.float32 else \
            f"{str(torch_dtype).replace('torch.', '')}, its LoRA adapters and output layer in float32"
        log(f"[kit] no CUDA device: loading {name} in {what} instead of 4-bit: {why}")
    kwargs: dict = {"dtype": torch_dtype}
    if use_4bit:
        from transformers import BitsAndBytesConfig

        compute = torch_dtype if dev.type == "cuda" else torch.float32
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute)
        kwargs["device_map"] = {"": dev.index or 0} if dev.type == "cuda" else {"": "cpu"}
    if revision:
        kwargs["revision"] = revision
    try:
        tok = AutoTokenizer.from_pretrained(name, **({"revision": revision} if revision else {}))
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as err:
        short = [s for s, spec in weights.SHORT_NAMES.items() if spec.hub_id == name]
        raise RuntimeError(
            f"could not load model {name!r}: {err}\n"
            "Check the name on huggingface.co, or pass a local folder. Gated models need a token "
            "(HF_TOKEN, or Colab secrets). Without a network, use model_name=tiny"
            + (f", or model_name={short[0]} (the same model, from a package when the hub does not answer)."
               if short else ".")) from err
    if not use_4bit:
        model.to(dev)
        if dev.type == "cpu":
            fp32_head(model)
    if tok.pad_token is None:  # many causal LMs ship without one; eos is the usual stand-in
        tok.pad_token = tok.eos_token
    if use_4bit:
        from peft import prepare_model_for_kbit_training

        # bitsandbytes >= 0.49, on a CPU with AVX512-BF16: a 4-bit layer's first no-grad eval forward repacks its
        # weight in place into a CPU-only layout and from then on computes in bf16 whatever the compute dtype, with
        # no gradient to its input (with 0.50 a later forward with grad fails on a biased layer such as Qwen2's
        # q_proj; LoRA below it would otherwise stop learning) and a layout that bitsandbytes' dequantize_4bit reads
        # as scrambled weights (dequantize_4bit below undoes it). The kit's base must keep one layout and one
        # precision for sampling and training alike: turn that fast path off (the attribute does not exist before
        # 0.49; tests/test_compiled_engine.py checks that a no-grad pass leaves every layer as it was).
        for m in model.modules():
            if hasattr(m, "support_avx512bf16_for_cpu"):
                m.support_avx512bf16_for_cpu = False
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    elif gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok


def dequantize_4bit(layer) -> torch.Tensor:
    """The weight of a bitsandbytes Linear4bit as a float tensor, whatever layout bitsandbytes has put it in.

    bitsandbytes' own dequantize_4bit (and peft's dequantize_module_weight, which calls it) reads only the plain
    layout. A layer that bitsandbytes >= 0.49 has repacked for its AVX512-BF16 CPU kernel (see load_base; a model
    not loaded by the kit may have been) holds its nibbles tiled in blocks of 32 rows and its scales un-nested,
    transposed and rounded to bf16: read as plain, that is a scrambled matrix. Such a layer is unpacked here first,
    with bitsandbytes' own inverse, on copies (the layer keeps its layout), which gives the weight its kernel
    computes with (bf16 scales). A plain layer is dequantized exactly as bitsandbytes does it.
    """
    import bitsandbytes.functional as F

    data, state = layer.weight.data, layer.weight.quant_state
    if getattr(state, "packing_format_for_cpu", False):
        unpack = getattr(F, "_convert_weight_packed_for_cpu_inverse", None)
        if unpack is None:
            raise RuntimeError("this 4-bit layer is in bitsandbytes' CPU kernel layout, and this bitsandbytes has no "
                               "inverse for it: load the model with kit.engine.models.load_base, which keeps the plain "
                               "layout, or use generation_weights='4bit'")
        state = copy.copy(state)  # the inverse rewrites the state's fields: keep the layer's own
        state.original_nested = False  # keep the scales as they are (float), not quantized once more
        data, state = unpack(data, state)
        if state.absmax.dim() == 2:  # (in/blocksize, out) -> one scale per block, in the weight's own order
            state.absmax = state.absmax.T.reshape(-1).float()
    return F.dequantize_4bit(data, state)


def lora_config(r: int, alpha: int, dropout: float, target_modules):
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                      bias="none", task_type="CAUSAL_LM")


def attach_adapters(model, adapter_names: list[str], config, seed: int = 0):
    """Wrap `model` in a PeftModel holding one freshly initialised LoRA adapter per name."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # peft (0.21) asks every transformers model for `is_gradient_checkpointing`, which transformers 5 deprecated
        # with a FutureWarning that names neither peft nor anything the user wrote: nothing for a user to change.
        # That one message, here where the kit makes peft ask.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, config, adapter_name=adapter_names[0])
        for name in adapter_names[1:]:
            peft_model.add_adapter(name, config)
    for p in peft_model.parameters():  # the base never trains; each agent's optimizer holds its own adapter
        p.requires_grad_(False)
    for name in adapter_names:
        for p in adapter_parameters(peft_model, name):
            p.requires_grad_(True)
    return peft_model


def adapter_parameters(peft_model, adapter: str) -> list[torch.nn.Parameter]:
    """The parameters of one adapter, in a stable order (the optimizer's)."""
    suffix = f".{adapter}.weight"
    return [p for n, p in peft_model.named_parameters() if "lora_" in n and n.endswith(suffix)]


@dataclass
class Team:
    """N agents over one or more PEFT-wrapped bases.

    `models[b]` / `tokenizers[b]` are the distinct bases; agent i uses base `base_of[i]` and adapter
    `adapter_of[i]`. With a shared adapter every agent's adapter is "shared".
    """

    models: list
    tokenizers: list
    base_of: list[int]
    adapter_of: list[str]
    roles: list[str] = field(default_factory=list)
    rollout_engine: str = "auto"  # auto, hf, compiled (kit/engine/rollout.py)
    generation_weights: str = "auto"  # auto, copy, 4bit: what the compiled engine decodes with (kit/engine/compiled.py)
    share_prompts: bool = True  # prefill each distinct prompt once (kit/engine/rollout.py); scalar models too (kit/engine/prefixes.py)
    engines: dict = field(default_factory=dict, repr=False)  # base -> its rollout engine, built on first use
    sources: dict = field(default_factory=dict)  # short model name -> where its weights came from (kit/engine/weights.py)
    precision: list = field(default_factory=list)  # per base: {model, device, dtype, why} (environment.json records it)

    @property
    def num_agents(self) -> int:
        return len(self.base_of)

    @property
    def adapters(self) -> list[str]:
        """Distinct adapters in order (one per optimizer)."""
        return list(dict.fromkeys(self.adapter_of))

    def model_of(self, agent: int):
        return self.models[self.base_of[agent]]

    def tokenizer_of(self, agent: int):
        return self.tokenizers[self.base_of[agent]]

    def agents_of_adapter(self, adapter: str) -> list[int]:
        return [i for i, a in enumerate(self.adapter_of) if a == adapter]

    def parameters_of(self, adapter: str) -> list[torch.nn.Parameter]:
        base = self.base_of[self.agents_of_adapter(adapter)[0]]
        return adapter_parameters(self.models[base], adapter)


def build_team(cfg, log=print) -> Team:
    """Load the base model(s) named in the config and attach the agents' adapters."""
    from kit.engine import weights
    from kit.engine.centralized import team_config

    cfg = team_config(cfg)  # algorithm=centralized: one agent writes every part
    names = list(cfg.agent_models) if cfg.agent_models else [cfg.model_name] * cfg.num_agents
    adapter_of = ["shared"] * cfg.num_agents if cfg.share_adapter else [f"agent_{i}" for i in range(cfg.num_agents)]
    unique = list(dict.fromkeys(names))
    base_of = [unique.index(n) for n in names]
    lcfg = lora_config(cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
    models, toks, sources, precision = [], [], {}, []
    devices = list(getattr(cfg, "agent_devices", None) or [cfg.device] * cfg.num_agents)
    for b, name in enumerate(unique):
        path, revision = name, None
        if weights.is_short_name(name):  # the hub or the package, as the run's config pins it (a resume: the same)
            path, sources[name] = weights.resolve(name, cfg.model_sources.get(name), log=log)
            revision = weights.hub_revision(sources[name])
        model, tok = load_base(path, quantization=cfg.quantization, dtype=cfg.dtype, device=devices[names.index(name)],
                               gradient_checkpointing=cfg.gradient_checkpointing, seed=cfg.seed, log=log,
                               revision=revision)
        dev = next(model.parameters()).device
        dtype, why = choose_dtype(cfg.dtype, dev, getattr(model.config, "hidden_size", None))
        precision.append({"model": name, "device": str(dev), "dtype": str(dtype).replace("torch.", ""), "why": why,
                          "adapters": "float32", "output_layer": str(model.get_output_embeddings().weight.dtype
                                                                     ).replace("torch.", "")})
        mine = list(dict.fromkeys(a for a, bb in zip(adapter_of, base_of) if bb == b))
        models.append(attach_adapters(model, mine, lcfg, seed=cfg.seed))
        toks.append(tok)
    return Team(models, toks, base_of, adapter_of, rollout_engine=cfg.rollout_engine,
                generation_weights=cfg.generation_weights, share_prompts=cfg.share_prompts, sources=sources,
                precision=precision)


def trainable_count(team: Team) -> tuple[int, int]:
    """(trainable adapter parameters, all parameters) over the team's bases."""
    train = sum(p.numel() for a in team.adapters for p in team.parameters_of(a))
    total = sum(p.numel() for m in team.models for p in m.parameters())
    return train, total
