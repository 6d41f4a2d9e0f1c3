"""What a CPU offers for generation, measured on the smol presets' rows: bf16, a static KV cache, torch.compile.

    python bench/cpu_paths.py --preset smol_writing --items 2          # appends rows to results/cpu_paths.md

Plain HF `generate` of the preset's base (SmolLM2-135M-Instruct, no adapter) on the rows a step samples (every
agent's prompt of `--items` train items, G copies each, left-padded), greedy, exactly max_new_tokens (EOS off), so
that every path decodes the same number of tokens:

    fp32 dynamic           the kit's path on a CPU (the hf engine: DynamicCache)
    fp32 static            cache_implementation="static" (a preallocated cache: no growth per token)
    fp32 static + compile  the same with the model's forward under torch.compile (the first call compiles; timed
                           after a warm-up call, the compile time reported apart)
    bf16 dynamic           the base in bfloat16 (the CPU's AMX/AVX-512 bf16 units where it has them)

Each time is the best of `--repeats` after a warm-up call. `same greedy tokens` compares each path's tokens with
fp32 dynamic (a path that changes the greedy tokens changes the numbers, not only the speed); `max logp diff` is
the largest difference of the chosen tokens' log-probs (one forward of fp32 dynamic's sequences under the path's
dtype against fp32), what the sampler's recorded log-probs would carry into the importance weights.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smol_writing")
    ap.add_argument("--items", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--paths", nargs="+", default=["fp32_dynamic", "fp32_static", "fp32_static_compile",
                                                   "bf16_dynamic"])
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from kit.engine import weights
    from kit.run.config import load_config
    from kit.engine.rollout import encode_prompt, left_pad
    from kit.engine.forward import position_ids
    from kit.tasks import task_for

    cfg = load_config(args.preset)
    folder = weights.resolve(cfg.model_name, None, log=lambda *a: None)[0]
    tok = AutoTokenizer.from_pretrained(folder)
    task = task_for(cfg)
    items = task.load("train")[: args.items]
    rows = [encode_prompt(tok, p, cfg.use_chat_template, cfg.max_prompt_tokens)
            for item in items for p in task.prompts(item) for _ in range(cfg.num_generations)]
    enc = left_pad(rows, tok.pad_token_id, "cpu")
    T = cfg.max_new_tokens
    models = {}

    def model_of(dtype, compiled: bool = False):
        """One model per (dtype, compiled): a compiled forward never leaks into another path's timing."""
        if (dtype, compiled) not in models:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
            model.generation_config.eos_token_id = None
            if compiled:
                model.forward = torch.compile(model.forward)
            models[dtype, compiled] = model
        return models[dtype, compiled]

    def dtype_of(path: str):
        return torch.bfloat16 if path.startswith("bf16") else torch.float32

    def run(path: str):
        model = model_of(dtype_of(path), path.endswith("compile"))
        config = GenerationConfig(max_new_tokens=T, min_new_tokens=T, do_sample=False, eos_token_id=None,
                                  pad_token_id=tok.pad_token_id,
                                  cache_implementation="static" if "static" in path else None)
        with torch.no_grad():
            return model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1]:]

    def logps(path: str, completion) -> torch.Tensor:
        model = model_of(dtype_of(path))  # uncompiled
        ids = torch.cat([enc["input_ids"], completion], 1)
        att = torch.cat([enc["attention_mask"], torch.ones_like(completion)], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids(att),
                           logits_to_keep=T + 1).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, completion[..., None])[..., 0]

    header = ("| preset | rows | path | first call s | generate s (best) | tokens/s | vs fp32 dynamic | "
              "same greedy tokens | max logp diff |\n|" + "---|" * 9)
    print(header)
    lines, base, reference = [], None, None
    for path in args.paths:
        t0 = time.perf_counter()
        out = run(path)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = run(path)
            times.append(time.perf_counter() - t0)
        t = min(times)
        if reference is None:
            base, reference = t, out
        same = torch.equal(out, reference)
        diff = float((logps(path, reference) - logps("fp32", reference)).abs().max()) if path.startswith("bf16") \
            else 0.0
        line = (f"| {args.preset} | {len(rows)} rows, P={enc['input_ids'].shape[1]}, T={T} | {path} | {first:.2f} | "
                f"{t:.2f} | {out.numel() / t:.1f} | {base / t:.2f}x | {same} | {diff:.1e} |")
        print(line, flush=True)
        lines.append(line)
    out_file = ROOT / "bench" / "results" / "cpu_paths.md"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    new = not out_file.exists()
    with open(out_file, "a") as f:
        f.write((header + "\n" if new else "") + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
