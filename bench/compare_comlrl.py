"""Side-by-side throughput and memory: CoMLRL 1.4.3 MAGRPOTrainer vs the kit, same model, prompts and reward.

    pip install --no-deps comlrl==1.4.3 && pip install datasets wandb openai    # CoMLRL's own dependencies
    python bench/compare_comlrl.py                   # 2 and 4 agents, CPU, 2 threads; prints the table

Every configuration runs in its own subprocess (so peak RSS is its own) on the same offline random-weight Qwen2
model (hidden 768, 12 layers, ~80M parameters, the kit's character tokenizer), the toy task's prompts and
reward, G=4, 32 new tokens, temperature 0.7, top_p 0.9, no chat template (CoMLRL applies none):

    comlrl_full   CoMLRL with its defaults: a full model copy per agent, full fine-tuning, one prompt at a time
    comlrl_peft   CoMLRL given PEFT-wrapped agents (LoRA r=16 on all linear layers, one base copy per agent)
    kit           the kit: one shared base, one LoRA adapter per agent, 4 items per step in one generate call,
                  update in micro-batches of 4 rows (KIT_MICRO_BATCH; 0 = all rows at once)
    floor         one plain batched generate of the kit's rows + one forward/backward of the same shapes

Joint actions per second are measured after one warm-up step. EOS is disabled so that every completion is
exactly 32 tokens on every side (random weights would otherwise stop at random lengths).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL_DIR = ROOT / "bench" / "out" / "qwen2_80m"
G, NEW_TOKENS, ITEMS_PER_STEP = 4, 32, 4
# Rows per forward/backward in the kit's update: bounds activation memory (0 = all of an agent's rows at once).
MICRO_BATCH = int(os.environ.get("KIT_MICRO_BATCH", "4"))


def build_model() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from kit.models import build_tiny_tokenizer

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


def run_comlrl(num_agents: int, peft: bool, num_items: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
    from kit.tasks.toy import DigitSum

    task = DigitSum(num_agents)
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    tok.padding_side = "left"
    agents = []
    for _ in range(num_agents):
        m = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
        no_eos(m)
        if peft:
            from kit.models import lora_config
            from peft import get_peft_model

            m = get_peft_model(m, lora_config(16, 32, 0.0, "all-linear"))
        agents.append(m)
    items = (task.load("train") * 10)[: num_items + 1]
    formatters = [lambda item, i=i: task.prompts(item)[i] for i in range(num_agents)]

    def reward(*completions, batch_items=None):
        item = batch_items[0]
        return [task.reward(item, tuple(c[0] for c in completions)).total]

    args = MAGRPOConfig(num_train_epochs=1, num_agents=num_agents, num_generations=G, max_new_tokens=NEW_TOKENS,
                        temperature=0.7, top_p=0.9, top_k=None, num_turns=1, eval_interval=0,
                        logging_steps=10**6)
    trainer = MAGRPOTrainer(agents=agents, num_agents=num_agents, tokenizer=tok, reward_func=reward,
                            formatters=formatters, train_dataset=Dataset.from_list(items), args=args)
    return {"joint_actions": num_items * G, "seconds": train_after_first_step(trainer)}


def train_after_first_step(trainer, sync=lambda: None) -> float:
    """Run CoMLRL's training loop; seconds from the end of its first step (the warm-up) to the end."""
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
    return time.perf_counter() - stamps[0]


def run_kit(num_agents: int, num_items: int) -> dict:
    from kit.config import load_config
    from kit.tasks.toy import DigitSum
    from kit.trainer import Trainer

    steps = num_items // ITEMS_PER_STEP
    cfg = load_config(overrides=[f"model_name={MODEL_DIR}", f"num_agents={num_agents}", f"num_generations={G}",
                                 f"max_new_tokens={NEW_TOKENS}", "temperature=0.7", "top_p=0.9",
                                 "use_chat_template=false", "quantization=none", f"batch_size={ITEMS_PER_STEP}",
                                 f"num_steps={steps + 1}", "eval_every=0", "save_every=0", "progress=false",
                                 "log_rollouts=false", f"run_dir={ROOT / 'bench' / 'out' / f'kit_{num_agents}'}",
                                 "lora_r=16", "lora_alpha=32", f"micro_batch_size={MICRO_BATCH}"])
    import shutil

    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    cfg.save_every = 10**9  # the final save is part of a run, but not of the steady-state step timing
    trainer = Trainer(cfg, task=DigitSum(num_agents), log=lambda *_: None)
    for m in trainer.team.models:
        no_eos(m)
    trainer.train(max_steps=1)  # warm-up
    t0 = time.perf_counter()
    trainer.train(max_steps=steps)
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(Path(cfg.run_dir) / "metrics.jsonl")][1:]
    return {"joint_actions": steps * ITEMS_PER_STEP * G, "seconds": seconds,
            "step_s": sum(r["perf/step_s"] for r in rows) / len(rows)}


