"""MARLHF: a joint reward model learnt from pairs (Bradley-Terry) on the shared base, then the reward of MAGRPO,
IAC or MAAC.

    cfg = load_config("tiny_cpu", overrides=["algorithm=marlhf"])     # CLI: --set algorithm=marlhf
    MARLHFTrainer(cfg).train()
    # the RL stage with critics: overrides=["algorithm=marlhf", "marlhf_rl_algorithm=maac"]

The reward model is a kit/engine/heads.py ScalarModel: one more LoRA adapter ("reward_model") on the team's shared base
and an fp32 head on the last token; no second copy of the weights. It reads a joint answer as text,

    [Agent 0] <agent 0's prompt>
    <agent 0's completion>
    [Agent 1] ...

every agent's completion whole; with max_prompt_tokens each prompt loses its middle as the sampler cut it (the
joint text is never cut as a whole, which would lose agent 0's answer first: issue 41). With
`reward_model_reads_prompts=false` it reads the answers alone ("[Agent 0]\n<completion>\n[Agent 1]..."): for a
rubric on the answers only, fewer tokens and nothing of the prompt to memorise (bench/README.md, SmolLM2 TLDR).
Its head reads the last token (`reward_model_pooling=last`), or the mean or the sum over the text's tokens (`sum`:
a score per token added up, which can count: TLDR's rubric is word-count ratios).

Fit (at step 0, then every `reward_refresh_every` steps; 0: once, then frozen, CoMLRL's offline MARLHF): the
current policy samples `preference_num_candidates` joint answers for `reward_num_items` train items (a seeded
choice per fit) in one batched call, and `pair_selection` picks pairs by the task's joint reward, or the Claude
judge labels them in both orders (`preference_source=judge`, kit/judge/pairs.py: the judge is paid for these pairs
only, never per rollout). The pairs of a `reward_heldout_fraction` of the items are held out. Then
`reward_num_train_epochs` passes over the others in seeded random batches of `reward_train_batch_size` pairs,
AdamW (`reward_learning_rate`) on the Bradley-Terry loss -log sigmoid(s(w) - s(l)) (kit/maths/preference.py), the
model continuing from its previous fit; with `micro_batch_size` a batch goes through the model that many texts
(half as many pairs) at a time, its mean loss's gradient accumulated (SmolLM2 reading 16 TLDR joint texts of ~500
tokens at once peaked above 20 GB). Every process gathers every pair and runs the same fit, so 2 processes
give the reward model 1 does.

Training (`marlhf_rl_algorithm`): MAGRPO as in kit/trainers/trainer.py, or IAC / MAAC (kit/trainers/critic.py), with each joint
action's reward replaced by the reward model's score before any return or advantage is computed, so the group
baseline (magrpo) or the critics' targets (iac, maac: y = r for one turn) read the score exactly where they read
the task's reward otherwise. The task's reward stays in the logs as reward/task, and evaluation is scored with the
task's reward. The scores are raw Bradley-Terry logits: their scale is whatever the fit gave (it grows with the
epochs), so with magrpo `scale_rewards=group` makes the update independent of it (the critics normalise their
advantages already, advantage_normalization). Metrics of a fit step: rm/loss, rm/train_accuracy,
rm/heldout_accuracy, rm/num_pairs, rm/heldout_pairs. rm_pairs.jsonl has each pair of the fit (train or held out)
with the task's reward of both sides and the model's scores, so what the model gets wrong can be read against the
task's margins. The reward model and its optimizer are in every checkpoint (models/reward_model/), beside the
critics' (models/critic*/), so a resumed run continues exactly.
Not covered: a reward model on another base than base 0; multi-turn joint answers (num_turns=1).
Run its tests: python -m pytest tests/test_marlhf.py
"""

from __future__ import annotations

import numpy as np
import torch

from kit.maths import preference
from kit.run import rundir
from kit.trainers.preference_trainer import PreferencePairs, judge_preference
from kit.tasks.rewards import Reward
from kit.trainers.trainer import Level, Trainer

NAME = "reward_model"


