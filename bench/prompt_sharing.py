"""Each prompt forwarded once for its samples (`share_prompts`), against the unshared path and the CPU's floors.

    python bench/prompt_sharing.py --preset smol_writing --items 2          # one preset's rows, fp32
    python bench/prompt_sharing.py --preset smol_code --items 2
    python bench/prompt_sharing.py --preset smol_writing --items 2 --dtype bfloat16

On the preset's rows (its model, its first `--items` train items, every agent x G samples, its max_new_tokens):

- generation: the kit's sampler with share_prompts off and on (the same per-row seeds: are the sampled tokens the
  same?), and the floor, plain HF `generate` of the same base with adapters disabled (no adapter routing) on the
  same rows and token budget (sampled, its own seed: about as many tokens; tokens/s compared);
- the update's forward + backward for each adapter (the MAGRPO loss's log-probs on its rows), off and on: the
  log-probs' and the adapter gradient's largest relative difference, and the times; the floor is one forward +
  backward of the same rows through the model's own loss (HF's causal-LM cross-entropy on the completion tokens);
- the sampler's log-probs against the update's: what a dtype (bf16) costs the importance weights (read it with
  `--set top_p=1.0`: a truncated sampler differs from the update by design);
- the scalar models (kit/engine/prefixes.py): a q critic's texts (a prompt, then one completion) and a reward model's
  joint texts, one forward + backward of their scores, off and on: times, scores' and gradient's differences
  (bench/results/prompt_sharing_scalar.md).

Each time is the best of `--repeats` after a warm-up call. One row per setting in bench/results/prompt_sharing.md
(appended). Other jobs on the machine slow every row alike; compare rows of one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def best(fn, repeats: int):
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def rel(a, b) -> float:
    return max(float((x - y).norm() / max(float(y.norm()), 1e-30)) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smol_writing")
    ap.add_argument("--items", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--set", nargs="*", default=[], dest="overrides")
    ap.add_argument("--skip-scalar", action="store_true", help="only the policy's rows (no critic or reward model)")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())

    from kit.run.config import load_config
    from kit.engine.models import adapter_parameters, build_team
    from kit.engine.rollout import Sampler
    from kit.engine.forward import completion_logprobs, prompt_groups
    from kit.tasks import task_for

    cfg = load_config(args.preset, overrides=[f"dtype={args.dtype}", *args.overrides])
    team = build_team(cfg, log=lambda *a: None)
    task = task_for(cfg)
    items = task.load("train")[: args.items]
    requests = [(a, p) for item in items for a, p in enumerate(task.prompts(item))]
    keys = [(0, i, a) for i in range(len(items)) for a in range(cfg.num_agents)]
    sampler = Sampler.from_config(team, cfg)
    G = cfg.num_generations

    def sample(share: bool):
        team.share_prompts = share
        team.engines.clear()
        return sampler.sample(requests, G, keys=keys)

    gen = {share: best(lambda: sample(share), args.repeats) for share in (False, True)}
    ro_off, ro_on = gen[False][1], gen[True][1]
    seg_off, seg = ro_off.segments[0], ro_on.segments[0]
    same_tokens = torch.equal(seg_off.input_ids, seg.input_ids)
    tokens = ro_on.num_tokens

    model = team.models[0]
    hf = model.get_base_model()
    prompts = seg.input_ids[:, : seg.prompt_len]
    pmask = seg.attention_mask[:, : seg.prompt_len]

    def plain_generate():
        from transformers import GenerationConfig

        config = GenerationConfig(max_new_tokens=cfg.max_new_tokens, do_sample=cfg.temperature > 0,
                                  temperature=cfg.temperature or 1.0, top_p=cfg.top_p, top_k=0,
                                  pad_token_id=team.tokenizers[0].pad_token_id,
                                  eos_token_id=team.tokenizers[0].eos_token_id)
        torch.manual_seed(0)
        with model.disable_adapter(), torch.no_grad():
            model.eval()
            out = hf.generate(input_ids=prompts, attention_mask=pmask, generation_config=config)
        comp = out[:, prompts.shape[1]:]
        return int((comp != team.tokenizers[0].pad_token_id).sum())

    floor_gen, floor_tokens = best(plain_generate, args.repeats)

    temperature = cfg.temperature if cfg.score_at_sampling_temperature else 1.0
    update, grads, logps = {}, {}, {}
    for share in (False, True):
        total = 0.0
        grads[share], logps[share] = [], []
        for adapter in team.adapters:
            agents = team.agents_of_adapter(adapter)
            sub = seg.rows(agents)
            model.set_adapter(adapter)
            model.train()
            params = adapter_parameters(model, adapter)

            def step():
                for q in params:
                    q.grad = None
                lp = completion_logprobs(model, sub, temperature, share_prompts=share)
                (-(lp * sub.completion_mask).sum() / sub.completion_mask.sum()).backward()
                return lp.detach()

            t, lp = best(step, args.repeats)
            total += t
            logps[share].append(lp)
            grads[share] += [q.grad.detach().clone() for q in params]
        update[share] = total
        model.eval()

    def floor_step():
        total = 0.0
        for adapter in team.adapters:
            sub = seg.rows(team.agents_of_adapter(adapter))
            model.set_adapter(adapter)
            model.train()
            labels = sub.input_ids.masked_fill(sub.attention_mask == 0, -100)
            labels[:, : sub.prompt_len] = -100
            t0 = time.perf_counter()
            model(input_ids=sub.input_ids, attention_mask=sub.attention_mask, labels=labels).loss.backward()
            total += time.perf_counter() - t0
        model.eval()
        return total

    floor_step()
    floor_update = min(floor_step() for _ in range(args.repeats))
    rows_, P, T = seg.input_ids.shape[0], seg.prompt_len, seg.completion_mask.shape[1]
    distinct = sum(len(prompt_groups(s.input_ids[:, :s.prompt_len], s.attention_mask[:, :s.prompt_len])[0])
                   for s in (seg.rows(team.agents_of_adapter(a)) for a in team.adapters))
    subs = [seg.rows(team.agents_of_adapter(a)) for a in team.adapters]
    # the sampler's log-probs against the update's (shared) ones: the mismatch a dtype or kernel brings (with
    # top_p < 1 the sampler's distribution is truncated, so run with --set top_p=1.0 to read this column)
    mismatch = max(float(((lp - s.sampler_logprobs).abs() * s.completion_mask).max())
                   for lp, s in zip(logps[True], subs))
    lp_diff = max(float(((a - b).abs() * s.completion_mask).max()) for a, b, s in
                  zip(logps[True], logps[False], (seg.rows(team.agents_of_adapter(a)) for a in team.adapters)))
    line = (f"| {args.preset} | {args.dtype} | {rows_} rows, {distinct} prompts, P={P}, T={T} | "
            f"{gen[False][0]:.2f} | {gen[True][0]:.2f} | {gen[False][0] / gen[True][0]:.2f}x | "
            f"{floor_gen:.2f} ({floor_tokens} tok) | {gen[True][0] / floor_gen * floor_tokens / max(tokens, 1):.2f}x | "
            f"{same_tokens} | {update[False]:.2f} | {update[True]:.2f} | {update[False] / update[True]:.2f}x | "
            f"{floor_update:.2f} | {lp_diff:.1e} | {rel(grads[True], grads[False]):.1e} | {mismatch:.1e} |")
    header = ("| preset | dtype | rows | generate off s | on s | speed-up | plain HF generate s | on / floor "
              "(per token) | same tokens | update off s | on s | speed-up | fwd+bwd floor s | max logp diff | "
              "grad rel diff | sampler vs update max logp diff |\n|" + "---|" * 16)
    print(header)
    print(line)
    append(ROOT / "bench" / "results" / "prompt_sharing.md", header, line)

    if args.skip_scalar:
        return
    scalar_header, scalar_line = scalar_models(cfg, team, requests, ro_on.texts, len(items), args)
    print(scalar_header)
    print(scalar_line)
    append(ROOT / "bench" / "results" / "prompt_sharing_scalar.md", scalar_header, scalar_line)


def append(out: Path, header: str, line: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with open(out, "a") as f:
        f.write((header + "\n" if new else "") + line + "\n")


def scalar_models(cfg, team, requests, texts, num_items: int, args) -> tuple[str, str]:
    """A critic's and a reward model's forward + backward on the texts they read, share_prompts off and on: IAC's
    q critic (each prompt as the sampler formatted it, then one of its completions: kit/trainers/critic.py) and MARLHF's
    reward model (the joint text of each aligned joint action: kit/trainers/marlhf.py; MAAC's q critic reads the same shape),
    one ScalarModel with a random adapter and head, the gradient of the sum of its scores."""
    from kit.engine.heads import ScalarModel
    from kit.trainers.marlhf import joint_text
    from kit.engine.models import lora_config
    from kit.engine.prefixes import prefix_groups
    from kit.engine.rollout import format_prompt

    N, G = cfg.num_agents, cfg.num_generations
    tok = team.tokenizers[0]
    critic_texts = [format_prompt(tok, p, cfg.use_chat_template) + t for (_, p), ts in zip(requests, texts) for t in ts]
    rm_texts = [joint_text([p for _, p in requests[i * N:(i + 1) * N]], [texts[i * N + a][g] for a in range(N)])
                for i in range(num_items) for g in range(G)]
    model = ScalarModel(team, "bench_scalar", lora_config(cfg.lora_r, cfg.lora_alpha, 0.0, cfg.lora_target_modules))
    torch.manual_seed(0)
    with torch.no_grad():  # a fresh LoRA B and head are zero (no gradient reaches the adapter): give them an effect
        for q in model.parameters():
            q.add_(torch.randn_like(q) * 0.02)
    model.model.train()
    cells = []
    for texts_ in (critic_texts, rm_texts):
        enc = model.encode(texts_)
        rows = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        groups = prefix_groups(rows) or []
        shared = sum((len(members) - 1) * p for p, members in groups)
        out = {}
        for share in (False, True):
            def step(share=share):
                team.share_prompts = share
                for q in model.parameters():
                    q.grad = None
                scores = model(enc["input_ids"], enc["attention_mask"])
                scores.sum().backward()
                return scores.detach(), [q.grad.detach().clone() for q in model.parameters()]

            out[share] = best(step, args.repeats)
        (t_off, (s_off, g_off)), (t_on, (s_on, g_on)) = out[False], out[True]
        cells.append(f"{len(rows)} texts, {sum(map(len, rows))} tok, {shared} shared | {t_off:.2f} | {t_on:.2f} | "
                     f"{t_off / t_on:.2f}x | {float((s_on - s_off).abs().max()):.1e} | {rel(g_on, g_off):.1e}")
    team.share_prompts = True
    header = ("| preset | dtype | q critic: texts | off s | on s | speed-up | max score diff | grad rel diff | "
              "reward model: texts | off s | on s | speed-up | max score diff | grad rel diff |\n|" + "---|" * 14)
    return header, f"| {args.preset} | {args.dtype} | {cells[0]} | {cells[1]} |"


if __name__ == "__main__":
    main()
