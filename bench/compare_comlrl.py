"""Side-by-side throughput and memory: CoMLRL 1.4.3 MAGRPOTrainer vs the kit, same model, prompts and reward.

    pip install --no-deps comlrl==1.4.3 && pip install datasets wandb openai    # CoMLRL's own dependencies
    python bench/compare_comlrl.py                   # 2 and 4 agents, CPU, 2 threads (--threads); the table
    python bench/compare_comlrl.py --model smollm2 --agents 2 --items 4       # SmolLM2-135M-Instruct on TLDR

Every configuration runs in its own subprocess (so peak RSS is its own) on the same model folder, items, prompts
and reward, G=4, temperature 0.7, top_p 0.9. `--model`:

    qwen2     (default) an offline random-weight Qwen2 (hidden 768, 12 layers, ~80M parameters, the kit's
              character tokenizer), the toy task, 32 new tokens, no chat template, 4 items per kit step
    smollm2   the plain HF folder of SmolLM2-135M-Instruct (`kit.engine.weights.resolve("smollm2-135m")`), TLDR writing
              (agent 0 a concise summary, agent 1 a detailed one; the task's reward), 48 new tokens, 1 item per kit
              step (the smol_writing preset). The chat template on every side: CoMLRL applies none, so its
              formatters return the templated text (`kit.engine.rollout.format_prompt`), and every side forwards the same
              token ids. CoMLRL ends a prompt at its first pad token, and SmolLM2 pads with <|im_end|>, which the
              template writes after the system turn: CoMLRL would take the rest of the prompt for the completion
              (empty texts, reward 0, a loss over ~170 tokens instead of 48). Its tokenizer pads with
              <|endoftext|> instead, which no prompt holds.

    comlrl_full   CoMLRL with its defaults: a full model copy per agent, full fine-tuning, one prompt at a time
    comlrl_peft   CoMLRL given PEFT-wrapped agents (LoRA r=16 on all linear layers, one base copy per agent)
    kit           the kit: one shared base, one LoRA adapter per agent, all items of a step in one generate call,
                  each prompt forwarded once for its G samples (share_prompts, its default), update in
                  micro-batches of 4 rows (KIT_MICRO_BATCH; 0 = all rows at once)
    kit_noshare   the same with share_prompts=false (every row forwards its own copy of the prompt)
    floor         one plain batched generate of the kit's rows + one forward/backward of the same shapes

Joint actions per second are over the same timed items everywhere, after a warm-up: one step for the kit and the
floor; one rollout buffer (2 prompts) for CoMLRL, whose update of a prompt runs with the next prompt's step, so that
the timed part holds the generation and the update of exactly the timed items. EOS is disabled (the model's and,
for the kit, the tokenizer's, at which it also stops) so that every completion has exactly the new-token count on
every side; each result records its rows and prompt and completion tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL_DIR = ROOT / "bench" / "out" / "qwen2_80m"
G = 4
# Rows per forward/backward in the kit's update: bounds activation memory (0 = all of an agent's rows at once).
MICRO_BATCH = int(os.environ.get("KIT_MICRO_BATCH", "4"))
CONFIGURATIONS = ["comlrl_full", "comlrl_peft", "kit", "kit_noshare", "floor"]


@dataclass
class Setup:
    """What every configuration of one run shares."""

    model: str  # qwen2 or smollm2
    model_dir: str
    num_agents: int
    num_items: int  # timed items
    items_per_step: int  # items per kit (and floor) step

    @property
    def smol(self) -> bool:
        return self.model == "smollm2"

    @property
    def new_tokens(self) -> int:
        return 48 if self.smol else 32

    @property
    def steps(self) -> int:
        return self.num_items // self.items_per_step

    def task(self):
        if self.smol:
            from kit.tasks.writing import make_task

            return make_task(self.num_agents, kind="tldr")
        from kit.tasks.toy import DigitSum

        return DigitSum(self.num_agents)

    def items(self, task) -> list[dict]:
        """The kit's warm-up step, then the timed steps: the first train items, repeated when there are too few."""
        train, n = task.load("train"), self.items_per_step * (self.steps + 1)
        return (train * (n // len(train) + 1))[:n]

    def prompt(self, tok, prompt: str) -> str:
        from kit.engine.rollout import format_prompt

        return format_prompt(tok, prompt, self.smol)


def build_model() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from kit.engine.models import build_tiny_tokenizer

    if (MODEL_DIR / "config.json").exists():
        return
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(MODEL_DIR)
    tok.save_pretrained(MODEL_DIR)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def no_eos(model) -> None:
    model.generation_config.eos_token_id = None


def run_comlrl(s: Setup, peft: bool) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

    task = s.task()
    tok = AutoTokenizer.from_pretrained(s.model_dir)
    tok.padding_side = "left"
    if s.smol:  # CoMLRL's prompt ends at its first pad token; SmolLM2's (<|im_end|>) is inside the template
        tok.pad_token = tok.unk_token
    agents = []
    for _ in range(s.num_agents):
        m = AutoModelForCausalLM.from_pretrained(s.model_dir, dtype=torch.float32)
        no_eos(m)
        if peft:
            from kit.engine.models import lora_config
            from peft import get_peft_model

            m = get_peft_model(m, lora_config(16, 32, 0.0, "all-linear"))
        agents.append(m)
    args = MAGRPOConfig(num_train_epochs=1, num_agents=s.num_agents, num_generations=G,
                        max_new_tokens=s.new_tokens, temperature=0.7, top_p=0.9, top_k=None, num_turns=1,
                        eval_interval=0, logging_steps=10**6)
    warmup = args.rollout_buffer_size
    items = s.items(task)
    items = items[:warmup] + items[s.items_per_step:]  # CoMLRL's warm-up, then the kit's timed items
    formatters = [lambda item, i=i: s.prompt(tok, task.prompts(item)[i]) for i in range(s.num_agents)]
    rewards = []

    def reward(*completions, batch_items=None):
        rewards.append(task.reward(batch_items[0], tuple(c[0] for c in completions)).total)
        return rewards[-1:]

    trainer = MAGRPOTrainer(agents=agents, num_agents=s.num_agents, tokenizer=tok, reward_func=reward,
                            formatters=formatters, train_dataset=Dataset.from_list(items), args=args)
    calls = []  # (rows, prompt tokens, completion tokens) per generate call: one per agent per prompt
    generate = trainer._generate_completions

    def counted(*a, **kw):
        out = generate(*a, **kw)
        rows = out["completion_input_ids"][0]
        calls.append((len(rows), out["prompt_input_ids"].shape[1] * len(rows), sum(len(t) for t in rows)))
        return out

    trainer._generate_completions = counted
    seconds = train_after_first_step(trainer, warmup=warmup)
    timed = calls[warmup * s.num_agents:]
    return {"joint_actions": (len(items) - warmup) * G, "seconds": seconds, "rows": sum(c[0] for c in timed),
            "prompt_tokens": sum(c[1] for c in timed), "completion_tokens": sum(c[2] for c in timed),
            "reward": sum(rewards[warmup * G:]) / len(rewards[warmup * G:])}


def train_after_first_step(trainer, sync=lambda: None, warmup: int = 1) -> float:
    """Run CoMLRL's training loop; seconds from the end of its first `warmup` steps to the end."""
    trainer.verbose = False
    stamps = []
    original = trainer._train_step_returns

    def timed(*a, **kw):
        original(*a, **kw)
        stamps.append(time.perf_counter())

    trainer._train_step_returns = timed
    trainer.train()
    sync()  # a GPU finishes its queued work before the end stamp
    # buffered updates land inside later calls; the last buffer drains after the loop, counted by the end stamp
    return time.perf_counter() - stamps[warmup - 1]


def run_kit(s: Setup, share: bool) -> dict:
    from kit.run.config import load_config
    from kit.engine.rollout import encode_prompt
    from kit.trainers.trainer import Trainer

    B = s.items_per_step
    run_dir = ROOT / "bench" / "out" / f"kit_{s.model}_{s.num_agents}"
    # num_steps one past the last step run: the final checkpoint save is not part of a step (CoMLRL saves nothing)
    cfg = load_config("smol_writing" if s.smol else None, overrides=[
        f"model_name={s.model_dir}", f"num_agents={s.num_agents}", f"num_generations={G}",
        f"max_new_tokens={s.new_tokens}", "temperature=0.7", "top_p=0.9", f"use_chat_template={str(s.smol).lower()}",
        "quantization=none", f"batch_size={B}", f"num_steps={s.steps + 2}", "eval_every=0", "save_every=0",
        "progress=false", "log_rollouts=false", f"run_dir={run_dir}", "lora_r=16", "lora_alpha=32",
        f"micro_batch_size={MICRO_BATCH}", f"share_prompts={str(share).lower()}"])
    import shutil

    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    task = s.task()
    items = s.items(task)
    trainer = Trainer(cfg, task=task, log=lambda *_: None)
    trainer.batch_items = lambda step: items[step * B:(step + 1) * B]  # every configuration's items, in order
    for m in trainer.team.models:
        no_eos(m)
    for tok in trainer.team.tokenizers:
        tok.eos_token = None  # the kit also stops at the tokenizer's EOS
    trainer.train(max_steps=1)  # warm-up
    t0 = time.perf_counter()
    trainer.train(max_steps=s.steps)
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(Path(cfg.run_dir) / "metrics.jsonl")][1:]
    tok = trainer.team.tokenizers[0]
    prompt_tokens = sum(len(encode_prompt(tok, p, cfg.use_chat_template)) for item in items[B:]
                        for p in task.prompts(item)) * G
    return {"joint_actions": s.steps * B * G, "seconds": seconds,
            "step_s": sum(r["perf/step_s"] for r in rows) / len(rows), "rows": s.steps * B * s.num_agents * G,
            "prompt_tokens": prompt_tokens, "completion_tokens": sum(r["completion/tokens"] for r in rows),
            "reward": sum(r["reward/mean"] for r in rows) / len(rows)}


def run_floor(s: Setup) -> dict:
    """One batched generate of B*N*G rows and one forward/backward of those rows, through one adapter."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kit.engine.models import adapter_parameters, attach_adapters, lora_config
    from kit.engine.forward import position_ids

    task = s.task()
    tok = AutoTokenizer.from_pretrained(s.model_dir)
    tok.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(s.model_dir, dtype=torch.float32)
    no_eos(base)
    model = attach_adapters(base, ["agent_0"], lora_config(16, 32, 0.0, "all-linear"))
    opt = torch.optim.AdamW(adapter_parameters(model, "agent_0"), lr=1e-4)
    items, B = s.items(task), s.items_per_step
    times, counts = [], []
    for step in range(1 + s.steps):
        prompts = [s.prompt(tok, p) for item in items[step * B:(step + 1) * B] for p in task.prompts(item)
                   for _ in range(G)]
        t0 = time.perf_counter()
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        model.eval()
        with torch.no_grad():
            seq = model.generate(**enc, max_new_tokens=s.new_tokens, do_sample=True, temperature=0.7, top_p=0.9,
                                 pad_token_id=tok.pad_token_id)
        model.train()
        att = torch.ones_like(seq)
        att[:, : enc["attention_mask"].shape[1]] = enc["attention_mask"]
        logits = model(input_ids=seq, attention_mask=att, position_ids=position_ids(att),
                       logits_to_keep=s.new_tokens + 1).logits
        loss = torch.log_softmax(logits.float(), -1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        new = seq.shape[1] - enc["input_ids"].shape[1]
        counts.append((len(prompts), int(enc["attention_mask"].sum()), new * len(prompts)))
    return {"joint_actions": s.steps * B * G, "seconds": sum(times[1:]), "step_s": sum(times[1:]) / s.steps,
            "rows": sum(c[0] for c in counts[1:]), "prompt_tokens": sum(c[1] for c in counts[1:]),
            "completion_tokens": sum(c[2] for c in counts[1:])}


def one(which: str, s: Setup, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if which == "comlrl_full":
        out = run_comlrl(s, False)
    elif which == "comlrl_peft":
        out = run_comlrl(s, True)
    elif which in ("kit", "kit_noshare"):
        out = run_kit(s, which == "kit")
    else:
        out = run_floor(s)
    out.update(which=which, agents=s.num_agents, model=s.model, items_per_step=s.items_per_step, threads=threads,
               ja_per_s=out["joint_actions"] / out["seconds"], peak_rss_mb=peak_rss_mb())
    return out


def model_dir(model: str) -> str:
    if model == "smollm2":
        from kit.engine import weights

        return weights.resolve("smollm2-135m", None, log=print)[0]
    build_model()
    return str(MODEL_DIR)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=["qwen2", "smollm2"], default="qwen2",
                        help="qwen2: random ~80M Qwen2 on the toy task; smollm2: SmolLM2-135M-Instruct on TLDR")
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--items", type=int, default=8, help="items timed per configuration (after warm-up)")
    parser.add_argument("--items-per-step", type=int, help="items per kit step (default: 4 qwen2, 1 smollm2)")
    parser.add_argument("--only", nargs="+", default=CONFIGURATIONS, choices=CONFIGURATIONS)
    parser.add_argument("--threads", type=int, default=2, help="torch/OpenMP threads of every configuration")
    args = parser.parse_args()
    ips = args.items_per_step or (1 if args.model == "smollm2" else 4)
    if args.one:
        s = Setup(args.model, args.model_dir, args.agents[0], args.items, ips)
        print("RESULT " + json.dumps(one(args.one, s, args.threads)))
        return
    path = model_dir(args.model)
    out = ROOT / "bench" / "out" / f"compare_comlrl_{args.model}.json"
    out.parent.mkdir(exist_ok=True)
    results = []
    for n in args.agents:
        for which in args.only:
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                   "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
            proc = subprocess.run([sys.executable, __file__, "--one", which, "--model", args.model, "--model-dir", path,
                                   "--agents", str(n), "--items", str(args.items), "--items-per-step", str(ips),
                                   "--threads", str(args.threads)],
                                  capture_output=True, text=True, env=env)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"{which} with {n} agents failed")
            r = json.loads(line[0].removeprefix("RESULT "))
            results.append(r)
            print(f"{n} agents  {which:12s} {r['ja_per_s']:7.3f} joint actions/s  "
                  f"peak RSS {r['peak_rss_mb']:7.0f} MB  {r['rows']} rows, "
                  f"{r['prompt_tokens']} prompt + {r['completion_tokens']} completion tokens", flush=True)
            out.write_text(json.dumps(results, indent=2))  # after each configuration: a failure keeps the others
    print(table(results))


def table(results: list[dict]) -> str:
    lines = ["| agents | configuration | joint actions/s | peak RSS (MB) | vs comlrl_full | vs comlrl_peft "
             "| RSS vs full | RSS vs peft |", "|---|---|---|---|---|---|---|---|"]
    for n in sorted({r["agents"] for r in results}):
        by = {r["which"]: r for r in results if r["agents"] == n}
        for which, r in by.items():
            def ratio(key, other, r=r):
                return f"{r[key] / by[other][key]:.2f}x" if other in by else "-"
            lines.append(f"| {n} | {which} | {r['ja_per_s']:.3f} | {r['peak_rss_mb']:.0f} "
                         f"| {ratio('ja_per_s', 'comlrl_full')} | {ratio('ja_per_s', 'comlrl_peft')} "
                         f"| {ratio('peak_rss_mb', 'comlrl_full')} "
                         f"| {ratio('peak_rss_mb', 'comlrl_peft')} |")
        if "kit" in by and "floor" in by:
            lines.append(f"| {n} | kit step / floor step | {by['kit']['step_s']:.2f} s / {by['floor']['step_s']:.2f} s "
                         f"= {by['kit']['step_s'] / by['floor']['step_s']:.2f}x | | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
