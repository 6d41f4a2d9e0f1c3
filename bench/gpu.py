"""Rollout and step speed on one GPU: the kit per engine vs a plain HF floor vs CoMLRL 1.4.3, offline.

    python bench/gpu.py --shape 1.5b --preset colab_t4 --set batch_size=2        # 16 rows: engines, floors, CoMLRL
    python bench/gpu.py --shape 3b --preset colab_a100 --configs kit_compiled   # the A100 preset as shipped
    python bench/gpu.py --tiny                                                 # CPU smoke (tests/test_bench.py)

No hub: the models are random weights in the real Qwen2.5-Coder shapes (1.5B: hidden 1536, 28 layers; 3B:
hidden 2048, 36 layers; vocab 151,936), saved once under bench/out/, and the tokenizer is a byte-level BPE of
Qwen's vocabulary size trained on Python's standard library at run time, with a ChatML template. Random weights
(almost) never emit EOS, so every completion is full length; `tokens` in the output says how many came.
Prompts are the code task's (HumanEval helper/main), 2 agents, G=4.

Each configuration runs in its own process (its peak GPU memory is its own):
    kit_compiled, kit_hf   the kit's Trainer with rollout_engine=compiled / hf, the preset's 4-bit base
    floor_eager            plain HF generate of the same rows, bf16, no adapters, dynamic cache
    floor_static           the same with cache_implementation="static" (transformers compiles the decode step)
    comlrl_full            CoMLRL 1.4.3 MAGRPOTrainer with its defaults: a full bf16 copy per agent, full fine-tuning
    comlrl_peft            CoMLRL given PEFT LoRA agents (r=16, all linear, one base copy per agent)
Per configuration: s/step and joint actions/s over the timed steps (after one warm-up step, which compiles),
ms per decode step (generate time / new tokens), peak GPU memory (allocated and reserved), compile seconds.
Results are appended to bench/out/gpu.jsonl and printed as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
OUT = ROOT / "bench" / "out"
QWEN_VOCAB = 151_936  # embedding rows of Qwen2.5(-Coder); its tokenizer has 151,665 tokens
SHAPES = {  # Qwen2.5-Coder-*-Instruct config.json, random weights
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(path: Path, vocab_size: int) -> None:
    """A byte-level BPE trained on the standard library's Python files, padded to `vocab_size` tokens."""
    if (path / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    files = files if vocab_size > 10_000 else files[:200]  # the CPU smoke needs only a small vocabulary
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator((Path(f).read_text(errors="ignore") for f in files), trainer)  # a few aren't UTF-8
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=SPECIALS[1:])
    short = vocab_size - len(tok)
    if short > 0:  # the standard library may not hold enough distinct pieces for the last merges
        tok.add_tokens([f"<|extra_{i}|>" for i in range(short)], special_tokens=True)
    tok.chat_template = CHATML
    tok.save_pretrained(path)


