"""The MAGRPO training loop: sample -> score -> advantages -> loss -> step -> log -> checkpoint.

    trainer = Trainer(load_config("tiny_cpu"))      # or Trainer(cfg, task=my_task, reward_funcs=[f, g])
    summary = trainer.train()

One step takes `batch_size` items. Turn 0: every agent samples G completions for every item in ONE batched
generate call (rows routed to each agent's adapter); the joint actions (aligned or cross) are scored together,
in a worker pool when asked. With `num_turns > 1` the task's `feedback` turns each joint action into next-turn
prompts and the tree grows one level per turn (again one generate call per level); returns flow back up the
tree (kit/maths/magrpo.py). Advantages are group-relative over each agent's G completions at a node (`grouping`: or
over the item's nodes of a turn, or of every turn), or against a moving per-role baseline (`advantage_mode=role`).
Then each adapter takes one AdamW step (`num_iterations` of them) on its own rows; the other adapters and the base
never move.

Reproducibility: every sample is seeded from (seed, step, item, turn, tree path, agent, g) (kit/engine/sampling.py),
every step reseeds python/numpy/torch from (seed, step), and the data order is a function of (seed, epoch), so a
resumed run continues exactly (bitwise on a CPU) where it stopped, and an item's rollouts do not depend on the
rest of the batch.

Several GPUs: data parallelism over items (kit/run/distributed.py: `accelerate launch -m kit train ...`), or one
base per GPU for a heterogeneous team (`agent_devices`). The update is on-policy by default (one step per batch,
the paper's); `num_iterations > 1` reuses the batch with the clipped ratio, and the rollout correction weighs
whatever separates the sampler from the trainer (kit/maths/losses.py). Other algorithms (algorithm=iac, maac) change only
the advantages and fit their own models after the update (or, for value heads on the actors, add their gradient
before each actor's step), behind one object (kit/trainers/critic.py); centralized trains this loop on a one-agent form of
the task (kit/engine/centralized.py). Not covered: early termination of tree branches
(CoMLRL's early_termination_threshold).

Past 400 lines on purpose: this is the loop, read top to bottom in one file (each box of sample -> score ->
advantages -> update -> log -> eval -> checkpoint is a method the other trainers override); what builds its parts
is kit/trainers/assemble.py, the maths is kit/maths/.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kit.maths import advantages, losses, magrpo
from kit.run import checkpoint, rundir
from kit.run.checkpoint import seed_everything, step_seed
from kit.run import config as config_mod
from kit.run.config import TrainConfig
from kit.trainers.assemble import assemble, lr_schedule  # noqa: F401  (re-exported: its home before assemble.py)
from kit.tasks.rewards import Reward, impute_unscored, reward_model_for
from kit.engine.rollout import Rollout
from kit.engine.forward import completion_logprobs

PERF_PREFIX = "perf/"  # metrics that measure time; the only ones that differ between identical runs


@dataclass
class Level:
    """One turn of the rollout tree for the whole batch."""

    turn: int
    nodes: list[dict]  # {"item": int, "prompts": [str]*N, "parent": (node, joint) | None}
    rollout: Rollout
    joints: list[tuple[int, ...]]  # the joint actions of every node (one completion index per agent)
    rewards: list[list[Reward]]  # [node][joint]
    returns: np.ndarray | None = None  # (nodes, J) processed returns
    per_agent: np.ndarray | None = None  # (nodes, N, G) the return of each agent's sample (mixed with local ones)
    advantages: np.ndarray | None = None  # (nodes, N, G)
    ties: np.ndarray | None = None  # (nodes, N): groups whose returns all tie (no advantage to learn from)


class Trainer:
    def __init__(self, cfg: TrainConfig, task=None, reward_funcs=None, team=None, resume: bool = False,
                 log=print, sampler=None, from_scratch: bool = False):
        run = assemble(cfg, task=task, reward_funcs=reward_funcs, team=team, resume=resume, log=log,
                       sampler=sampler, from_scratch=from_scratch, reward_model=self.build_reward_model)
        # the built parts (kit/trainers/assemble.py); the loop only reads them
        self.cfg, self.dist, self.log, self.run_dir = run.cfg, run.dist, run.log, run.run_dir
        self.task, self.reward_model, self.scorer = run.task, run.reward_model, run.scorer
        self.train_items, self.eval_items = run.train_items, run.eval_items
        self.team, self.sampler, self.correction = run.team, run.sampler, run.correction
        self.optimizers, self.schedulers, self.algorithm = run.optimizers, run.schedulers, run.algorithm
        self.mirror = run.mirror
        # the loop's own state
        self.step = 0
        self.role_baseline = None  # advantage_mode=role: the moving baseline per (turn, agent), in checkpoints
        self._torn_step = None  # the step whose update ran but whose log lines are not written yet
        self._closed = False
        self.wandb = None
        self.use_wandb = run.run_cfg.use_wandb  # switched off (not the config) when wandb is missing
        if run.resume:
            self._resume()
        if self.dist.is_main:
            config_mod.save(run.run_cfg, self.run_dir / rundir.CONFIG)

    def build_reward_model(self, cfg, task, reward_funcs, log):
        """The run's reward model (kit.tasks.rewards.reward_model_for); a game scores episodes itself (kit/tasks/games.py)."""
        return reward_model_for(cfg, task, reward_funcs, log=log)

    @classmethod
    def from_run(cls, run_dir, overrides: list[str] = (), **kwargs) -> "Trainer":
        """Continue the run in `run_dir` with the config it saved (`overrides` may change fields that do not
        change training, e.g. num_steps with a constant schedule, or reward_workers)."""
        from kit.run.rundir import open_run

        run = open_run(run_dir, overrides)
        return cls(run.cfg, task=kwargs.pop("task", None) or run.task, resume=True, **kwargs)

    # ---- run directory

    def _resume(self) -> None:
        optimizers, schedulers = self.all_optimizers()
        state = checkpoint.resume_latest(self.run_dir, self.team, optimizers, schedulers, log=self.log,
                                         mirror_dir=self.cfg.mirror_dir,
                                         models=self.algorithm.models)  # all damaged: stops, logs untouched
        self.step = state["step"] if state else 0
        saved = (state or {}).get("advantage", {}).get("role_baseline")  # None: unset (JSON has no NaN)
        self.role_baseline = None if saved is None else np.array(saved, dtype=np.float64)
        if state and self.cfg.rollout_correction == "auto":
            # rollout_engine and generation_weights may change on resume (a run moved from a CPU to a GPU): the
            # objective stays the trainer's policy gradient, and `auto` follows the new sampler to keep it so
            before = state.get("update", {}).get("rollout_correction")
            if before is None:  # a checkpoint written before the record existed
                self.log(f"[kit] rollout_correction=auto: {self.correction} from step {self.step + 1} on; the "
                         f"checkpoint of step {self.step} does not record what the steps before it used")
            elif before != self.correction:
                self.log(f"[kit] rollout_correction=auto: {self.correction} from step {self.step + 1} on, {before} "
                         f"at the checkpoint of step {self.step}: the sampler changed with the machine or the "
                         "rollout engine")
        # Lines written after the checkpoint belong to steps that will be run again: drop them.
        if self.dist.is_main:
            for name in rundir.STEP_LOGS:
                rundir.truncate_jsonl(self.run_dir / name, self.step)

    def _append(self, name: str, rows: list[dict]) -> None:
        if self.dist.is_main:
            rundir.append_jsonl(self.run_dir / name, rows)  # in one write, whole even when stopped

    def _logged(self, step: int) -> bool:
        """Does metrics.jsonl hold a row of `step` (a restart before the first checkpoint keeps the step-0 eval)?"""
        path = self.run_dir / rundir.METRICS
        return path.exists() and any(r["step"] == step for r in rundir.read_jsonl(path))

    def _back_to_checkpoint(self) -> None:
        """The last train() was stopped between a step's update and its log lines: weights, optimizer state and
        logs disagree, so continue from the newest checkpoint as a resume would (exactly)."""
        step, self._torn_step = self._torn_step, None
        if rundir.newest_step(self.run_dir) < 0:
            raise RuntimeError(f"step {step + 1} was stopped halfway (during its update or its log lines) and the run "
                               "has no checkpoint to go back to: start it again (run the resume cell, or train with "
                               "--resume)")
        newest = rundir.newest_step(self.run_dir)
        self.log(f"[kit] step {step + 1} was stopped halfway (during its update or its log lines): going back to "
                 f"the newest checkpoint (step {newest}){rundir.dropped(self.run_dir, newest)}")
        self._resume()

    # ---- data

    def batch_items(self, step: int) -> list[dict]:
        """The items of a step: a fresh permutation per epoch, a function of (seed, epoch) only."""
        n, B = len(self.train_items), self.cfg.batch_size
        perms = {}
        out = []
        for k in range(step * B, (step + 1) * B):
            epoch, pos = divmod(k, n)
            if epoch not in perms:
                perms[epoch] = np.random.default_rng([self.cfg.seed, epoch]).permutation(n)
            out.append(self.train_items[perms[epoch][pos]])
        return out

    # ---- rollout

    def sample(self, items: list[dict], positions: list[int] | None = None) -> list[Level]:
        """Grow the rollout tree turn by turn; each level is one batched generate and one batched scoring.
        `positions`: the items' places in the step's global batch (default 0, 1, ...), which seed their samples."""
        cfg, N, G = self.cfg, self.cfg.num_agents, self.cfg.num_generations
        positions = list(range(len(items))) if positions is None else positions
        joints = magrpo.joint_actions(N, G, cfg.joint_mode)
        # node ids count over the global batch (item position x joint actions per level), as one process would
        nodes = [{"item": i, "prompts": list(self.task.prompts(item)), "parent": None, "path": (),
                  "id": positions[i], "parent_id": None} for i, item in enumerate(items)]
        for node in nodes:
            if len(node["prompts"]) != N:
                raise ValueError(f"task.prompts returned {len(node['prompts'])} prompts for {N} agents")
        levels: list[Level] = []
        for turn in range(cfg.num_turns):
            requests = [(a, node["prompts"][a]) for node in nodes for a in range(N)]
            # each request's samples are seeded by (seed, step, item, turn, path in the tree, agent): the same
            # rollouts whatever else is in the batch
            keys = [("train", self.step, positions[node["item"]], turn, *node["path"], a)
                    for node in nodes for a in range(N)]
            worlds = {"worlds": [items[node["item"]] for node in nodes]} if getattr(self.sampler, "acts", False) \
                else {}  # an environment's sampler (kit/engine/tools.py) acts on each node's item
            ro = self.sampler.sample(requests, G, keys=keys, **worlds)
            jobs = [(items[node["item"]], self.joint(ro, n, idx)) for n, node in enumerate(nodes) for idx in joints]
            rewards = self.score(ro, jobs, joints)
            # a node's joint actions are one group: an unscored judge term takes its scored peers' mean there
            per_node = [impute_unscored(rewards[n * len(joints):(n + 1) * len(joints)]) for n in range(len(nodes))]
            levels.append(Level(turn, nodes, ro, joints, per_node))
            if turn + 1 < cfg.num_turns:
                nodes = [{"item": node["item"], "parent": (n, j), "path": node["path"] + (j,),
                          "id": node["id"] * len(joints) + j, "parent_id": (node["id"], j),
                          "prompts": list(self.task.feedback(items[node["item"]], self.joint(ro, n, idx),
                                                             per_node[n][j]))}
                         for n, node in enumerate(nodes) for j, idx in enumerate(joints)]
        self._returns_and_advantages(levels)
        return levels

    def score(self, ro: Rollout, jobs: list[tuple], joints: list[tuple[int, ...]]) -> list[Reward]:
        """Each joint action's reward: the environment's get_reward() of its world when the environment owns the
        reward (kit/engine/tools.py; aligned joints, so joint (g, ..., g) is world g; its get_agent_rewards(), when
        it has one, as the parts local_0 ..), else the scorer's (whose reward functions with an `environment`
        parameter get that world's EnvView)."""
        if getattr(ro, "world_rewards", None) is None:
            if getattr(ro, "views", None) is not None:  # reward functions may read the world each joint acted on
                G = len(ro.texts[0])
                jobs = [(*job, ro.views[(j // len(joints)) * G + joints[j % len(joints)][0]])
                        for j, job in enumerate(jobs)]
            return [f.result() for f in self.scorer.submit(jobs)]
        own = getattr(ro, "agent_rewards", None)  # get_agent_rewards(): the parts local_0 .. of each joint action
        out = []
        for n, node in enumerate(ro.world_rewards):
            for idx in joints:
                world_reward = node[idx[0]]
                parts = {"environment": world_reward}
                if own is not None:
                    parts.update({f"local_{a}": v for a, v in enumerate(own[n][idx[0]])})
                out.append(Reward(total=world_reward, parts=parts))
        return out

    def joint(self, ro: Rollout, node: int, idx: tuple[int, ...]) -> tuple[str, ...]:
        N = self.cfg.num_agents
        return tuple(ro.texts[node * N + a][g] for a, g in enumerate(idx))

    def _returns_and_advantages(self, levels: list[Level]) -> None:
        """Returns and group-relative advantages (kit/maths/advantages.py), then the algorithm's (a critic replaces them)."""
        advantages.returns_and_advantages(self, levels)
        self.algorithm.advantages(self, levels)  # MAGRPO keeps these; a critic replaces them (kit/trainers/critic.py)

    def batch_std(self, returns: np.ndarray) -> float | None:
        """scale_rewards=batch: the std of the returns of the whole step, over every process (else None)."""
        if magrpo.scale_mode(self.cfg.scale_rewards) != "batch":
            return None
        return self.step_std(returns)

    def step_std(self, values: np.ndarray) -> float:
        """The population std of `values` over the whole step, every process's share included."""
        every = np.concatenate([np.ravel(part) for part in self.dist.gather(np.ravel(values).tolist())])
        return float(every.std())

    # ---- update

    def update(self, levels: list[Level]) -> dict:
        """`num_iterations` optimizer steps per adapter on its own rows (kit/maths/losses.py has the loss); returns the
        loss/grad-norm/mismatch stats and the step's LR. Every iteration sees all of the adapter's rows,
        micro-batched, each micro-batch weighted by its share of all rows (or tokens) over every process."""
        cfg, team = self.cfg, self.team
        stats = {"lr": self.optimizers[team.adapters[0]].param_groups[0]["lr"]}  # the rate this step uses
        if self.algorithm.actors_wait(self.step):  # critic_warmup_steps: the critics fit, the actors wait
            with warnings.catch_warnings():  # torch's "scheduler stepped before optimizer.step()": on purpose
                warnings.simplefilter("ignore", UserWarning)
                for adapter in team.adapters:  # the schedule still counts training steps (it ends at num_steps)
                    self.schedulers[adapter].step()
            return stats
        for adapter in team.adapters:
            agents, model, opt = self.train_mode(adapter)
            chunks = [(seg.slice(lo, hi), adv[lo:hi]) for seg, adv, lo, hi in self._chunks(agents, levels)]
            masks = [self.loss_mask(sub) for sub, _ in chunks]
            total_rows, total_tokens = self.dist.sum([sum(len(adv) for _, adv in chunks),
                                                      sum(int(m.sum()) for m in masks)])
            per_row = cfg.loss_type in losses.PER_ROW_LOSSES
            shares = [len(adv) / max(total_rows, 1) if per_row else int(m.sum()) / max(total_tokens, 1)
                      for (_, adv), m in zip(chunks, masks)]
            old, weights, refs = [None] * len(chunks), [None] * len(chunks), [None] * len(chunks)
            mismatch = {"tokens": 0.0, "k3": 0.0, "rho": 0.0, "past_cap": 0.0, "rows": 0.0, "rows_past_cap": 0.0}
            rho_max = 0.0
            first: dict = {}
            clipped = [0.0, 0.0]  # clipped tokens, tokens (iterations after the first)
            temperature = cfg.temperature if cfg.score_at_sampling_temperature else 1.0
            options = losses.loss_options(cfg)  # the clip, TRL's GRPO options (issue 33)
            need_entropy = losses.needs_entropy(options)  # else never computed
            extra = {"entropy": 0.0, "masked_rows": 0.0}  # the first iteration's, over the chunks
            for iteration in range(cfg.num_iterations):
                opt.zero_grad(set_to_none=True)
                loss_sum, kl_sum = 0.0, 0.0
                for c, ((sub, adv), mask, share) in enumerate(zip(chunks, masks, shares)):
                    got = completion_logprobs(model, sub, temperature, entropy=need_entropy,  # at the sampling temp.
                                              share_prompts=cfg.share_prompts)
                    logp, entropy = got if need_entropy else (got, None)  # (R, T) each
                    if iteration == 0:  # before any step on this batch: the policy that sampled, as trained
                        # (with LoRA dropout, a forward without it: the sampler drew without dropout)
                        old[c] = (self._eval_logprobs(model, sub, temperature, cfg.share_prompts) if cfg.lora_dropout
                                  else logp.detach())
                        weights[c], sums = losses.rollout_weights(old[c], sub.sampler_logprobs, sub.completion_mask,
                                                                  self.correction, cfg.rollout_is_cap)
                        for key in mismatch:
                            mismatch[key] += sums[key]
                        rho_max = max(rho_max, sums["rho_max"])
                        if cfg.beta > 0:
                            with model.disable_adapter():
                                refs[c] = self._eval_logprobs(model, sub, temperature, cfg.share_prompts)
                    loss, st = losses.policy_loss(
                        logp, mask, adv, cfg.loss_type, refs[c], cfg.beta,
                        weights=None if self.correction == "none" else weights[c],
                        old_logp=old[c] if cfg.num_iterations > 1 else None,
                        sampler_logp=sub.sampler_logprobs, entropy=entropy, **options,
                        # the bonus: the step's token mean, whatever the micro-batches (share x loss adds up)
                        entropy_norm=total_tokens * share if options["top_entropy_quantile"] == 1 else None)
                    (loss * share).backward()  # the sum over chunks is the loss over all rows (or tokens)
                    if iteration == 0:
                        extra["entropy"] += st.get("entropy", 0.0) * int(mask.sum()) / max(total_tokens, 1)
                        extra["masked_rows"] += st.get("masked_rows", 0.0)
                    loss_sum += float(loss.detach()) * share
                    kl_sum += st.get("kl", 0.0) * share
                    clipped[0] += st.get("clipped", 0.0) if iteration else 0.0
                    clipped[1] += st.get("tokens", 0.0) if iteration else 0.0
                self.algorithm.backward_into_actor(self, adapter, iteration)  # IAC's value heads on the actors
                norm = self._step(adapter, opt, total_rows)
                if iteration == 0:
                    first = {"loss": loss_sum, "kl": kl_sum, "norm": norm}
            self.schedulers[adapter].step()  # the schedule counts training steps, not iterations
            model.eval()
            if self.dist.world > 1:
                first["loss"], first["kl"], clipped[0], clipped[1], *sums = self.dist.sum(
                    [first["loss"], first["kl"], *clipped, *mismatch.values()])
                mismatch = dict(zip(mismatch, sums))
                extra = dict(zip(extra, self.dist.sum(list(extra.values()))))
                rho_max = max(self.dist.gather(rho_max))
            stats.update(losses.adapter_stats(adapter, first, clipped, extra, mismatch, rho_max, total_rows,
                                              beta=cfg.beta, num_iterations=cfg.num_iterations,
                                              entropy=need_entropy,
                                              off_policy_mask=cfg.off_policy_mask_threshold is not None))
        return stats

    def train_mode(self, adapter: str):
        """The adapter's agents, its model switched to it in train mode, and its optimizer: an update's preamble."""
        agents = self.team.agents_of_adapter(adapter)
        model = self.team.model_of(agents[0])
        model.set_adapter(adapter)
        model.train()
        return agents, model, self.optimizers[adapter]

    @staticmethod
    @torch.no_grad()
    def _eval_logprobs(model, seg, temperature: float, share_prompts: bool = True) -> torch.Tensor:
        """Log-probs without dropout (eval mode), as the sampler saw the policy: the old and reference log-probs."""
        model.eval()
        try:
            return completion_logprobs(model, seg, temperature, share_prompts=share_prompts)
        finally:
            model.train()

    def _step(self, adapter: str, opt, total_rows: int) -> float:
        """Sum the gradient over processes, clip it, step the adapter's optimizer; the gradient norm."""
        return self.step_parameters(self.team.parameters_of(adapter), opt, total_rows)

    def step_parameters(self, params: list, opt, total_rows: int) -> float:
        """`_step` for any parameters (an algorithm's critic too); the gradient norm."""
        # No rows on any process (a game's player who never acted): every grad stays None and opt.step() leaves
        # the adapter alone, as with one process; zeros would still move it (AdamW's momentum, weight decay).
        if self.dist.world > 1 and total_rows > 0:  # the global loss's gradient: the sum of every process's part
            for q in params:
                if q.grad is None:  # this process has none of the rows: its part is zero
                    q.grad = torch.zeros_like(q)
            self.dist.sum_([q.grad for q in params])
        clip = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        return float(norm)

    def loss_mask(self, seg) -> torch.Tensor:
        """The tokens that enter the loss: the completion's, without truncated completions when
        `mask_truncated_completions` (a completion cut at max_new_tokens has no EOS)."""
        if self.cfg.mask_truncated_completions:
            return seg.completion_mask * seg.finished[:, None].to(seg.completion_mask.dtype)
        return seg.completion_mask

    def _chunks(self, agents: list[int], levels: list[Level]) -> list[tuple]:
        """The rows of `agents` (one adapter's) over all levels, as (segment, advantages, lo, hi) micro-batches."""
        team, chunks = self.team, []
        for level in levels:
            seg = level.rollout.segment(team.base_of[agents[0]])
            seg = seg.rows(agents) if seg is not None else None
            if seg is None or not len(seg.sample):
                continue  # none of this adapter's agents acted here (a game's turn of another player)
            adv = torch.tensor(level.advantages.reshape(-1)[seg.sample.cpu().numpy()], device=seg.input_ids.device)
            step = self.cfg.micro_batch_size or len(adv)
            chunks += [(seg, adv, i, min(i + step, len(adv))) for i in range(0, len(adv), step)]
        return chunks

    # ---- evaluation

    @torch.no_grad()
    def evaluate(self, items: list[dict] | None = None) -> dict:
        """Greedy joint output per held-out item (through every turn); mean reward and parts, under `eval/`
        (kit.analysis.evaluate.greedy_eval, with the run's own reward model, as `python -m kit eval` scores)."""
        from kit.analysis.evaluate import greedy_eval

        return greedy_eval(self.sampler, self.task, self.eval_items if items is None else items, self.scorer,
                           self.cfg.num_turns)

    # ---- logging

    def metrics(self, levels: list[Level], update_stats: dict, times: dict) -> dict:
        """The step's metrics row, over every process's share of the batch."""
        mine = {"rewards": [[(r.total, r.parts) for node in lv.rewards for r in node] for lv in levels],
                "returns": levels[0].returns.ravel().tolist(),
                "advantages": [(float(np.abs(lv.advantages).sum()), int(lv.advantages.size)) for lv in levels],
                "ties": [lv.ties.sum(0).tolist() for lv in levels if lv.ties is not None],  # per agent
                "groups": sum(lv.ties.shape[0] for lv in levels if lv.ties is not None),
                "logged": [r.details["logged"] for lv in levels for node in lv.rewards for r in node
                           if (r.details or {}).get("logged")],
                "tokens": sum(lv.rollout.num_tokens for lv in levels)}
        every = self.dist.gather(mine)
        per_level = [[r for part in every for r in part["rewards"][t]] for t in range(len(levels))]
        rewards = [r for level in per_level for r in level]
        totals = np.array([total for total, _ in rewards])
        row = {"step": self.step, "reward/mean": float(totals.mean()), "reward/std": float(totals.std())}
        for key in sorted({k for _, parts in rewards for k in parts}):
            row[f"reward/{key}"] = float(np.mean([parts.get(key, 0.0) for _, parts in rewards]))
        if len(levels) > 1:
            for lv, level in zip(levels, per_level):
                row[f"reward/turn_{lv.turn}"] = float(np.mean([total for total, _ in level]))
        row["return/mean"] = float(np.mean([x for part in every for x in part["returns"]]))
        row["advantage/abs_mean"] = float(np.mean([sum(part["advantages"][t][0] for part in every) /
                                                   sum(part["advantages"][t][1] for part in every)
                                                   for t in range(len(levels))]))
        groups = sum(part["groups"] for part in every)
        for a in range(self.cfg.num_agents if groups else 0):  # a share near 1: nothing left to learn from
            ties = sum(t[a] for part in every for t in part["ties"])
            row[f"advantage/zero_groups/agent_{a}"] = ties / groups
        logged = [d for part in every for d in part["logged"]]
        for name in sorted({k for d in logged for k in d}):  # log_metric's values: the mean of those logged
            row[f"reward_log/{name}"] = float(np.mean([d[name] for d in logged if name in d]))
        return self.finish_row(row, update_stats, times, sum(part["tokens"] for part in every))

    def finish_row(self, row: dict, update_stats: dict, times: dict, tokens: int) -> dict:
        """The part of a metrics row every loop shares: the update's stats and learning rate, the tokens and
        their rate (all processes' tokens over this one's generate time), and the step's timings."""
        row.update(update_stats)  # with "lr", the rate the step used (every adapter has the same schedule)
        row["completion/tokens"] = tokens
        row["perf/tokens_per_s"] = tokens / max(times["generate"], 1e-9)
        for k, v in times.items():
            row[f"perf/{k}_s"] = v
        return row

    def rollout_rows(self, levels: list[Level], items: list[dict]) -> list[dict]:
        """Every joint action of the step, gathered from all processes in the order one process logs them."""
        rows = []
        for lv in levels:
            for n, node in enumerate(lv.nodes):
                for j, idx in enumerate(lv.joints):
                    r = lv.rewards[n][j]
                    rows.append({"step": self.step, "item": items[node["item"]]["id"], "turn": lv.turn,
                                 "node": node["id"], "parent": node["parent_id"], "joint": list(idx),
                                 "prompts": node["prompts"], "completions": list(self.joint(lv.rollout, n, idx)),
                                 "reward": r.total, "parts": r.parts, "return": float(lv.returns[n, j]),
                                 "advantages": [float(lv.advantages[n, a, g]) for a, g in enumerate(idx)],
                                 "_order": (lv.turn, node["id"], j)})
                    if getattr(lv.rollout, "transcripts", None) is not None:  # an environment's: calls, results
                        rows[-1]["transcripts"] = [lv.rollout.transcripts[n * self.cfg.num_agents + a][g]
                                                   for a, g in enumerate(idx)]
                        if getattr(lv.rollout, "reset_texts", None) is not None:  # what reset added to prompts
                            rows[-1]["reset"] = lv.rollout.reset_texts[n][idx[0]]
                    if (r.details or {}).get("violation"):  # what the program tried, beside the 0/1 part
                        rows[-1]["violation"] = r.details["violation"]
                    if (r.details or {}).get("logged"):  # what the reward functions logged (log_metric)
                        rows[-1]["logged"] = r.details["logged"]
        return self.in_order(rows)

    def in_order(self, rows: list[dict]) -> list[dict]:
        """Log rows from every process, in the order one process would write them (their `_order` key, dropped)."""
        if self.dist.world > 1:
            rows = sorted((r for part in self.dist.gather(rows) for r in part), key=lambda r: r["_order"])
        for r in rows:
            del r["_order"]
        return rows

    def _wandb(self, row: dict) -> None:
        if not self.use_wandb or not self.dist.is_main:
            return
        if self.wandb is None:
            try:
                import wandb
            except ImportError:
                self.log("[kit] use_wandb=true but wandb is not installed: logging to files only")
                self.use_wandb = False
                return
            self.wandb = wandb.init(project=self.cfg.wandb_project, config=config_mod.to_dict(self.cfg),
                                    name=self.run_dir.name, resume="allow")
        self.wandb.log(row, step=row["step"])

    # ---- the loop

    def train(self, max_steps: int | None = None, on_step=None) -> dict:
        """Run until num_steps (or `max_steps` more steps, e.g. to simulate a disconnect). Returns a summary.
        `on_step(row)` is called with each step's metrics (a notebook redraws its live curve with it)."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        if self._torn_step is not None:
            self._back_to_checkpoint()
        if self.step >= cfg.num_steps:  # e.g. the training cell run again after the end
            self.log(complete_line(self.step, cfg.num_steps, self.mirror is not None and self.drive_lacks()))
            return self.summary()
        end = cfg.num_steps if max_steps is None else min(cfg.num_steps, self.step + max_steps)
        if self.step == 0 and cfg.eval_every and self.eval_items and self.dist.is_main and not self._logged(0):
            self.log(f"[kit] step 0: the untrained team on {len(self.eval_items)} held-out items (greedy) before "
                     "training")  # a real model on a CPU takes minutes here: said before, not after
            self._append("metrics.jsonl", [{"step": 0, **self.evaluate()}])
        # the bar starts after the step-0 evaluation: its time per step is the steps' alone
        bar = tqdm(total=cfg.num_steps, initial=self.step, desc=cfg.algorithm.upper(),
                   disable=not (cfg.progress and self.dist.is_main))
        while self.step < end:
            t0 = time.perf_counter()
            items = self.batch_items(self.step)
            positions = self.dist.share(len(items))  # this process's items (all of them with one process)
            items = [items[k] for k in positions]
            seed_everything(step_seed(cfg.seed, self.step))
            levels = self.sample(items, positions)
            t1 = time.perf_counter()
            self._torn_step = self.step  # until the step is logged and saved (see _back_to_checkpoint)
            stats = self.update(levels)
            stats.update(self.algorithm.fit(self))  # the algorithm's own models (critics), after the actors
            t2 = time.perf_counter()
            rollouts = self.rollout_rows(levels, items) if cfg.log_rollouts else []
            self.step += 1
            generate_s = sum(lv.rollout.seconds for lv in levels)
            compile_s = sum(lv.rollout.compile_seconds for lv in levels)  # > 0 only when a new shape compiled
            times = {"sample": t1 - t0, "generate": generate_s, "compile": compile_s}
            if cfg.environment:  # time inside the environment's tools, apart from generation
                times["tool"] = sum(getattr(lv.rollout, "tool_seconds", 0.0) for lv in levels)
            row = self.metrics(levels, stats, {**times, "update": t2 - t1, "step": time.perf_counter() - t0})
            if cfg.environment:
                row["tools/calls_per_completion"] = sum(lv.rollout.tool_calls for lv in levels) / max(
                    1, sum(len(lv.rollout.texts) * len(lv.rollout.texts[0]) for lv in levels))
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.num_steps) \
                    and self.dist.is_main:  # held-out check on the main process (the others go on), and at the end
                row.update(self.evaluate_between_steps(bar))
            for r in rollouts:
                r["step"] = self.step
            with rundir.interrupt_deferred():  # a stop (Ctrl-C, Colab's stop) waits until the step is logged whole
                self._append("metrics.jsonl", [row])
                self._append("rollouts.jsonl", rollouts)
            self._wandb(row)
            bar.set_postfix(reward=f"{row['reward/mean']:.3f}", refresh=False)
            bar.update(1)
            if ((cfg.save_every and self.step % cfg.save_every == 0) or self.step == cfg.num_steps) \
                    and self.dist.is_main:
                self.save()
                if self.mirror is not None:
                    self.mirror.push()  # copied in the background; the next step starts now
            self._torn_step = None  # logged and (when due) saved: a stop from here on loses nothing
            if self.mirror is not None:
                self.mirror.check()  # a failed copy is said in this cell as soon as it is known, not at the end
            if on_step is not None:
                on_step(row)
        bar.close()
        if self.dist.is_main:  # versions, GPU and peak memory, for the report (kit/analysis/runinfo.py)
            from kit.analysis.runinfo import record_environment

            record_environment(self.run_dir, self.team.precision)
        self.dist.barrier()  # the main process has written the last step before anyone reads the summary
        return self.summary()

    def evaluate_between_steps(self, bar) -> dict:
        """The held-out check during training, said as its own phase (the bar says it is evaluating; a line says how
        long it took) and kept out of the bar's time per step: its seconds are added to the bar's clocks."""
        bar.set_postfix_str(f"held-out evaluation at step {self.step} ({len(self.eval_items)} items)", refresh=True)
        from kit.analysis.progress import decoding_bar

        t0 = time.perf_counter()
        with decoding_bar() if not getattr(bar, "disable", False) else contextlib.nullcontext():  # a live bar
            out = self.evaluate()
        took = time.perf_counter() - t0
        if not getattr(bar, "disable", False):  # a disabled bar (progress=false) keeps no clocks
            bar.start_t += took  # tqdm's rate and remaining time: steps over the time not spent evaluating
            bar.last_print_t = getattr(bar, "last_print_t", bar.start_t) + took
        if took > 30:  # a real model on a CPU: minutes; the tiny model: milliseconds, not worth a line
            self.log(f"[kit] held-out evaluation at step {self.step}: {took / 60:.1f} minutes (not counted in the "
                     "bar's time per step)")
        return out

    def save(self) -> Path:
        state = {"data": {"seed": self.cfg.seed, "num_items": len(self.train_items),
                          "items_seen": self.step * self.cfg.batch_size},
                 "update": {"rollout_correction": self.correction}}
        if self.role_baseline is not None:
            state["advantage"] = {"role_baseline": [[None if np.isnan(b) else float(b) for b in row]
                                                    for row in self.role_baseline]}
        return checkpoint.save(self.run_dir, self.step, self.team, *self.all_optimizers(), state,
                               self.cfg.keep_last, self.cfg.keep_history, models=self.algorithm.models,
                               files=self.checkpoint_files())

    def checkpoint_files(self) -> dict:
        """More state for the checkpoint, by file name (MADPO's pair buffer: kit/trainers/preference_trainer.py)."""
        return {}

    def all_optimizers(self) -> tuple[dict, dict]:
        """The agents' optimizers and schedulers with the algorithm's (its critics'), as the checkpoint holds them."""
        return {**self.optimizers, **self.algorithm.optimizers}, {**self.schedulers, **self.algorithm.schedulers}

    def summary(self) -> dict:
        """Reward at the start and end of the whole run (read back from metrics.jsonl, so resumes count)."""
        rows = rundir.read_jsonl(self.run_dir / rundir.METRICS)
        from kit.analysis.runinfo import final_train_reward

        train = [r["reward/mean"] for r in rows if "reward/mean" in r]
        evals = [r for r in rows if "eval/reward_mean" in r]
        end, k = final_train_reward([{"reward/mean": v} for v in train]) or (None, 1)  # the report's, the curve's
        ckpts = checkpoint.complete_checkpoints(self.run_dir)
        return {"steps": self.step, "reward_start": float(np.mean(train[:k])) if train else None,
                "reward_end": end, "reward_window": k,
                "eval_start": evals[0]["eval/reward_mean"] if evals else None,
                "eval_end": evals[-1]["eval/reward_mean"] if evals else None,
                "checkpoint": str(ckpts[0]) if ckpts else None, "run_dir": str(self.run_dir)}

    def drive_lacks(self) -> bool:
        """Whether Drive's copy of the run lacks this runtime's newest checkpoint or logs. Drive unmounted (01's last
        cell flushed it): False, nothing can be copied there and the flush said how to mount it again; an unreadable
        Drive: True, and the copy that follows says why."""
        from kit.env import unmounted_drive
        from kit.run.mirror import behind

        if unmounted_drive(self.mirror.mirror_dir):
            return False
        try:
            return behind(self.run_dir, self.mirror.mirror_dir) is not None
        except OSError:
            return True

    def close(self):
        """Stop the reward workers and make the last Drive copy. Closing again (the training cell run again) makes
        one more copy of anything Drive lacks and waits for it: a Drive that dropped and came back catches up."""
        again, self._closed = self._closed, True
        if not again:
            self.scorer.close()
            if getattr(self.sampler, "host", None) is not None:  # the environment's child process
                self.sampler.host.close()
            if self.wandb is not None:
                self.wandb.finish()
        if self.mirror is not None and (not again or self.drive_lacks()):
            self.mirror.push()  # files written since the last checkpoint (figures, late log lines) reach Drive too
            self.mirror.close()  # waits for the last copy; a failed one is said, never raised (the run is done)


def complete_line(step: int, num_steps: int, mirrored: bool) -> str:
    """What the training cell says when there is nothing left to train, and which cells train more."""
    more = ("To train longer: raise NUM_STEPS in 01's parameters cell, then run the config cell, the resume cell "
            "and this cell (CLI: `kit train --run-dir D --resume --set num_steps=N`)")
    drive = " The Drive copy is brought up to date now." if mirrored else ""
    if step > num_steps:
        return (f"[kit] this run has already trained {step} steps, more than num_steps={num_steps}: nothing to "
                f"train, and its checkpoints stay as they are (an earlier step is evaluated with `kit eval --steps "
                f"...`).{drive} {more} above {step}")
    return f"[kit] the run is complete ({step} of {num_steps} steps): nothing to train.{drive} {more}"
