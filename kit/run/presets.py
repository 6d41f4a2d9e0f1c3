"""The presets: named sets of TrainConfig fields, as plain data (kit/run/config.py `preset(name)` makes the TrainConfig).

A preset names only the fields it changes from TrainConfig's defaults; the comment above each says what it is for
and why its less obvious values are what they are. This module imports no kit module.
"""

# The built-in tiny model on the toy task: learns on a laptop CPU in about 30 s.
# No chat template: the random 2-layer model reads the target best when it is the last thing in the prompt.
# beta = 0.02 (KL to the base, whose digits are uniform): without it each agent's policy collapses within ~75 steps
# onto a coarse split (two answers per agent), every group's samples agree, the advantages vanish and the team stops
# at 0.64-0.84. top_p = 0.9 (as the Colab presets; `auto` weighs it with truncated importance sampling) drops the
# low-probability tail of stray characters. Every seed 0-15 ends at >= 0.85 in 200 steps (bench/README.md).
TINY_CPU = dict(model_name="tiny", task="toy", num_generations=8, max_new_tokens=3, temperature=1.0,
                use_chat_template=False, top_p=0.9, beta=0.02,
                lora_r=8, lora_alpha=16, learning_rate=3e-3, batch_size=8, num_steps=200,
                eval_every=50, save_every=100, num_eval_items=19, run_dir="checkpoints/tiny_cpu")

# A free-tier Colab T4 (16 GB, no bf16): the 1.5B coder in 4-bit, fp16 compute, on the code task.
COLAB_T4 = dict(model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct", dtype="float16", task="code",
                reward_workers=2, num_generations=4,
                max_new_tokens=256, temperature=0.7, top_p=0.9, lora_r=16, lora_alpha=32,
                learning_rate=5e-5, batch_size=1, num_steps=500, gradient_checkpointing=True,
                eval_every=50, save_every=25, run_dir="checkpoints/colab_t4")

# The paper's recipe adapted to 4-bit LoRA on one A100: Qwen2.5-Coder-3B, 2 agents, G=4, code task (HumanEval
# train split, sandboxed tests in 8 threads).
COLAB_A100 = dict(model_name="Qwen/Qwen2.5-Coder-3B-Instruct", task="code", reward_workers=8,
                  num_agents=2, num_generations=4,
                  max_new_tokens=256, temperature=0.7, top_p=0.9, lora_r=16, lora_alpha=32,
                  learning_rate=5e-5, batch_size=2, num_steps=1000, eval_every=50, save_every=25,
                  gradient_checkpointing=True,  # without it the update peaks at ~54 GiB (3B, 16 rows x ~700)
                  run_dir="checkpoints/colab_a100")

# Self-play on OpenSpiel's tiny_hanabi with the built-in tiny model, one adapter per player: reaches the game's
# 8-of-10 convention within 150 steps on a laptop CPU (about 45 s for 300 steps; bench/game_learning.py).
# save_every 25: tiny_cpu's 100 would leave a stop or a disconnect up to 100 steps to redo.
TINY_HANABI = {**TINY_CPU, "task": "game", "task_args": {"game": "tiny_hanabi", "prompt_style": "compact"},
               "learning_rate": 1e-3, "temperature": 1.5, "num_steps": 300, "top_p": 1.0, "beta": 0.0,
               "eval_every": 25, "num_eval_items": 16, "run_dir": "checkpoints/tiny_hanabi", "save_every": 25}

# Two-player Hanabi self-play on one A100: Qwen2.5-3B-Instruct in 4-bit, one LoRA adapter per player, 2 deals x G=4
# episodes per step, up to 80 decisions per episode, a short numbered answer per move.
COLAB_HANABI = dict(model_name="Qwen/Qwen2.5-3B-Instruct", task="game",
                    task_args={"game": "hanabi", "prompt_style": "full", "max_decisions": 80,
                               "illegal": "random", "illegal_penalty": 1.0},
                    num_agents=2, num_generations=4, batch_size=2, max_new_tokens=8, temperature=1.0,
                    top_p=1.0, lora_r=16, lora_alpha=32, learning_rate=2e-5, num_steps=300, micro_batch_size=64,
                    gradient_checkpointing=True, eval_every=25, save_every=25, num_eval_items=16,
                    run_dir="checkpoints/colab_hanabi")

# What the three smol presets share: SmolLM2-135M-Instruct (`smollm2-135m`: the hub's weights where it answers, else
# the packaged GGUF; kit/engine/weights.py), on a CPU in dtype=auto's precision, 2 agents x G=4 on one item a step,
# rank-16 LoRA.
SMOL = dict(model_name="smollm2-135m", num_generations=4, batch_size=1, temperature=0.7, top_p=0.9,
            lora_r=16, lora_alpha=32, learning_rate=3e-4, num_steps=30, eval_every=10, save_every=10)