def build_model(shape: str) -> Path:
    """Random weights in the shape, saved once (bf16 on CUDA) with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = OUT / f"qwen2_{shape}"
    if (path / "config.json").exists():
        return path
    tiny = shape == "tiny"
    build_tokenizer(OUT / "tokenizer_tiny" if tiny else OUT / "tokenizer", 2048 if tiny else 151_643)
    tok = AutoTokenizer.from_pretrained(OUT / "tokenizer_tiny" if tiny else OUT / "tokenizer")
    vocab = len(tok) if tiny else QWEN_VOCAB
    cfg = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **SHAPES[shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16 if device == "cuda" else torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, tok.pad_token_id],
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def gpu_memory() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"peak_alloc_gib": None, "peak_reserved_gib": None}
    return {"peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


def kit_config(args, path: Path, engine: str):
    from kit.run.config import load_config

    run_dir = OUT / f"run_{engine}_{args.shape}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [f"model_name={path}", f"rollout_engine={engine}", f"num_steps={args.steps + 1}", "eval_every=0",
                 "save_every=0", "progress=false", "log_rollouts=false", f"run_dir={run_dir}",
                 f"max_new_tokens={args.new_tokens}", "num_agents=2", "num_generations=4", "task=code"]
    if args.tiny:
        overrides += ["quantization=none", "reward_workers=0"]
    return load_config(args.preset, overrides=overrides + list(args.set))


def run_kit(args, path: Path, engine: str) -> dict:
    from kit.trainers.trainer import Trainer

    cfg = kit_config(args, path, engine)
    cfg.save_every = 10**9  # the final save is not part of the steady-state step
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train(max_steps=1)  # warm-up: compiles the new shapes
    trainer.train(max_steps=args.steps)
    trainer.close()
    rows = [json.loads(line) for line in open(Path(cfg.run_dir) / "metrics.jsonl")]
    timed = rows[1:]
    # steady state: a step that met a new static-cache length compiled it (logged apart as perf/compile_s)
    step_s = sum(r["perf/step_s"] - r.get("perf/compile_s", 0.0) for r in timed) / len(timed)
    gen_s = sum(r["perf/generate_s"] for r in timed) / len(timed)
    return {"step_s": step_s, "joint_actions_per_s": cfg.batch_size * cfg.num_generations / step_s,
            "decode_ms": 1000 * gen_s / cfg.max_new_tokens, "generate_s": gen_s,
            "update_s": sum(r["perf/update_s"] for r in timed) / len(timed),
            "compile_s": sum(r.get("perf/compile_s", 0.0) for r in rows), "tokens": timed[-1]["completion/tokens"],
            "rows": cfg.batch_size * cfg.num_agents * cfg.num_generations}


def prompts_of(args):
    """(the kit's prompts of one step, each G times; the config; the task)."""
    from kit.run.config import load_config
    from kit.tasks import task_for

    cfg = load_config(args.preset, overrides=["task=code"] + list(args.set))
    task = task_for(cfg)
    items = task.load("train")[: cfg.batch_size]
    return [p for item in items for p in task.prompts(item) for _ in range(4)], cfg, task


def run_floor(args, path: Path, static: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kit.engine.rollout import format_prompt

    prompts, cfg, _ = prompts_of(args)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    dtype = (torch.float16 if cfg.dtype == "float16" else torch.bfloat16) if torch.cuda.is_available() \
        else torch.float32  # the preset's compute dtype
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    enc = tok([format_prompt(tok, p) for p in prompts], return_tensors="pt", padding=True).to(device)
    kw = dict(max_new_tokens=args.new_tokens, do_sample=True, temperature=0.7, top_p=0.9, top_k=0,
              pad_token_id=tok.pad_token_id, repetition_penalty=1.0)
    if static:
        kw["cache_implementation"] = "static"
    times = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            seq = model.generate(**enc, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    gen_s = sum(times[1:]) / args.steps
    return {"step_s": None, "joint_actions_per_s": None, "decode_ms": 1000 * gen_s / args.new_tokens,
            "generate_s": gen_s, "compile_s": times[0] - gen_s if static else 0.0,
            "tokens": int(seq.shape[1] - enc["input_ids"].shape[1]) * len(prompts), "rows": len(prompts)}


def run_comlrl(args, path: Path, peft: bool) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if "wandb" not in sys.modules:
        try:
            import wandb  # noqa: F401
        except ImportError:  # CoMLRL imports wandb at the top and uses it only when configured
            sys.modules["wandb"] = types.SimpleNamespace(run=None, init=None, log=None, finish=None)
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

    from kit.engine.models import lora_config

    _, cfg, task = prompts_of(args)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    agents = []
    for _ in range(2):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if peft:
            from peft import get_peft_model

            m = get_peft_model(m, lora_config(16, 32, 0.0, "all-linear"))
        agents.append(m)
    items = task.load("train")[: args.steps + 1]
    formatters = [lambda item, i=i: task.prompts(item)[i] for i in range(2)]

    def reward(*completions, batch_items=None):
        return [task.reward(batch_items[0], tuple(c[0] for c in completions)).total]

    conf = MAGRPOConfig(num_train_epochs=1, num_agents=2, num_generations=4, max_new_tokens=args.new_tokens,
                        temperature=0.7, top_p=0.9, top_k=None, num_turns=1, eval_interval=0, logging_steps=10**6)
    trainer = MAGRPOTrainer(agents=agents, num_agents=2, tokenizer=tok, reward_func=reward, formatters=formatters,
                            train_dataset=Dataset.from_list(items), args=conf)
    from compare_comlrl import train_after_first_step

    seconds = train_after_first_step(trainer, torch.cuda.synchronize if torch.cuda.is_available() else lambda: None)
    step_s = seconds / args.steps
    return {"step_s": step_s, "joint_actions_per_s": 4 / step_s, "decode_ms": None, "compile_s": 0.0,
            "rows": 8, "items_per_step": 1}


def one(args) -> dict:
    import torch

    torch.manual_seed(0)
    path = build_model(args.shape)
    which = args.one
    if which.startswith("kit_"):
        out = run_kit(args, path, which[4:])
    elif which.startswith("floor_"):
        out = run_floor(args, path, which == "floor_static")
    else:
        out = run_comlrl(args, path, which == "comlrl_peft")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"config": which, "shape": args.shape, "preset": args.preset, "set": list(args.set),
            "new_tokens": args.new_tokens, "device": device, "date": time.strftime("%Y-%m-%d"), **out,
            **gpu_memory()}


def table(results: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    lines = ["| config | shape | preset | rows | s/step | joint actions/s | ms/decode step | peak alloc GiB | "
             "peak reserved GiB | compile s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['config']} | {r['shape']} | {r['preset']} {' '.join(r['set'])} | {r['rows']} | "
                     f"{f(r['step_s'], '.2f')} | {f(r['joint_actions_per_s'], '.2f')} | {f(r['decode_ms'], '.1f')} | "
                     f"{f(r['peak_alloc_gib'], '.1f')} | {f(r['peak_reserved_gib'], '.1f')} | "
                     f"{f(r['compile_s'], '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1.5b", choices=list(SHAPES))
    parser.add_argument("--preset", default="colab_t4")
    parser.add_argument("--set", nargs="*", default=[], help="key=value config overrides for every kit run")
    parser.add_argument("--configs", nargs="+", default=None, help="default: all six (--tiny: the four without "
                                                                       "CoMLRL)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke: tiny shape, tiny_cpu preset, 4 tokens")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.shape, args.preset, args.new_tokens, args.steps = "tiny", "tiny_cpu", 4, 1
        args.set = ["batch_size=2", "use_chat_template=true"] + list(args.set)
    if args.configs is None:
        args.configs = ["kit_compiled", "kit_hf", "floor_eager", "floor_static"] + (
            [] if args.tiny else ["comlrl_full", "comlrl_peft"])
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return []
    OUT.mkdir(parents=True, exist_ok=True)
    build_model(args.shape)  # once, before the configurations share it
    results = []
    for which in args.configs:
        cmd = [sys.executable, __file__, "--one", which, "--shape", args.shape, "--preset", args.preset,
               "--steps", str(args.steps), "--new-tokens", str(args.new_tokens), "--set", *args.set]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        except subprocess.TimeoutExpired:
            proc, found = None, []
        if not found:
            tail = (proc.stdout[-1500:] + proc.stderr[-3000:]) if proc else f"timed out after {args.timeout} s"
            print(f"[bench] {which} failed:\n{tail}", file=sys.stderr, flush=True)
            continue
        results.append(json.loads(found[0][7:]))
        with open(OUT / "gpu.jsonl", "a") as f:
            f.write(json.dumps(results[-1]) + "\n")
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))
    return results


if __name__ == "__main__":
    main()
