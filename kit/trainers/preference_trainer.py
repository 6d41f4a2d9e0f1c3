"""MADPO: multi-agent DPO on pairs of joint answers, in the MAGRPO loop (kit/trainers/trainer.py) on the shared base.

    cfg = load_config("tiny_cpu", overrides=["algorithm=madpo"])      # CLI: --set algorithm=madpo
    MADPOTrainer(cfg).train()

A step: when the buffer is due (`preference_refresh_every` steps: 1 = every step, online; K = CoMLRL's iterative
variant, new candidates from the current policy every K steps), every agent samples `preference_num_candidates`
completions per item in ONE batched generate call (the same per-row seeds as MAGRPO's samples), the k-th of every
agent form joint answer k (aligned), the task scores each, and `pair_selection` picks (winner, loser) pairs per item
(kit/maths/preference.py), or the Claude judge labels them in both orders (`preference_source=judge`,
kit/judge/pairs.py). With `dpo_reference=base` the reference log-probs of every candidate are computed then, once,
with the adapter off (the base never moves). The buffer holds the candidates, the pairs and those log-probs until
the next refresh; it is part of the checkpoint (`preferences.pt`, every process's), so a resumed run continues
exactly.

The update (kit/maths/preference.py has the equations): a no-grad pass gives every agent's Delta_i on every pair; then
each adapter, in turn, recomputes its own Delta with gradient (micro-batched by pairs) and steps on
-log sigmoid(dpo_beta * (own Delta + the others' detached Deltas)): the others' Deltas are those of the policy
before this step, as in CoMLRL. Sequence log-probs sum every completion token, EOS included, and are at temperature
1, the policy's and the reference's alike, whatever `temperature` and `score_at_sampling_temperature` say: DPO's
implicit reward is dpo_beta * log(pi / pi_ref) of the model itself, and the pairs are data whatever drew them (the
sampling temperature chooses which candidates are compared, not the policy the loss moves). MAGRPO differs on
purpose: its policy gradient is an expectation over its own samples, so its update scores them at the distribution
they were drawn from (kit/maths/losses.py). Pairs are a per-process share; the loss is a mean over the global pairs and
gradients are summed across processes (kit/run/distributed.py), so 2 processes train as 1.

Metrics: dpo/loss, dpo/accuracy, dpo/margin, dpo/reward_gap, dpo/num_pairs, preference/fresh (1 on a refresh
step); reward/* are those of the candidates in the buffer (the refresh step's), and rollouts.jsonl holds them once,
at their refresh step. Not covered: multi-turn pairs (num_turns > 1), cross joint mode.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from kit.run import checkpoint
from kit.maths import magrpo, preference
from kit.tasks.rewards import impute_unscored
from kit.engine.rollout import Rollout, Segment
from kit.engine.forward import completion_logprobs
from kit.trainers.trainer import Level, Trainer

PAIRS_FILE = "preferences.pt"


@dataclass
class PairBuffer:
    """This process's candidates and pairs since the last refresh."""

    step: int  # the step whose policy sampled the candidates
    level: Level  # K joint answers per item (aligned) and their joint rewards
    pairs: list[tuple[int, int, int]]  # (node, winner, loser): node = the item's place in this process's share
    ref: torch.Tensor | None  # (requests * K,) the base's sequence log-prob of every candidate row (adapter off)


def take(seg: Segment, rows: list[int]) -> Segment:
    """The segment's rows in the order given (a micro-batch of winner and loser rows)."""
    i = torch.tensor(rows, device=seg.input_ids.device)
    return Segment(seg.base, seg.input_ids[i], seg.attention_mask[i], seg.completion_mask[i], seg.prompt_len,
                   seg.sample[i], seg.agent[i], seg.sampler_logprobs[i], seg.finished[i])


def moved(buffer: PairBuffer, device) -> PairBuffer:
    """A copy of the buffer with its tensors on `device` (CPU for a checkpoint, the model's on a resume)."""
    def seg_to(s: Segment) -> Segment:
        return Segment(**{f.name: (getattr(s, f.name).to(device) if torch.is_tensor(getattr(s, f.name))
                                   else getattr(s, f.name)) for f in dataclasses.fields(Segment)})

    ro = dataclasses.replace(buffer.level.rollout, segments=[seg_to(s) for s in buffer.level.rollout.segments])
    return dataclasses.replace(buffer, level=dataclasses.replace(buffer.level, rollout=ro),
                               ref=None if buffer.ref is None else buffer.ref.to(device))


def judge_preference(cfg, task, log):
    """preference_source=judge: the Claude judge comparing joint answers in both orders, or None (one line) when
    it is off (no key, no anthropic): pairs then come from the task's joint reward."""
    from kit.judge.judge import Judge
    from kit.judge.pairs import JudgePreference
    from kit.tasks.rewards import DEFAULT_RUBRIC

    judge = Judge(cfg.run_dir, cfg.judge_model, cfg.judge_budget_usd, timeout=cfg.judge_timeout_s,
                  max_retries=cfg.judge_max_retries, max_failures=cfg.judge_max_failures,
                  cooldown_s=cfg.judge_cooldown_s, log=log)
    if judge.client is None:
        log("[kit] preference_source=judge without a judge: pairs come from the task's joint reward")
        return None
    return JudgePreference(judge, getattr(task, "judge_rubric", None) or DEFAULT_RUBRIC)