# A real pretrained team on a laptop CPU: SmolLM2-135M-Instruct on TLDR (a concise and a detailed summary), 48 new
# tokens each; a step is about 15 s on 2 cores, and the held-out reward rises within 20 steps (bench/README.md,
# "SmolLM2-135M on a CPU").
SMOL_WRITING = {**SMOL, "task": "writing", "task_args": {"kind": "tldr"}, "max_new_tokens": 48,
                "num_eval_items": 8, "run_dir": "checkpoints/smol_writing"}

# SmolLM2-135M-Instruct on the cooperative coding problems (helper writes aux, main the entry point), 96 new tokens
# (the untrained model's first code block fits; what it rambles after is cut), sandboxed tests in 2 threads, 8 of the
# 12 held-out problems. The helper's answer is started with `def aux(` (`prefill=helper`): told to write `aux`, the
# 135M model writes the entry point instead in 63 of 64 samples. At 135M few tests pass: the signal is mostly the
# structure and syntax levels (bench/README.md). `--set num_turns=2` adds the task's feedback turn (its update
# reached 15 GB of RAM with every row of an agent in one pass: add `micro_batch_size=4` on a smaller machine);
# HumanEval instead of the cooperative problems: `--set 'task_args={dataset: humaneval, prefill: helper}'`.
SMOL_CODE = {**SMOL, "task": "code", "task_args": {"dataset": "coop", "prefill": "helper"}, "max_new_tokens": 96,
             "reward_workers": 2, "num_eval_items": 8, "run_dir": "checkpoints/smol_code"}

# SmolLM2-135M-Instruct in self-play on OpenSpiel's tiny_hanabi with the full prompt (cards and moves named), one
# adapter per player, a short numbered answer per move, one deal x G=8 episodes a step. Sampled at temperature 1 the
# untrained players name no legal move about 60% of the time (each costs the illegal penalty): the first thing they
# learn is to answer.
SMOL_HANABI = {**SMOL, "task": "game", "task_args": {"game": "tiny_hanabi", "prompt_style": "full"},
               "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "num_generations": 8, "num_eval_items": 16,
               "run_dir": "checkpoints/smol_hanabi"}

# A code team that passes tests on a laptop: Qwen2.5-Coder-0.5B-Instruct (`qwen2.5-coder-0.5b`: the hub's weights where
# it answers, else a hash-pinned Q4_K_M GGUF from the package index, dequantized; kit/engine/weights.py) on the
# cooperative problems, on a CPU in dtype=auto's precision (bf16 where native, else fp32), 2 agents x G=4 on one item
# a step. Set before any run and not tuned
# (bench/README.md, "Qwen2.5-Coder-0.5B on a CPU"): 160 new tokens hold most of the untrained model's code (120-190
# tokens with its docstring), the helper's answer started with `def aux(` as at 135M, and a learning rate of 1e-4
# (3e-4, the 135M preset's, took the team's held-out pass@1 from 0.19 to 0.00 in 5 steps in the one run).
# About 2.5 minutes a step with two such runs on 2 cores (generation two thirds of it). On seeds 0-2 the trained
# team passes more held-out tests than the untrained one after 10 steps (pass@1 +0.15 pooled). 30 steps: the code
# table's length (bench/code_table.py, issue 78), which trains these presets as they are; for it the first 32 of the
# 47 problems are held out (the dataset's default holds out 12: too few to decide), the other 15 trained on. MBPP:
# `--set 'task_args={dataset: mbpp, prefill: helper}'`.
CODER_CODE = {**SMOL, "model_name": "qwen2.5-coder-0.5b", "task": "code",
              "task_args": {"dataset": "coop", "prefill": "helper", "eval_range": [0, 32], "train_range": [32, None]},
              "max_new_tokens": 160, "learning_rate": 1e-4,
              "num_steps": 30, "eval_every": 5, "save_every": 5, "reward_workers": 2, "num_eval_items": 8,
              "run_dir": "checkpoints/coder_code"}

# The same code team on MBPP (397 bundled problems, the first 32 held out; 8 of them evaluated) at lr 3e-5: the rate
# the KeyHalves team learned with, chosen there before any MBPP run at it (at 1e-4 the one MBPP seed lost pass@1,
# 0.56 -> 0.25). On fresh seeds 5-7 the trained team passes more held-out MBPP problems than the untrained team on
# every seed (pass@1 0.48 -> 0.67, +0.19 [+0.06, +0.33] paired; bench/README.md, "MBPP at lr 3e-5"). About 2 minutes a
# step on one thread. On HumanEval the same rate raises the reward, not pass@1 (seeds 5-7).
CODER_MBPP = {**CODER_CODE, "task_args": {"dataset": "mbpp", "prefill": "helper"}, "learning_rate": 3e-5,
              "run_dir": "checkpoints/coder_mbpp"}

