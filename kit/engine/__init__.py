"""The model side: weights, the team of adapters on one base, and batched generation.

    weights.py      short model names (smollm2-135m, qwen2.5-coder-0.5b): the hub, else a hash-pinned package
    models.py       the base (4-bit on CUDA), one LoRA adapter per agent, the tiny model (start here)
    precision.py    dtype=auto (bf16 where a CPU computes it natively), the fp32 output layer of a bf16 base
    rollout.py      the Sampler: one batched generate for every agent and sample; rollout records
    forward.py      the update's forward: log-probs of the sampled tokens, shared prompts forwarded once
    sampling.py     per-row seeded sampling (the same sample whatever the batch)
    batching.py     how many rows one engine call may take: bounded by free memory, split by whole requests
    compiled.py     the compiled engine: stacked LoRA, static cache, CUDA graphs
    prefixes.py     shared prompt prefixes computed once (generation and every forward of the update)
    prompts.py      Prompt, Chat: a prompt whose answer is started for the model (`answer_start`; with tools,
                    `final_start` after the last call, `round_starts` for scheduled rounds)
    heads.py        a scalar model on the shared base: one more adapter + an fp32 head (critics, reward models)
    centralized.py  one policy writing every agent's part (algorithm=centralized)
    tools.py        agents that act: the joint rollout with an environment's tools, rounds of one batched call

May import: kit.maths, kit.sandbox (the environment's process), torch, transformers, peft, bitsandbytes; not tasks,
runs or trainers.
"""