class PreferencePairs:
    """What MADPO and MARLHF share: candidates from one batched call, pairs, the buffer in the checkpoint."""

    def _init_pairs(self, preference_fn) -> None:
        self.buffer: PairBuffer | None = None
        self.buffers: list | None = None  # every process's buffer, on CPU (the main process saves them)
        self.prefer = preference_fn
        self.fresh = False

    def candidates(self, items: list[dict], positions: list[int], reference: bool, kind: str = "train") -> PairBuffer:
        """K joint answers per item, scored; pairs by pair_selection (or the judge); the reference log-probs.
        `kind` starts the samples' seed keys ("train": those MAGRPO would draw at this step)."""
        cfg, N, K = self.cfg, self.cfg.num_agents, self.cfg.preference_num_candidates
        joints = magrpo.joint_actions(N, K, "aligned")
        nodes = [{"item": i, "prompts": list(self.task.prompts(item)), "parent": None, "path": (),
                  "id": positions[i], "parent_id": None} for i, item in enumerate(items)]
        requests = [(a, node["prompts"][a]) for node in nodes for a in range(N)]
        keys = [(kind, self.step, positions[node["item"]], 0, a) for node in nodes for a in range(N)]
        ro = self.sampler.sample(requests, K, keys=keys)  # the same seeds as MAGRPO's samples of this step
        jobs = [(items[n], self.joint(ro, n, idx)) for n in range(len(nodes)) for idx in joints]
        rewards = [f.result() for f in self.scorer.submit(jobs)]
        level = Level(0, nodes, ro, joints, [impute_unscored(rewards[n * K:(n + 1) * K]) for n in range(len(nodes))])
        level.returns = np.array([[self.reward_model.process(r.total) for r in node] for node in level.rewards])
        level.advantages = np.zeros((len(nodes), N, K))  # no advantages: pairs instead
        pairs = []
        for n in range(len(nodes)):
            rng = np.random.default_rng([cfg.seed, self.step, positions[n]])  # pair_selection=random, resumable
            if self.prefer is not None:
                from kit.judge.pairs import judged_pairs, render_task

                answers, asked = [self.joint(ro, n, idx) for idx in joints], render_task(nodes[n]["prompts"])
                found = judged_pairs(K, lambda i, j: self.prefer(answers[i], answers[j], asked), cfg.pair_selection,
                                     cfg.preference_pairs_per_sample, rng)
            else:
                found = preference.select_pairs(level.returns[n], cfg.pair_selection, cfg.preference_pairs_per_sample,
                                                rng)
            pairs += [(n, w, l) for w, l in found]
        ref = self.sequence_logprobs(ro, reference=True) if reference else None
        return PairBuffer(self.step, level, pairs, ref)

    def refresh(self, items: list[dict], positions: list[int] | None, due: bool, reference: bool) -> None:
        """New candidates and pairs for the step's items when `due` (or when there is no buffer yet)."""
        positions = list(range(len(items))) if positions is None else positions
        self.fresh = due or self.buffer is None
        if self.fresh:
            self.buffer = self.candidates(items, positions, reference)
            self.buffers = self.dist.gather(moved(self.buffer, "cpu"))

    @torch.no_grad()
    def sequence_logprobs(self, ro: Rollout, reference: bool = False) -> torch.Tensor:
        """(requests * K,) sequence log-prob of every row at temperature 1, by sample index: each agent's adapter
        (no dropout), or the base with the adapter off (`reference`)."""
        team, mb = self.team, self.cfg.micro_batch_size
        out = torch.zeros(len(ro.requests) * self.cfg.preference_num_candidates)
        for adapter in team.adapters:
            agents = team.agents_of_adapter(adapter)
            model = team.model_of(agents[0])
            model.set_adapter(adapter)
            seg = ro.segment(team.base_of[agents[0]])
            seg = seg.rows(agents) if seg is not None else None
            if seg is None or not len(seg.sample):
                continue
            for lo in range(0, len(seg.sample), mb or len(seg.sample)):
                sub = seg.slice(lo, lo + (mb or len(seg.sample)))
                with model.disable_adapter() if reference else nullcontext():
                    logp = self._eval_logprobs(model, sub, 1.0, self.cfg.share_prompts)
                out[sub.sample.cpu()] = preference.sequence_logprobs(logp, sub.completion_mask).float().cpu()
            model.eval()
        return out

    def checkpoint_files(self) -> dict:
        return {PAIRS_FILE: {"world": self.dist.world, "buffers": self.buffers}} if self.buffers else {}

    def _resume(self) -> None:
        super()._resume()
        path = checkpoint.ckpt_dir(self.run_dir) / checkpoint.step_name(self.step) / PAIRS_FILE
        if not self.step or not path.exists():
            return
        saved = torch.load(path, map_location="cpu", weights_only=False)
        if saved["world"] != self.dist.world:
            self.log(f"[kit] the pair buffer of step {self.step} was written by {saved['world']} processes, this run "
                     f"has {self.dist.world}: new candidates at step {self.step + 1}")
            self.buffer = self.buffers = None
            return
        device = next(self.team.models[0].parameters()).device
        self.buffers = saved["buffers"]
        self.buffer = moved(self.buffers[self.dist.rank], device)

    def rollout_rows(self, levels: list[Level], items: list[dict]) -> list[dict]:
        """The candidates once, at the step that sampled them."""
        return super().rollout_rows(levels, items) if self.fresh else []

    def pair_rewards(self) -> tuple[list[float], list[float]]:
        """The (processed) joint rewards of this process's winners and losers."""
        ret = self.buffer.level.returns
        return [float(ret[n, w]) for n, w, _ in self.buffer.pairs], [float(ret[n, l]) for n, _, l in self.buffer.pairs]