def run_floor(num_agents: int, num_items: int) -> dict:
    """One batched generate of B*N*G rows and one forward/backward of those rows, through one adapter."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kit.models import adapter_parameters, attach_adapters, lora_config
    from kit.rollout import position_ids
    from kit.tasks.toy import DigitSum

    task = DigitSum(num_agents)
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    tok.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    no_eos(base)
    model = attach_adapters(base, ["agent_0"], lora_config(16, 32, 0.0, "all-linear"))
    opt = torch.optim.AdamW(adapter_parameters(model, "agent_0"), lr=1e-4)
    items = task.load("train")[:ITEMS_PER_STEP]
    prompts = [p for item in items for p in task.prompts(item) for _ in range(G)]
    times = []
    for _ in range(1 + num_items // ITEMS_PER_STEP):
        t0 = time.perf_counter()
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        model.eval()
        with torch.no_grad():
            seq = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.9,
                                 pad_token_id=tok.pad_token_id)
        model.train()
        att = torch.ones_like(seq)
        att[:, : enc["attention_mask"].shape[1]] = enc["attention_mask"]
        logits = model(input_ids=seq, attention_mask=att, position_ids=position_ids(att),
                       logits_to_keep=NEW_TOKENS + 1).logits
        loss = torch.log_softmax(logits.float(), -1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    steps = len(times) - 1
    return {"joint_actions": steps * ITEMS_PER_STEP * G, "seconds": sum(times[1:]),
            "step_s": sum(times[1:]) / steps}


def one(which: str, num_agents: int, num_items: int) -> dict:
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(0)
    if which == "comlrl_full":
        out = run_comlrl(num_agents, False, num_items)
    elif which == "comlrl_peft":
        out = run_comlrl(num_agents, True, num_items)
    elif which == "kit":
        out = run_kit(num_agents, num_items)
    else:
        out = run_floor(num_agents, num_items)
    out.update(which=which, agents=num_agents, ja_per_s=out["joint_actions"] / out["seconds"],
               peak_rss_mb=peak_rss_mb())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--items", type=int, default=8, help="items timed per configuration (after warm-up)")
    parser.add_argument("--only", nargs="+", default=["comlrl_full", "comlrl_peft", "kit", "floor"])
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.agents[0], args.items)))
        return
    build_model()
    results = []
    for n in args.agents:
        for which in args.only:
            env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
            proc = subprocess.run([sys.executable, __file__, "--one", which, "--agents", str(n), "--items",
                                   str(args.items)], capture_output=True, text=True, env=env)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"{which} with {n} agents failed")
            results.append(json.loads(line[0][7:]))
            r = results[-1]
            print(f"{n} agents  {which:12s} {r['ja_per_s']:7.2f} joint actions/s  peak RSS {r['peak_rss_mb']:7.0f} MB",
                  flush=True)
    (ROOT / "bench" / "out").mkdir(exist_ok=True)
    (ROOT / "bench" / "out" / "compare_comlrl.json").write_text(json.dumps(results, indent=2))
    print(table(results))


def table(results: list[dict]) -> str:
    lines = ["| agents | configuration | joint actions/s | peak RSS (MB) | vs comlrl_full | vs comlrl_peft | RSS vs full | RSS vs peft |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sorted({r["agents"] for r in results}):
        by = {r["which"]: r for r in results if r["agents"] == n}
        for which, r in by.items():
            def ratio(key, other, r=r):
                return f"{r[key] / by[other][key]:.2f}x" if other in by else "-"
            lines.append(f"| {n} | {which} | {r['ja_per_s']:.2f} | {r['peak_rss_mb']:.0f} | {ratio('ja_per_s', 'comlrl_full')} "
                         f"| {ratio('ja_per_s', 'comlrl_peft')} | {ratio('peak_rss_mb', 'comlrl_full')} "
                         f"| {ratio('peak_rss_mb', 'comlrl_peft')} |")
        if "kit" in by and "floor" in by:
            lines.append(f"| {n} | kit step / floor step | {by['kit']['step_s']:.2f} s / {by['floor']['step_s']:.2f} s "
                         f"= {by['kit']['step_s'] / by['floor']['step_s']:.2f}x | | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