def joint_text(prompts, completions, tokenizer=None, max_prompt_tokens: int | None = None,
               use_chat_template: bool = True) -> str:
    """A joint answer as the reward model reads it: each agent's prompt, then its whole completion; with
    `prompts=None` the completions alone (`reward_model_reads_prompts=false`), each after its agent's tag.

    Each prompt is its own text (an answer start, e.g. a code fence and `def aux(`, is not repeated: the completion
    begins with it). With `max_prompt_tokens`, a prompt loses its middle exactly as the sampler cut it for its agent
    (kit/engine/rollout.py kept_prompt: the same room, the chat template's tokens counted), never a completion:
    cutting the joint text as a whole would take agent 0's answer first. The text is then at most
    N (max_prompt_tokens + max_new_tokens) tokens and a few per block, and is read whole."""
    if prompts is None:
        return "\n".join(f"[Agent {i}]\n{c}" for i, c in enumerate(completions))
    if max_prompt_tokens is not None:
        from kit.engine.rollout import kept_prompt

        prompts = [kept_prompt(tokenizer, p, use_chat_template, max_prompt_tokens) for p in prompts]
    return "\n".join(f"[Agent {i}] {str(p)}\n{c}" for i, (p, c) in enumerate(zip(prompts, completions)))


class MARLHFTrainer(PreferencePairs, Trainer):
    """algorithm=marlhf: see the module docstring."""

    def __init__(self, cfg, *args, preference_fn=None, **kwargs):
        self._init_pairs(preference_fn)
        self.rm = None
        self.rm_stats: dict = {}
        super().__init__(cfg, *args, **kwargs)
        self._reward_model()
        if self.prefer is None and cfg.preference_source == "judge":
            self.prefer = judge_preference(cfg, self.task, self.log)

    def _reward_model(self):
        """The reward model and its optimizer (built once; on a resume, before the checkpoint loads into them)."""
        if self.rm is None:
            from kit.engine.heads import ScalarModel
            from kit.engine.models import lora_config

            cfg = self.cfg
            self.rm = ScalarModel(self.team, NAME, lora_config(cfg.lora_r, cfg.lora_alpha, 0.0,
                                                               cfg.lora_target_modules), seed=cfg.seed,
                                  pooling=cfg.reward_model_pooling)
            opt = torch.optim.AdamW(self.rm.parameters(), lr=cfg.reward_learning_rate, weight_decay=cfg.weight_decay)
            # the algorithm's models: the checkpoint saves them, a resume loads them (kit/trainers/trainer.py, kit/trainers/critic.py)
            self.algorithm.models[NAME], self.algorithm.optimizers[NAME] = self.rm, opt
            self.algorithm.schedulers[NAME] = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        return self.rm

    rollout_rows = Trainer.rollout_rows  # every joint action of every step, as MAGRPO logs them

    def _resume(self) -> None:
        self._reward_model()  # before the checkpoint loads into it
        super()._resume()

    @torch.no_grad()
    def scores(self, texts: list[str]) -> torch.Tensor:
        """(len(texts),) reward-model scores, `micro_batch_size` texts at a time."""
        mb = self.cfg.micro_batch_size or len(texts)
        return torch.cat([self.rm.score_texts(texts[i:i + mb]).float().cpu()  # whole: rm_text cut the prompts only
                          for i in range(0, len(texts), mb)]) if texts else torch.zeros(0)

    def rm_text(self, prompts, completions) -> str:
        """joint_text with each prompt cut to max_prompt_tokens (as its agent saw it) and every answer whole; the
        answers alone with reward_model_reads_prompts=false."""
        prompts = prompts if self.cfg.reward_model_reads_prompts else None
        return joint_text(prompts, completions, self.rm.tokenizer, self.cfg.max_prompt_tokens,
                          self.cfg.use_chat_template)

    def fit(self) -> dict:
        """New pairs from the current policy, then the Bradley-Terry fit; the fit's metrics."""
        cfg = self.cfg
        n = min(cfg.reward_num_items, len(self.train_items))
        chosen = np.random.default_rng([cfg.seed, self.step, 32]).permutation(len(self.train_items))[:n]
        mine = self.dist.share(n)
        buf = self.candidates([self.train_items[chosen[k]] for k in mine], mine, reference=False, kind="pairs")
        held = round(cfg.reward_heldout_fraction * n)  # items 0..held-1 of the choice only measure the model
        ro, nodes = buf.level.rollout, buf.level.nodes
        rewards = buf.level.rewards  # the task's reward of every candidate: the record below, never the fit
        local = [(nodes[k]["id"], w, l, self.rm_text(nodes[k]["prompts"], self.joint(ro, k, (w,) * cfg.num_agents)),
                  self.rm_text(nodes[k]["prompts"], self.joint(ro, k, (l,) * cfg.num_agents)),
                  rewards[k][w].total, rewards[k][l].total)
                 for k, w, l in buf.pairs]
        pairs = sorted(p for part in self.dist.gather(local) for p in part)  # every process: all, in one order
        train = [p for p in pairs if p[0] >= held]
        heldout = [p for p in pairs if p[0] < held]
        opt, bs, losses = self.algorithm.optimizers[NAME], cfg.reward_train_batch_size, []
        per = max(1, cfg.micro_batch_size // 2) if cfg.micro_batch_size else bs  # pairs per forward: 2 texts each
        for epoch in range(cfg.reward_num_train_epochs):
            order = np.random.default_rng([cfg.seed, self.step, epoch]).permutation(len(train))
            for lo in range(0, len(train), bs):
                batch = [train[k] for k in order[lo:lo + bs]]
                opt.zero_grad(set_to_none=True)
                loss_sum = 0.0
                for m in range(0, len(batch), per):  # the batch's mean loss, its gradient accumulated
                    part = batch[m:m + per]
                    s = self.rm.score_texts([p[3] for p in part] + [p[4] for p in part])  # (2p,): winners, losers
                    loss = preference.bradley_terry_loss(s[:len(part)], s[len(part):]) * (len(part) / len(batch))
                    loss.backward()
                    loss_sum += float(loss.detach())
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.rm.parameters(), cfg.max_grad_norm)
                opt.step()
                if epoch == cfg.reward_num_train_epochs - 1:
                    losses.append(loss_sum)
        stats = {"rm/num_pairs": len(train), "rm/heldout_pairs": len(heldout)}
        if losses:
            stats["rm/loss"] = float(np.mean(losses))
        record = []
        for name, part in (("train", train), ("heldout", heldout)):
            if part:
                s = self.scores([p[3] for p in part] + [p[4] for p in part])
                stats[f"rm/{name}_accuracy"] = preference.pair_accuracy(s[:len(part)], s[len(part):])
                record += [{"step": self.step + 1, "item": self.train_items[chosen[p[0]]]["id"], "heldout": name == "heldout",
                            "candidates": [p[1], p[2]], "task_reward": [p[5], p[6]], "score": [float(w), float(l)]}
                           for p, w, l in zip(part, s[:len(part)].tolist(), s[len(part):].tolist())]
        self._append(rundir.RM_PAIRS, record)  # what the model learnt, pair by pair (the step's metrics row)
        return stats

    def sample(self, items: list[dict], positions: list[int] | None = None) -> list[Level]:
        due = self.step == 0 or (self.cfg.reward_refresh_every and self.step % self.cfg.reward_refresh_every == 0)
        self.rm_stats = self.fit() if due else {}
        return super().sample(items, positions)  # scored by the task, then by the model (below)

    def _returns_and_advantages(self, levels: list[Level]) -> None:
        """The reward model's score replaces each joint action's reward (the task's is kept as parts["task"]), then
        the RL stage's returns and advantages: MAGRPO's group baseline, or the critics' (kit/trainers/critic.py)."""
        for level in levels:
            texts = [self.rm_text(node["prompts"], self.joint(level.rollout, n, idx))
                     for n, node in enumerate(level.nodes) for idx in level.joints]
            s = self.scores(texts).tolist()
            J = len(level.joints)
            level.rewards = [[Reward(s[n * J + j], {**r.parts, "task": r.total}, r.details)
                              for j, r in enumerate(node)] for n, node in enumerate(level.rewards)]
        super()._returns_and_advantages(levels)

    def update(self, levels: list[Level]) -> dict:
        return {**super().update(levels), **self.rm_stats}