class MADPOTrainer(PreferencePairs, Trainer):
    """algorithm=madpo: see the module docstring."""

    def __init__(self, cfg, *args, preference_fn=None, **kwargs):
        self._init_pairs(preference_fn)
        super().__init__(cfg, *args, **kwargs)
        if self.prefer is None and cfg.preference_source == "judge":
            self.prefer = judge_preference(cfg, self.task, self.log)

    def sample(self, items: list[dict], positions: list[int] | None = None) -> list[Level]:
        self.refresh(items, positions, self.step % self.cfg.preference_refresh_every == 0,
                     self.cfg.dpo_reference == "base")
        return [self.buffer.level]

    def update(self, levels: list[Level]) -> dict:
        cfg, team, buf = self.cfg, self.team, self.buffer
        N, K = cfg.num_agents, cfg.preference_num_candidates
        stats = {"lr": self.optimizers[team.adapters[0]].param_groups[0]["lr"]}
        # (P, N) sample index of each pair's winner / loser row of every agent
        w_idx = torch.tensor([[(n * N + a) * K + w for a in range(N)] for n, w, _ in buf.pairs], dtype=torch.long)
        l_idx = torch.tensor([[(n * N + a) * K + l for a in range(N)] for n, _, l in buf.pairs], dtype=torch.long)
        w_idx, l_idx = w_idx.view(-1, N), l_idx.view(-1, N)
        policy = self.sequence_logprobs(buf.level.rollout)  # pass 1: every agent's policy before this step
        deltas = preference.dpo_delta(policy[w_idx], policy[l_idx],
                                      *((buf.ref[w_idx], buf.ref[l_idx]) if buf.ref is not None else ()))  # (P, N)
        joint = deltas.sum(1)  # (P,)
        (total,) = self.dist.sum([len(buf.pairs)])
        for adapter in team.adapters:
            agents, model, opt = self.train_mode(adapter)
            opt.zero_grad(set_to_none=True)
            seg = buf.level.rollout.segment(team.base_of[agents[0]])
            row = {int(s): r for r, s in enumerate(seg.sample.tolist())} if seg is not None else {}
            per = max(1, cfg.micro_batch_size // (2 * len(agents))) if cfg.micro_batch_size else max(len(joint), 1)
            loss_sum = 0.0
            for lo in range(0, len(joint), per):
                sel = slice(lo, min(lo + per, len(joint)))
                rows = [row[int(i)] for idx in (w_idx, l_idx) for i in idx[sel][:, agents].reshape(-1)]
                sub = take(seg, rows)
                # (2 * p * agents, T), with gradient
                logp = completion_logprobs(model, sub, 1.0, share_prompts=self.cfg.share_prompts)
                s = preference.sequence_logprobs(logp, sub.completion_mask).view(2, -1, len(agents))
                ref = (buf.ref[w_idx[sel][:, agents]], buf.ref[l_idx[sel][:, agents]]) if buf.ref is not None else ()
                own = preference.dpo_delta(s[0], s[1], *(r.to(s.device) for r in ref)).sum(-1)  # (p,)
                others = (joint[sel] - deltas[sel][:, agents].sum(-1)).to(s.device)
                loss = preference.agent_dpo_loss(own, others, cfg.dpo_beta)
                share = own.shape[0] / max(total, 1)
                (loss * share).backward()  # the sum over micro-batches is the mean over every process's pairs
                loss_sum += float(loss.detach()) * share
            norm = self._step(adapter, opt, int(total))
            self.schedulers[adapter].step()
            model.eval()
            stats[f"loss/{adapter}"] = self.dist.sum([loss_sum])[0]
            stats[f"grad_norm/{adapter}"] = norm
        won, lost = self.pair_rewards()
        every = self.dist.gather((joint.tolist(), won, lost))
        z, won, lost = ([x for part in every for x in part[k]] for k in range(3))
        stats["dpo/num_pairs"] = len(z)
        if z:
            stats.update(preference.dpo_stats(z, cfg.dpo_beta, won, lost))
        return stats

    def metrics(self, levels: list[Level], update_stats: dict, times: dict) -> dict:
        row = super().metrics(levels, update_stats, times)
        row.pop("advantage/abs_mean", None)  # no advantages in DPO
        row["preference/fresh"] = int(self.fresh)
        return row