# The single model the code table (bench/code_table.py, issue 78) sets beside each team: ONE adapter writes aux and the
# entry point in one completion (`algorithm=centralized`, kit/engine/centralized.py), trained with the team's reward,
# problems, G, steps and learning rate, and 320 new tokens, the team's two answers' budget together. At 0.5B it calls
# its own aux in 75-100% of a step's samples, where the team's main never calls the helper's (bench/README.md).
CODER_CODE_SINGLE = {**CODER_CODE, "algorithm": "centralized", "max_new_tokens": 2 * CODER_CODE["max_new_tokens"],
                     "run_dir": "checkpoints/coder_code_single"}
CODER_MBPP_SINGLE = {**CODER_MBPP, "algorithm": "centralized", "max_new_tokens": 2 * CODER_MBPP["max_new_tokens"],
                     "run_dir": "checkpoints/coder_mbpp_single"}

# Qwen2.5-Coder-0.5B-Instruct in the KeyHalves information game (kit/tasks/environments.py): each of two agents reads
# its half of a six-digit key with its own tool and submits it; get_reward's optimum is exactly 1.0. Its chat template
# offers the tools itself. 8 of the 64 bundled rows held out. 4 calls and 128 tokens a turn (each pretty-printed call
# is ~25 tokens; with 2 calls the untrained model never read its half, and a call with wrong arguments answers what
# the tool takes, kit/sandbox/envhost.py, which it uses to correct its call). Credit and rate, chosen on seed 100
# (bench/README, "KeyHalves learns"): with the team's reward alone and coder_code's 1e-4 the team got worse (seed 2:
# an agent's failing loop was credited whenever its partner succeeded); each agent's return half the team's reward
# and half its own share (`local_reward_weight=0.5`, the game's get_agent_rewards) at 1e-4 locked the left agent into
# a loop of read calls that never submits (every sample alike, 0.75 from step 7 on: nothing left to learn from), and
# at 3e-5 the team reached 1.0 by step 6.
# Two rows a micro-batch keep the update's activations near 7 GB (all 4 of an agent's rows at once: ~14 GB). 10 steps,
# greedy held-out evaluation every 5. SmolLM2-135M, probed, called no tool in 8 samples (it invents tool names):
# reward 0, nothing to learn from, so there is no SmolLM2 preset for this game.
CODER_KEYS = {**SMOL, "model_name": "qwen2.5-coder-0.5b", "task": "rows",
              "task_args": {"file": "key_rows.jsonl", "num_eval": 8, "roles": ["left", "right"]},
              "environment": "kit.tasks.environments:KeyHalves", "max_new_tokens": 128, "max_tool_calls": 4,
              "local_reward_weight": 0.5, "learning_rate": 3e-5, "micro_batch_size": 2, "num_steps": 10,
              "eval_every": 5, "num_eval_items": 8, "run_dir": "checkpoints/coder_keys"}

# Minutes a training step of the CPU presets takes on 2 cores, from the kit's own measurements (the config cell says
# them before a run, and the run's own speed once it has one): smol_* from the 20-30 step runs of 2026-11-26 with other
# jobs beside them (bench/journal/, Table 1 at 135M: writing 40-82 s, code 72 s, hanabi 51 s), coder_code and
# coder_mbpp from 111-132 s a step alone (issue 77's bar run; bench/README.md, "A 0.5B step on a CPU"), coder_keys
# from 208-230 s with two runs at once (bench/README.md, KeyHalves), the *_single presets from 43-110 s with two runs
# at once (issue 78's tuning run). A held-out evaluation adds minutes at 0.5B.
CPU_MINUTES_PER_STEP = {"tiny_cpu": 0.003, "tiny_hanabi": 0.003, "smol_writing": 0.7, "smol_code": 1.2,
                        "smol_hanabi": 0.9, "coder_code": 2.0, "coder_mbpp": 2.0, "coder_keys": 3.5,
                        "coder_code_single": 1.5, "coder_mbpp_single": 1.5}

PRESETS = {"tiny_cpu": TINY_CPU, "colab_t4": COLAB_T4, "colab_a100": COLAB_A100, "tiny_hanabi": TINY_HANABI,
           "colab_hanabi": COLAB_HANABI, "smol_writing": SMOL_WRITING, "smol_code": SMOL_CODE,
           "smol_hanabi": SMOL_HANABI, "coder_code": CODER_CODE, "coder_mbpp": CODER_MBPP,
           "coder_keys": CODER_KEYS, "coder_code_single": CODER_CODE_SINGLE,
           "coder_mbpp_single": CODER_MBPP_SINGLE}
