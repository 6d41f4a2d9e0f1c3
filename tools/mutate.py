"""Mutation testing: would the tests catch a small plausible bug? Each mutation is one edit (file, old, new) and the
tests that must fail with it. Every edit is made in a copy of the repository, never in the working tree.

    python tools/mutate.py                    # all of them, one after another (6 minutes on 2 idle cores)
    python tools/mutate.py kl scale_rewards   # those whose name contains a word
    python tools/mutate.py --list             # names and the tests each runs

For each mutation: copy the tracked and untracked (not ignored) files of the working tree once into a temporary
folder, apply the edit there, run `python -m pytest -x -q <its tests>` there with a timeout, restore the file, and
print one table row: caught (a test failed), SURVIVED (all passed) or an error (pytest could not run: a wrong test
id, a timeout). A survivor is a test to fix, unless its `equivalent` field says why the edit changes nothing.

Every `old` must occur exactly once in its file, or the script stops before running anything;
tests/test_mutations.py checks the same on the current tree, so the list follows the code as it moves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    old: str  # occurs exactly once in `file`
    new: str
    tests: tuple[str, ...]  # pytest node ids, relative to the root; at least one must fail
    equivalent: str = ""  # why the edit changes no behaviour the tests could see (then it may survive)


CFG_MATHS = "tests/test_config_reaches_maths.py"

MUTATIONS = [
    # ---- the injected bugs of issue 21 that the suite did not catch
    Mutation("trainer ignores scale_rewards", "kit/trainer.py",
             "cfg.advantage_mode, cfg.scale_rewards,", "cfg.advantage_mode, False,",
             (f"{CFG_MATHS}::test_advantage_fields",)),
    Mutation("advantages skip the std division", "kit/magrpo.py",
             "a = a / (r.std(-1, keepdims=True) + eps)", "a = a / (1.0 + eps)",
             ("tests/test_magrpo.py::test_std_scaling_divides_by_population_std",)),
    Mutation("trainer ignores advantage_mode", "kit/trainer.py",
             "magrpo.advantages(per_agent, cfg.advantage_mode,", "magrpo.advantages(per_agent, \"mean\",",
             (f"{CFG_MATHS}::test_advantage_fields",)),
    Mutation("trainer ignores advantage_clip", "kit/trainer.py",
             "cfg.scale_rewards, cfg.advantage_clip,\n", "cfg.scale_rewards, None,\n",
             (f"{CFG_MATHS}::test_advantage_fields",)),
    Mutation("multi-turn discount ignored", "kit/trainer.py",
             "magrpo.node_returns(r, kids, cfg.discount)", "magrpo.node_returns(r, kids)",
             (f"{CFG_MATHS}::test_advantage_fields",)),
    Mutation("LR scheduler never stepped", "kit/trainer.py",
             "            self.schedulers[adapter].step()  # the schedule counts training steps, not iterations\n", "",
             ("tests/test_trainer.py::test_every_schedule_warms_up_and_the_logged_lr_is_the_one_each_step_used",)),
    Mutation("resume without the scheduler state", "kit/checkpoint.py",
             "        schedulers[adapter].load_state_dict(optim[adapter][\"scheduler\"])\n", "",
             ("tests/test_trainer.py::test_resume_is_exact",)),
    Mutation("KL reference with the adapter on", "kit/trainer.py",
             "                            with model.disable_adapter():\n",
             "                            with torch.no_grad():\n",
             (f"{CFG_MATHS}::test_loss_fields",)),
    Mutation("token_mean loss with a per-row KL sum", "kit/magrpo.py",
             "kl = reduce(k3, mask, loss_type, max_tokens)",
             "kl = k3.sum(-1).mean()",
             ("tests/test_magrpo.py::test_token_mean_kl_is_per_completion_token_like_its_loss",
              f"{CFG_MATHS}::test_loss_fields")),
    Mutation("the run's seed never reaches the sample seeds", "kit/rollout.py",
             "return cls(team, SamplingParams.from_config(cfg), cfg.seed)",
             "return cls(team, SamplingParams.from_config(cfg))",
             (f"{CFG_MATHS}::test_the_row_seeds_come_from_the_runs_seed_the_step_and_the_items_place_in_the_batch",)),
    Mutation("top-p applied before top-k", "kit/sampling.py",
             "([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])",
             "([TopPLogitsWarper(top_p)] if top_p < 1.0 else []) + ([TopKLogitsWarper(top_k)] if top_k > 0 else [])",
             (f"{CFG_MATHS}::test_top_k_cuts_before_top_p",)),
    Mutation("game baseline over the whole batch", "kit/game_trainer.py",
             ".reshape(len(items), 1, G)", ".reshape(1, 1, len(items) * G)",
             ("tests/test_games.py::test_the_baseline_of_a_game_episode_is_its_own_deals",)),
    Mutation("game seed keys by the process-local deal index", "kit/game_trainer.py",
             "keys = [(\"game\", self.step, p) for p in positions]",
             "keys = [(\"game\", self.step, i) for i in range(len(positions))]",
             ("tests/test_games.py::test_a_share_of_the_deals_plays_the_episodes_they_play_in_the_whole_batch",)),
    # ---- the other findings of issue 21, undone
    Mutation("constant schedule ignores warm-up", "kit/trainer.py",
             "name = \"constant_with_warmup\" if cfg.lr_scheduler == \"constant\" else cfg.lr_scheduler",
             "name = cfg.lr_scheduler", (f"{CFG_MATHS}::test_schedule_fields",)),
    Mutation("every saved CUDA RNG state restored", "kit/checkpoint.py",
             "torch.cuda.set_rng_state_all(state[\"cuda\"][:torch.cuda.device_count()])",
             "torch.cuda.set_rng_state_all(state[\"cuda\"])",
             ("tests/test_trainer.py::test_rng_states_saved_on_two_gpus_restore_on_fewer",
              "tests/test_trainer.py::test_a_run_saved_on_two_gpus_resumes_on_one_at_its_checkpoint")),
    Mutation("a damaged RNG state fails the checkpoint", "kit/checkpoint.py",
             "    except Exception as err:\n        warnings.warn(f\"RNG state",
             "    except OSError as err:\n        warnings.warn(f\"RNG state",
             ("tests/test_trainer.py::test_a_damaged_rng_state_never_costs_the_checkpoint",)),
    Mutation("illegal-move fallback from the chance RNG", "kit/tasks/game.py",
             "action = int(fallback.choice(self.legal(ep)))", "action = int(ep.rng.choice(self.legal(ep)))",
             ("tests/test_games.py::test_the_illegal_move_fallback_leaves_the_deals_chance_outcomes_shared",)),
    Mutation("zero gradients for an adapter with no rows anywhere", "kit/trainer.py",
             "if self.dist.world > 1 and total_rows > 0:", "if self.dist.world > 1:",
             ("tests/test_distributed.py::test_an_adapter_with_no_rows_on_any_process_does_not_move",)),
    Mutation("game rollouts logged in deal-seed order", "kit/game_trainer.py",
             "\"_order\": (self.positions[e // G], e % G)", "\"_order\": (items[e // G][\"seed\"], e % G)",
             ("tests/test_distributed.py::test_a_game_on_two_processes_equals_one_process",)),
    # ---- more plausible slips
    Mutation("rloo divides by G", "kit/magrpo.py",
             "a = r - (r.sum(-1, keepdims=True) - r) / (g - 1)", "a = r - (r.sum(-1, keepdims=True) - r) / g",
             ("tests/test_magrpo.py::test_rloo_advantage_leaves_one_out",)),
    Mutation("cross returns summed over partners", "kit/magrpo.py",
             "    return out / count\n", "    return out\n",
             ("tests/test_magrpo.py::test_cross_per_agent_return_is_the_mean_over_partners",)),
    Mutation("children's returns summed", "kit/magrpo.py",
             "future = np.array([np.mean(c, axis=0) for c in child_returns]",
             "future = np.array([np.sum(c, axis=0) for c in child_returns]",
             ("tests/test_magrpo.py::test_multi_turn_return_adds_the_mean_of_the_children",)),
    Mutation("policy gradient sign flipped", "kit/magrpo.py",
             "per_token = -adv * logp", "per_token = adv * logp",
             ("tests/test_magrpo.py::test_sum_loss_on_a_hand_made_batch",)),
    Mutation("padding enters the sum loss", "kit/magrpo.py",
             "return masked.sum(-1).mean()", "return per_token.sum(-1).mean()",
             ("tests/test_magrpo.py::test_sum_loss_on_a_hand_made_batch",)),
    Mutation("KL estimator with the log-ratio reversed", "kit/magrpo.py",
             "diff = ref_logp - logp", "diff = logp - ref_logp",
             ("tests/test_magrpo.py::test_kl_is_zero_when_policy_equals_reference_and_positive_otherwise",
              f"{CFG_MATHS}::test_loss_fields")),
    Mutation("micro-batches weighted as whole batches", "kit/trainer.py",
             "shares = [len(adv) / max(total_rows, 1) if per_row",
             "shares = [1.0 if per_row",
             ("tests/test_trainer.py::test_a_micro_batched_update_equals_the_one_batch_update",)),
    Mutation("gradients never clipped", "kit/trainer.py",
             "clip = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf", "clip = math.inf",
             (f"{CFG_MATHS}::test_max_grad_norm_clips_what_the_optimizer_receives",)),
    Mutation("weight_decay left at AdamW's default", "kit/trainer.py",
             "lr=cfg.learning_rate,\n                                    weight_decay=cfg.weight_decay)",
             "lr=cfg.learning_rate)",
             (f"{CFG_MATHS}::test_learning_rate_and_weight_decay_make_the_first_adamw_step",)),
    Mutation("learning_rate not passed to AdamW", "kit/trainer.py",
             "opt = torch.optim.AdamW(team.parameters_of(adapter), lr=cfg.learning_rate,",
             "opt = torch.optim.AdamW(team.parameters_of(adapter), lr=3e-3,",
             (f"{CFG_MATHS}::test_learning_rate_and_weight_decay_make_the_first_adamw_step",)),
    Mutation("resume without the optimizer state", "kit/checkpoint.py",
             "        optimizers[adapter].load_state_dict(optim[adapter][\"optimizer\"])\n", "",
             ("tests/test_trainer.py::test_resume_is_exact",)),
    Mutation("the same data order every epoch", "kit/trainer.py",
             "np.random.default_rng([self.cfg.seed, epoch])", "np.random.default_rng([self.cfg.seed, 0])",
             ("tests/test_trainer.py::test_each_epoch_is_a_new_order_of_every_item",)),
    Mutation("sample seeds without the step", "kit/trainer.py",
             "keys = [(\"train\", self.step, positions[node[\"item\"]]",
             "keys = [(\"train\", 0, positions[node[\"item\"]]",
             (f"{CFG_MATHS}::test_the_row_seeds_come_from_the_runs_seed_the_step_and_the_items_place_in_the_batch",)),
    Mutation("sample seeds by the process-local item index", "kit/trainer.py",
             "keys = [(\"train\", self.step, positions[node[\"item\"]]",
             "keys = [(\"train\", self.step, node[\"item\"]",
             (f"{CFG_MATHS}::test_the_row_seeds_come_from_the_runs_seed_the_step_and_the_items_place_in_the_batch",)),
    Mutation("game trainer ignores the advantage fields", "kit/game_trainer.py",
             "adv = magrpo.advantages(returns, cfg.advantage_mode, cfg.scale_rewards, cfg.advantage_clip,\n"
             "                                batch_std=self.batch_std(returns))",
             "adv = magrpo.advantages(returns)",
             ("tests/test_games.py::test_the_baseline_of_a_game_episode_is_its_own_deals",)),
    Mutation("illegal moves cost nothing", "kit/tasks/game.py",
             "return self.game_score(ep) - self.illegal_penalty * ep.illegal", "return self.game_score(ep)",
             ("tests/test_games.py::test_parsing_a_move_by_number_or_by_its_text_and_illegal_output_is_data",)),
    Mutation("temperature never applied", "kit/sampling.py",
             "[TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []", "[]",
             ("tests/test_sampling.py::test_gumbel_max_samples_the_warped_distribution",)),
    Mutation("keep_last keeps one too many", "kit/checkpoint.py",
             "for p in complete_checkpoints(run_dir)[keep_last:]:",
             "for p in complete_checkpoints(run_dir)[keep_last + 1:]:",
             ("tests/test_trainer.py::test_keep_last_prunes_old_checkpoints",)),
    Mutation("a checkpoint without COMPLETE is loaded", "kit/checkpoint.py",
             "        if (p / \"COMPLETE\").exists():\n", "        if True:\n",
             ("tests/test_trainer.py::test_incomplete_and_corrupt_checkpoints_are_skipped",)),
    Mutation("every step reseeded alike", "kit/trainer.py",
             "seed_everything(step_seed(cfg.seed, self.step))", "seed_everything(step_seed(cfg.seed, 0))",
             (f"{CFG_MATHS}::test_every_step_reseeds_the_global_rngs_from_the_seed_and_the_step",)),
    Mutation("the RNG state of a checkpoint never restored", "kit/checkpoint.py",
             "    restore_rng(path / \"rng.pt\")\n", "",
             ("tests/test_trainer.py::test_resume_is_exact",),
             equivalent="every step reseeds python, numpy and torch from (seed, step) before it draws anything, "
                        "so the restored state is overwritten before use; the resume stays bitwise exact"),
    Mutation("resume keeps the log lines of lost steps", "kit/trainer.py",
             "                rundir.truncate_jsonl(self.run_dir / name, self.step)\n", "                pass\n",
             ("tests/test_trainer.py::test_resume_drops_log_lines_written_after_the_checkpoint",)),
    # an independent review's injected bugs (2026-11-23); the tests that catch the gaps it found are in
    # tests/test_injected_bugs.py
    Mutation('review: gumbel bits shifted by 31', 'kit/sampling.py',
             's = (bits >> 32).bitwise_or_(1)',
             's = (bits >> 31).bitwise_or_(1)',
             ('tests/test_sampling.py', 'tests/test_injected_bugs.py')),
    Mutation('review: log(1+s) instead of log1p(s)', 'kit/sampling.py',
             'log_u = torch.where(s > 0, s.log(), s.log1p())',
             'log_u = torch.where(s > 0, s.log(), (1 + s).log())',
             ('tests/test_sampling.py', 'tests/test_injected_bugs.py')),
    Mutation('review: temperature after top-k/top-p', 'kit/sampling.py',
             'self.warpers = ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \\\n            ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])',
             'self.warpers = ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []) + \\\n            ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else [])',
             ('tests/test_sampling.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: noise keyed on absolute length', 'kit/sampling.py',
             'input_ids.shape[1] - self.start, scores.shape[-1]',
             'input_ids.shape[1], scores.shape[-1]',
             ('tests/test_sampling.py', 'tests/test_compiled_engine.py', 'tests/test_injected_bugs.py')),
    Mutation('review: prompt keeps max_prompt_tokens+1', 'kit/rollout.py',
             'room = max_tokens - len(before) - len(after)\n',
             'room = max_tokens - len(before) - len(after) + 1\n',
             ('tests/test_models_rollout.py', 'tests/test_injected_bugs.py')),
    Mutation('review: left_pad attends to padding', 'kit/rollout.py',
             'mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)',
             'mask = torch.tensor([[1] * width for r in rows], device=device)',
             ('tests/test_models_rollout.py', 'tests/test_sampling.py', 'tests/test_compiled_engine.py', 'tests/test_injected_bugs.py')),
    Mutation('review: head-path logprobs unshifted', 'kit/rollout.py',
             'last_hidden_state[:, -T - 1:-1]',
             'last_hidden_state[:, -T:]',
             ('tests/test_models_rollout.py', 'tests/test_magrpo.py', 'tests/test_injected_bugs.py')),
    Mutation('review: fallback-path logits shifted', 'kit/rollout.py',
             'logits = out.logits[:, :-1]',
             'logits = out.logits[:, 1:]',
             ('tests/test_models_rollout.py', 'tests/test_magrpo.py', 'tests/test_injected_bugs.py')),
    Mutation('review: completion mask drops the EOS', 'kit/rollout.py',
             'seen_before = torch.cumsum(is_eos, dim=-1) - is_eos',
             'seen_before = torch.cumsum(is_eos, dim=-1)',
             ('tests/test_models_rollout.py', 'tests/test_sampling.py', 'tests/test_injected_bugs.py')),
    Mutation('review: position ids off by one', 'kit/rollout.py',
             'return (attention_mask.cumsum(-1) - 1).clamp(min=0)',
             'return attention_mask.cumsum(-1).clamp(min=0)',
             ('tests/test_models_rollout.py', 'tests/test_sampling.py', 'tests/test_compiled_engine.py', 'tests/test_injected_bugs.py')),
    Mutation('review: std over the whole batch', 'kit/magrpo.py',
             'a = a / (r.std(-1, keepdims=True) + eps)',
             'a = a / (r.std() + eps)',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: group size from the first axis', 'kit/magrpo.py',
             'g = r.shape[-1]',
             'g = r.shape[0]',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: clip before std scaling', 'kit/magrpo.py',
             "    scale = scale_mode(scale)\n    if scale == \"group\":",
             "    if clip is not None:\n        a = np.clip(a, -clip, clip)\n    scale = scale_mode(scale)\n    if scale == \"group\":",
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: KL penalty subtracted', 'kit/magrpo.py',
             'loss = loss + beta * kl',
             'loss = loss - beta * kl',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: KL over padding', 'kit/magrpo.py',
             'k3 = (torch.exp(diff) - diff - 1) * mask',
             'k3 = torch.exp(diff) - diff - 1',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py'),
             equivalent="reduce() masks every term with torch.where (since the review of issue 22), so the product "
                        "with the mask changes nothing; reduce's own masking is checked by "
                        "test_a_non_finite_term_off_the_mask_never_reaches_the_loss"),
    Mutation('review: token_mean chunks weighted by rows', 'kit/trainer.py',
             'else int(m.sum()) / max(total_tokens, 1)',
             'else len(adv) / max(total_rows, 1)',
             ('tests/test_trainer.py::test_a_micro_batched_update_equals_the_one_batch_update', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: grad accumulation divides twice', 'kit/trainer.py',
             '(loss * share).backward()',
             '(loss * share / len(chunks)).backward()',
             ('tests/test_trainer.py::test_a_micro_batched_update_equals_the_one_batch_update', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: scheduler stepped twice', 'kit/trainer.py',
             '            self.schedulers[adapter].step()  # the schedule counts training steps, not iterations\n',
             '            self.schedulers[adapter].step()  # the schedule counts training steps, not iterations\n'
             '            self.schedulers[adapter].step()\n',
             ('tests/test_trainer.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: agent seeds swapped', 'kit/trainer.py',
             'turn, *node["path"], a)\n',
             'turn, *node["path"], N - 1 - a)\n',
             ('tests/test_config_reaches_maths.py', 'tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: children returns transposed', 'kit/trainer.py',
             'child_returns[n * len(joints) + j]',
             'child_returns[j * len(level.rewards) + n]',
             ('tests/test_config_reaches_maths.py', 'tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: lr decay ends warmup_steps early', 'kit/trainer.py',
             'num_training_steps=cfg.num_steps)',
             'num_training_steps=cfg.num_steps - cfg.warmup_steps)',
             ('tests/test_config_reaches_maths.py', 'tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: logged lr read after the step', 'kit/trainer.py',
             '        stats = {"lr": self.optimizers[team.adapters[0]].param_groups[0]["lr"]}  # the rate this step uses\n',
             '        stats = {}\n',
             ('tests/test_config_reaches_maths.py', 'tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: resume from the oldest checkpoint', 'kit/checkpoint.py',
             'for _, p in sorted(found, reverse=True):',
             'for _, p in sorted(found):',
             ('tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: long prompt keeps only its end', 'kit/rollout.py',
             'content = content[:head] + content[-tail:]',
             'content = content[-room:]',
             ('tests/test_models_rollout.py', 'tests/test_injected_bugs.py')),
    Mutation("review: agents' advantages swapped", 'kit/trainer.py',
             'adv = torch.tensor(level.advantages.reshape(-1)[',
             'adv = torch.tensor(level.advantages[:, ::-1].reshape(-1)[',
             ('tests/test_config_reaches_maths.py', 'tests/test_trainer.py', 'tests/test_injected_bugs.py')),
    Mutation('review: token_mean as a per-row token mean', 'kit/magrpo.py',
             'if loss_type in ("token_mean", "dapo", "bnpo"):\n        return masked.sum() / mask.sum().clamp(min=1)',
             'if loss_type in ("token_mean", "dapo", "bnpo"):\n'
             '        return (masked / mask.sum(-1, keepdim=True).clamp(min=1)).sum() / len(mask)',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: discount on the current reward', 'kit/magrpo.py',
             'return rewards + discount * future',
             'return discount * rewards + future',
             ('tests/test_magrpo.py', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    Mutation('review: token count of the whole segment per chunk', 'kit/trainer.py',
             'sum(int(m.sum()) for m in masks)',
             'sum(int(m.numel()) for m in masks)',
             ('tests/test_trainer.py::test_a_micro_batched_update_equals_the_one_batch_update', 'tests/test_config_reaches_maths.py', 'tests/test_injected_bugs.py')),
    # issue 23: bad input, a hung judge, unreadable checkpoints
    Mutation("all checkpoints unreadable: a silent restart from step 0", "kit/checkpoint.py",
             "    if damaged:\n        raise DamagedCheckpoints(_all_damaged(run_dir, damaged, mirror_dir))\n    return None\n",
             "    return None\n", ("tests/test_damaged_run.py",)),
    Mutation("damaged checkpoints found only after the model loaded", "kit/trainer.py",
             "            checkpoint.check_resumable(self.run_dir, cfg.mirror_dir)\n", "",
             ("tests/test_damaged_run.py",)),
    Mutation("a dead process's reservations dropped uncharged", "kit/judge.py",
             "        self.spent += charged\n", "",
             ("tests/test_judge.py::test_a_process_killed_with_a_call_in_flight_is_charged_its_worst_case",)),
    Mutation("the judge's breaker never opens", "kit/judge.py",
             "opens = self._failures >= self.max_failures and now >= self._off_until",
             "opens = False",
             ("tests/test_judge.py::test_after_failures_in_a_row_the_judge_is_off_for_the_cooldown_with_one_line",)),
    Mutation("an unscored judge term enters the advantages as 0.0", "kit/rewards.py",
             "            if own.pop(\"unscored\", False):", "            if own.pop(\"unscored\", False) and False:",
             ("tests/test_judge_unscored.py::test_unscored_judge_terms_take_the_scored_mean_of_their_group",)),
    Mutation("inf passes the config's range checks", "kit/config.py",
             "raise ConfigError(f\"{name}={value!r} is not allowed; allowed: a finite number (not inf or nan)\")",
             "pass", ("tests/test_config.py::test_infinite_and_nan_floats_are_refused_by_name",)),
    # ---- issue 22: the sampler's log-probs, the correction, the GRPO family's options
    Mutation("update scores at temperature 1, not the sampling temperature", "kit/trainer.py",
             "logp = completion_logprobs(model, sub, temperature)", "logp = completion_logprobs(model, sub)",
             (f"{CFG_MATHS}::test_update_form_fields",)),
    Mutation("rollout correction weights never applied", "kit/trainer.py",
             "weights=None if self.correction == \"none\" else weights[c],", "weights=None,",
             (f"{CFG_MATHS}::test_rollout_correction_fields",)),
    Mutation("TIS without its cap", "kit/magrpo.py", "w = rho.clamp(max=cap)", "w = rho",
             ("tests/test_offpolicy.py::test_token_truncate_caps_each_ratio",)),
    Mutation("MIS keeps sequences past the cap", "kit/magrpo.py",
             "w = torch.where(seq <= cap, seq, 0.0)", "w = seq",
             ("tests/test_offpolicy.py::test_sequence_mask_weights_whole_sequences_and_drops_those_past_the_cap",)),
    Mutation("sampler log-prob read at the wrong token", "kit/sampling.py",
             "self.picked.append(self.last.gather(-1, input_ids[:, -1:])[:, 0])",
             "self.picked.append(self.last.gather(-1, input_ids[:, -2:-1])[:, 0])",
             ("tests/test_offpolicy.py::test_seeded_sampling_records_the_log_prob_of_each_emitted_token_after_"
              "temperature_and_top_k",)),
    Mutation("sampler log-probs before the warpers", "kit/sampling.py",
             "        scores = scores.float()\n        self.last = scores.log_softmax(-1)\n",
             "        scores = scores.float()\n        self.last = (scores * self.settings[0]).log_softmax(-1)\n",
             ("tests/test_offpolicy.py::test_seeded_sampling_records_the_log_prob_of_each_emitted_token_after_"
              "temperature_and_top_k",)),
    Mutation("clip-higher ignored", "kit/magrpo.py",
             "high = epsilon if epsilon_high is None else epsilon_high", "high = epsilon",
             ("tests/test_offpolicy.py::test_the_ratio_is_clipped_where_the_advantage_would_push_it_further",)),
    Mutation("MAReMax with the mean baseline", "kit/magrpo.py",
             "a = r - r.max(-1, keepdims=True)", "a = r - r.mean(-1, keepdims=True)",
             ("tests/test_offpolicy.py::test_max_baseline_is_the_groups_best_return",
              f"{CFG_MATHS}::test_advantage_fields")),
    Mutation("batch scaling by the group's std", "kit/magrpo.py",
             "a = a / ((r.std() if batch_std is None else batch_std) + eps)",
             "a = a / (r.std(-1, keepdims=True) + eps)",
             (f"{CFG_MATHS}::test_advantage_fields",)),
    Mutation("num_iterations ignored", "kit/trainer.py",
             "for iteration in range(cfg.num_iterations):", "for iteration in range(1):",
             ("tests/test_offpolicy.py::test_num_iterations_steps_the_optimizer_that_many_times_and_reports_clipping",)),
    Mutation("truncated completions never masked", "kit/trainer.py",
             "        if self.cfg.mask_truncated_completions:\n", "        if False:\n",
             ("tests/test_offpolicy.py::test_mask_truncated_completions_drops_rows_without_eos",
              f"{CFG_MATHS}::test_update_form_fields")),
    Mutation("grpo as the sum per row", "kit/magrpo.py",
             "return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()", "return masked.sum(-1).mean()",
             ("tests/test_offpolicy.py::test_each_loss_type_on_a_hand_made_batch", f"{CFG_MATHS}::test_loss_fields")),
    Mutation("old log-probs with LoRA dropout on", "kit/trainer.py",
             "old[c] = self._eval_logprobs(model, sub, temperature) if cfg.lora_dropout else logp.detach()",
             "old[c] = logp.detach()",
             ("tests/test_offpolicy.py::test_lora_dropout_turns_the_auto_correction_on_and_old_log_probs_skip_it",)),
    Mutation("old runs scored at the sampling temperature", "kit/trainer.py",
             "temperature = cfg.temperature if cfg.score_at_sampling_temperature else 1.0",
             "temperature = cfg.temperature",
             (f"{CFG_MATHS}::test_update_form_fields",)),
    Mutation("MIS by the product of the ratios", "kit/magrpo.py",
             "seq = (log_rho.sum(-1) / m.sum(-1).clamp(min=1)).exp()", "seq = log_rho.sum(-1).exp()",
             ("tests/test_offpolicy.py::test_sequence_mask_weights_whole_sequences_and_drops_those_past_the_cap",
              f"{CFG_MATHS}::test_rollout_correction_fields")),
    Mutation("auto correction never on", "kit/rollout.py",
             "        return \"token_truncate\"\n    return \"none\"", "        return \"none\"\n    return \"none\"",
             ("tests/test_offpolicy.py::test_auto_correction_switches_on_for_top_p",)),
    Mutation("completions past the cap counted as tokens", "kit/magrpo.py",
             '"rows_past_cap": float((rows & (seq > cap)).sum())', '"rows_past_cap": float((rho[m] > cap).sum())',
             ("tests/test_offpolicy.py::test_every_mode_counts_the_completions_past_the_cap",)),
    Mutation("the correction applied is not recorded", "kit/trainer.py",
             '"update": {"rollout_correction": self.correction}', '"update": {}',
             ("tests/test_offpolicy.py::test_a_resume_on_another_engine_says_from_which_step_the_correction_changes",)),
    Mutation("the KL term weighted by the rollout correction", "kit/magrpo.py",
             "k3 = (torch.exp(diff) - diff - 1) * mask  # (R, T), >= 0",
             "k3 = (torch.exp(diff) - diff - 1) * mask * (1 if weights is None else weights)",
             (f"{CFG_MATHS}::test_rollout_correction_fields",)),
    Mutation("the reference scored at temperature 1", "kit/trainer.py",
             "refs[c] = self._eval_logprobs(model, sub, temperature)", "refs[c] = self._eval_logprobs(model, sub, 1.0)",
             (f"{CFG_MATHS}::test_update_form_fields",)),
    Mutation("completions past the cap divided by tokens", "kit/trainer.py",
             'mismatch["rows_past_cap"] / max(mismatch["rows"], 1.0)', 'mismatch["rows_past_cap"] / n',
             (f"{CFG_MATHS}::test_rollout_correction_fields",)),
    Mutation("reduce masks by a product", "kit/magrpo.py",
             "masked = torch.where(mask.bool(), per_token, 0.0)", "masked = per_token * mask",
             ("tests/test_offpolicy.py::test_a_non_finite_term_off_the_mask_never_reaches_the_loss",)),
    Mutation("the tiny_cpu preset without its KL term", "kit/config.py",
             "top_p=0.9, beta=0.02,", "top_p=0.9, beta=0.0,",
             ("tests/test_trainer.py::test_tiny_cpu_learns_the_toy_task",)),
    # ---- issue 31: credit assignment without a critic, and the coordination suite
    Mutation("marginal accepts aligned joint actions", "kit/magrpo.py",
             "if sorted(joints) != joint_actions(num_agents, num_generations, \"cross\"):", "if False:",
             ("tests/test_credit.py::test_marginal_refuses_aligned_joint_actions",)),
    Mutation("marginal pools its baseline over the group", "kit/magrpo.py",
             "centred = (r[idx] - r[idx].mean(-1, keepdims=True))", "centred = (r[idx] - r[idx].mean())",
             ("tests/test_credit.py::test_grouped_advantages_pool_the_baseline_but_marginal_keeps_its_nodes",)),
    Mutation("trainer ignores grouping=turn", "kit/trainer.py",
             "if cfg.grouping == \"turn\":", "if False:",
             (f"{CFG_MATHS}::test_grouping_pools_an_agents_samples_over_nodes_and_turns",)),
    Mutation("role baseline never moves", "kit/magrpo.py",
             "return used, decay * used + (1 - decay) * m", "return used, used",
             ("tests/test_credit.py::test_role_baseline_starts_at_the_first_mean_then_moves_by_the_decay",)),
    Mutation("role baseline starts at 0", "kit/magrpo.py",
             "used = np.where(np.isnan(b), m, b)", "used = np.where(np.isnan(b), 0.0, b)",
             ("tests/test_credit.py::test_role_baseline_starts_at_the_first_mean_then_moves_by_the_decay",)),
    Mutation("trainer ignores role_baseline_decay", "kit/trainer.py",
             "cfg.role_baseline_decay)", "0.95)",
             (f"{CFG_MATHS}::test_role_advantage_subtracts_the_moving_baseline_then_moves_it",)),
    Mutation("game trainer ignores role_baseline_decay", "kit/game_trainer.py",
             "cfg.role_baseline_decay)", "0.95)",
             ("tests/test_coordination.py::test_a_game_decision_gets_its_return_minus_its_players_baseline",)),
    Mutation("role baseline not restored on resume", "kit/trainer.py",
             "self.role_baseline = None if saved is None else np.array(saved, dtype=np.float64)",
             "self.role_baseline = None",
             ("tests/test_coordination.py::test_the_role_baseline_is_checkpointed_and_a_resumed_run_continues_it_exactly",)),
    Mutation("local mix keeps all of the team reward", "kit/magrpo.py",
             "return (1 - weight) * team[:, None] + weight * local", "return team[:, None] + weight * local",
             ("tests/test_credit.py::test_team_and_local_rewards_mix_per_agent_and_flow_up_the_tree",)),
    Mutation("trainer ignores local_reward_weight", "kit/trainer.py",
             "w = cfg.local_reward_weight", "w = 0.0",
             (f"{CFG_MATHS}::test_local_reward_weight_mixes_each_agents_own_part",)),
    Mutation("cross games score the first move by one continuation", "kit/game_trainer.py",
             "first[np.array(r.episodes) // G] if r.index == 0 else later[r.episodes]", "later[r.episodes]",
             ("tests/test_coordination.py::test_cross_games_branch_the_first_move_and_score_it_by_its_continuations",)),
    Mutation("cross games do not share the first move", "kit/games.py",
             "e % G // (branch if t == 0 else 1)", "e % G",
             ("tests/test_coordination.py::test_cross_games_branch_the_first_move_and_score_it_by_its_continuations",)),
    Mutation("exact evaluator forgets the illegal-move penalty", "kit/coordination.py",
             "penalty = bad0.mean() + ", "penalty = 0.0 * bad0.mean() + 0.0 * ",
             ("tests/test_coordination.py::test_exact_eval_scores_a_greedy_team_over_every_deal",)),
    Mutation("marloo maps to mean", "kit/magrpo.py",
             "\"marloo\": \"rloo\"", "\"marloo\": \"mean\"",
             ("tests/test_credit.py::test_comlrl_names_are_presets_of_advantage_mode_and_resume_as_the_kits",)),
    # ---- issue 31 (critics and algorithms, branch i31b): the actor-critic maths, the critic wiring, heads
    Mutation("lambda-return without (1 - lam) on V", "kit/actor_critic.py",
             "return r + discount * ((1.0 - lam) * v + lam * y)", "return r + discount * (v + lam * y)",
             ("tests/test_actor_critic.py::test_lambda_returns_by_hand",)),
    Mutation("GAE without the discount in its trace", "kit/actor_critic.py",
             "running = delta + discount * lam * running", "running = delta + lam * running",
             ("tests/test_actor_critic.py::test_gae_by_hand",)),
    Mutation("counterfactual baseline over the partners' samples", "kit/actor_critic.py",
             "return own - q.mean(-1)", "return own - q.mean(-2)",
             ("tests/test_actor_critic.py::test_counterfactual_advantages_by_hand",)),
    Mutation("value loss never clipped", "kit/actor_critic.py",
             "return 0.5 * torch.maximum(plain, (clipped - targets) ** 2)", "return 0.5 * plain",
             ("tests/test_actor_critic.py::test_value_loss_by_hand",)),
    Mutation("explained variance over the std", "kit/actor_critic.py",
             "(y - v).var() / var)", "(y - v).std() / var)",
             ("tests/test_actor_critic.py::test_explained_variance_by_hand",)),
    Mutation("normalised advantages keep their scale", "kit/actor_critic.py",
             "return (a - mean) / (std + eps)", "return a - mean",
             ("tests/test_actor_critic.py::test_normalize_by_hand",)),
    Mutation("the loop ignores the algorithm's advantages", "kit/trainer.py",
             "        self.algorithm.advantages(self, levels)  # MAGRPO keeps",
             "        pass  # self.algorithm.advantages(self, levels)  # MAGRPO keeps",
             ("tests/test_critic.py::test_critic_fields_reach_the_advantages",)),
    Mutation("critic ignores gae_lambda", "kit/critic.py",
             "next_v, next_y, cfg.discount, cfg.gae_lambda)", "next_v, next_y, cfg.discount, 0.0)",
             ("tests/test_critic.py::test_critic_fields_reach_the_advantages",)),
    Mutation("critic ignores advantage_normalization", "kit/critic.py",
             "        if cfg.advantage_normalization:\n            self._normalize(",
             "        if False:\n            self._normalize(",
             ("tests/test_critic.py::test_critic_fields_reach_the_advantages",)),
    Mutation("MAAC-q ignores baseline=counterfactual", "kit/critic.py",
             'elif cfg.baseline == "counterfactual":', "elif False:",
             ("tests/test_critic.py::test_critic_fields_reach_the_advantages",)),
    Mutation("critic ignores value_loss_coef", "kit/critic.py",
             "loss = cfg.value_loss_coef * rows.sum()", "loss = rows.sum()",
             ("tests/test_critic.py::test_value_loss_coef_scales_the_logged_value_loss",)),
    Mutation("critic ignores value_clip_range", "kit/critic.py",
             "y_all[lo:lo + step], cfg.value_clip_range)", "y_all[lo:lo + step], None)",
             ("tests/test_critic.py::test_value_clip_range_reaches_the_value_loss",)),
    Mutation("critic ignores critic_learning_rate", "kit/critic.py",
             "lr = cfg.critic_learning_rate or cfg.learning_rate", "lr = cfg.learning_rate",
             ("tests/test_critic.py::test_critic_learning_rate_makes_the_first_adamw_step",)),
    Mutation("actors never wait for the critic", "kit/critic.py",
             "return step < self.cfg.critic_warmup_steps", "return False",
             ("tests/test_critic.py::test_critic_warmup_steps_keep_the_actors_still",)),
    Mutation("checkpoint forgets the extra models", "kit/checkpoint.py",
             "        model.save(tmp / \"models\")", "        pass",
             ("tests/test_heads.py::test_checkpoint_saves_and_loads_the_model_and_its_optimizer_bitwise",)),
    Mutation("scalar head reads the mask's count, not the last real token", "kit/heads.py",
             "return torch.where(attention_mask.bool(), positions, -1).max(-1).values",
             "return attention_mask.sum(-1) - 1",
             ("tests/test_heads.py::test_last_token_index_by_hand",)),
    Mutation("scalar model switches its own gradient off after the forward", "kit/heads.py",
             "            for p in self.adapter_parameters():\n                p.requires_grad_(True)\n",
             "",
             ("tests/test_heads.py::test_forward_reads_the_last_real_token_and_grads_reach_adapter_and_head_only",)),
    Mutation("games: the critic ignores gae_lambda", "kit/critic.py",
             "a = ac.gae(rewards, values[seq], cfg.discount, cfg.gae_lambda)",
             "a = ac.gae(rewards, values[seq], cfg.discount, 0.0)",
             ("tests/test_critic.py::test_game_advantages_by_hand",)),
    Mutation("games: MAAC over each player's own decisions", "kit/critic.py",
             'seqs = [order] if self.name == "maac" else', 'seqs = [order] if False else',
             ("tests/test_critic.py::test_game_advantages_by_hand",)),
    Mutation("centralized scores the unsplit completion", "kit/centralized.py",
             "return self.task.reward(item, self.split(item, completions))",
             "return self.task.reward(item, tuple(completions))",
             ("tests/test_centralized.py::test_the_wrapper_prompts_once_and_scores_the_split_parts",)),
    # issue 32: preferences (MADPO, MARLHF, judge pairs)
    Mutation("reward_gap takes the smallest gaps first", "kit/preference.py",
             "pairs.sort(key=lambda p: r[p[1]] - r[p[0]])", "pairs.sort(key=lambda p: r[p[0]] - r[p[1]])",
             ("tests/test_preference.py::test_reward_gap_puts_the_largest_gaps_first_and_equal_gaps_in_order",)),
    Mutation("ties become pairs", "kit/preference.py",
             "for l in range(len(r)) if r[w] > r[l]]", "for l in range(len(r)) if r[w] >= r[l] and w != l]",
             ("tests/test_preference.py::test_ties_are_never_pairs",)),
    Mutation("the sequence log-prob leaves out the last token (CoMLRL)", "kit/preference.py",
             "return torch.where(mask.bool(), token_logp, 0.0).sum(-1)",
             "return torch.where(mask.bool(), token_logp, 0.0)[:, :-1].sum(-1)",
             ("tests/test_preference.py::test_the_sequence_log_prob_sums_every_completion_token_the_last_included",)),
    Mutation("the other agents' Deltas not detached", "kit/preference.py",
             "return -F.logsigmoid(beta * (own_delta + others_delta.detach())).mean()",
             "return -F.logsigmoid(beta * (own_delta + others_delta)).mean()",
             ("tests/test_preference.py::test_madpo_loss_is_a_mean_over_pairs",)),
    Mutation("the reference added instead of subtracted", "kit/preference.py",
             "delta = delta - (ref_w.detach() - ref_l.detach())", "delta = delta + (ref_w.detach() - ref_l.detach())",
             ("tests/test_preference.py::test_the_reference_is_subtracted_and_none_leaves_it_out",
              "tests/test_preference_trainer.py::test_the_dpo_loss_and_its_fields")),
    Mutation("Bradley-Terry with the pair reversed", "kit/preference.py",
             "return -F.logsigmoid(score_w - score_l).mean()", "return -F.logsigmoid(score_l - score_w).mean()",
             ("tests/test_preference.py::test_bradley_terry_loss_and_gradient_by_hand",)),
    Mutation("judge verdicts in one order only", "kit/judge_pairs.py",
             "return first if first == -second else 0", "return first",
             ("tests/test_judge_pairs.py::test_both_orders_must_agree_else_a_tie",
              "tests/test_judge_pairs.py::test_a_judge_with_only_position_bias_gives_no_pairs")),
    Mutation("dpo_beta never reaches the loss", "kit/preference_trainer.py",
             "loss = preference.agent_dpo_loss(own, others, cfg.dpo_beta)",
             "loss = preference.agent_dpo_loss(own, others, 1.0)",
             ("tests/test_preference_trainer.py::test_the_dpo_loss_and_its_fields",)),
    Mutation("dpo_reference=none still subtracts the base", "kit/preference_trainer.py",
             'self.cfg.dpo_reference == "base")', "True)",
             ("tests/test_preference_trainer.py::test_the_dpo_loss_and_its_fields",)),
    Mutation("pair_selection ignored by the trainer", "kit/preference_trainer.py",
             "found = preference.select_pairs(level.returns[n], cfg.pair_selection,",
             'found = preference.select_pairs(level.returns[n], "reward_gap",',
             ("tests/test_preference_trainer.py::test_pair_fields_choose_the_buffers_pairs",)),
    Mutation("preference_num_candidates ignored (G instead)", "kit/preference_trainer.py",
             "cfg, N, K = self.cfg, self.cfg.num_agents, self.cfg.preference_num_candidates",
             "cfg, N, K = self.cfg, self.cfg.num_agents, self.cfg.num_generations",
             ("tests/test_preference_trainer.py::test_pair_fields_choose_the_buffers_pairs",)),
    Mutation("each micro-batch of pairs weighted as the whole", "kit/preference_trainer.py",
             "share = own.shape[0] / max(total, 1)", "share = 1.0",
             ("tests/test_preference_trainer.py::test_each_agent_is_stepped_on_the_gradient_of_its_own_delta",)),
    Mutation("preference_refresh_every ignored", "kit/preference_trainer.py",
             "self.step % self.cfg.preference_refresh_every == 0,", "True,",
             ("tests/test_preference_trainer.py::test_the_buffer_is_reused_between_refreshes_and_resumes_exactly",)),
    Mutation("the pair buffer not restored on resume", "kit/preference_trainer.py",
             "self.buffer = moved(self.buffers[self.dist.rank], device)", "self.buffer = None",
             ("tests/test_preference_trainer.py::test_the_buffer_is_reused_between_refreshes_and_resumes_exactly",)),
    Mutation("reward_learning_rate ignored", "kit/marlhf.py",
             "lr=cfg.reward_learning_rate,", "lr=1e-3,",
             ("tests/test_marlhf.py::test_one_fit_is_one_adamw_step_on_the_bradley_terry_gradient",)),
    Mutation("reward_heldout_fraction ignored", "kit/marlhf.py",
             "held = round(cfg.reward_heldout_fraction * n)", "held = 0",
             ("tests/test_marlhf.py::test_held_out_items_epochs_and_batch_size",)),
    Mutation("reward_num_train_epochs ignored", "kit/marlhf.py",
             "for epoch in range(cfg.reward_num_train_epochs):", "for epoch in range(1):",
             ("tests/test_marlhf.py::test_held_out_items_epochs_and_batch_size",)),
    Mutation("reward_train_batch_size ignored", "kit/marlhf.py",
             "optimizers[NAME], cfg.reward_train_batch_size, []", "optimizers[NAME], 8, []",
             ("tests/test_marlhf.py::test_held_out_items_epochs_and_batch_size",
              "tests/test_marlhf.py::test_one_fit_is_one_adamw_step_on_the_bradley_terry_gradient")),
    Mutation("MAGRPO keeps the task's reward under marlhf", "kit/marlhf.py",
             "Reward(s[n * J + j], {**r.parts", "Reward(r.total, {**r.parts",
             ("tests/test_marlhf.py::test_the_reward_model_is_the_reward_of_magrpo",)),
    Mutation("reward_refresh_every ignored", "kit/marlhf.py",
             "due = self.step == 0 or (self.cfg.reward_refresh_every and",
             "due = self.step == 0 or (False and",
             ("tests/test_marlhf.py::test_marlhf_resumes_exactly",)),
    Mutation("the reward model not loaded on resume", "kit/marlhf.py",
             "self._reward_model()  # before the checkpoint loads into it", "pass",
             ("tests/test_marlhf.py::test_marlhf_resumes_exactly",)),
]


def check(mutations: list[Mutation], root: Path = ROOT) -> list[str]:
    """Problems with the list against the tree at `root`: an `old` found other than exactly once, a no-op edit,
    a test file that does not exist, a repeated name."""
    problems, names = [], set()
    for m in mutations:
        path = root / m.file
        count = path.read_text().count(m.old) if path.exists() else 0
        if count != 1:
            problems.append(f"{m.name}: `old` occurs {count} times in {m.file} (exactly once needed)")
        if m.old == m.new:
            problems.append(f"{m.name}: `new` equals `old`")
        if m.name in names:
            problems.append(f"{m.name}: a second mutation of this name")
        names.add(m.name)
        problems += [f"{m.name}: no test file {t.split('::')[0]}" for t in m.tests
                     if not (root / t.split("::")[0]).exists()]
    return problems


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked (not ignored) files, as they are now, into `dest`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():  # a tracked file someone deleted is simply absent
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run(m: Mutation, copy: Path, timeout: int) -> tuple[str, float]:
    """Apply `m` in `copy`, run its tests there, restore the file; (outcome, seconds)."""
    path = copy / m.file
    original = path.read_text()
    path.write_text(original.replace(m.old, m.new, 1))
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}  # the copy's kit, not ours
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                             cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        code = out.returncode
    except subprocess.TimeoutExpired:
        code = None
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - start
    if code == 1:  # name the test that failed, so a catch for the wrong reason shows
        failed = next((line.split(" - ")[0].split("::")[-1] for line in out.stdout.splitlines()
                       if line.startswith(("FAILED ", "ERROR "))), "?")
        return f"caught by {failed}", seconds
    if code == 0:
        return "SURVIVED", seconds
    return ("error: timeout" if code is None else f"error: pytest exit {code}\n{out.stdout[-2000:]}"), seconds


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for m in MUTATIONS:
            print(f"{m.name}  ({m.file})\n    " + "\n    ".join(m.tests))
        return 0
    timeout = 600
    words = [a for a in argv if not a.startswith("-")]
    chosen = [m for m in MUTATIONS if not words or any(w.lower() in m.name.lower() for w in words)]
    problems = check(MUTATIONS)
    if problems:
        print("the mutation list does not fit the tree:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mutate_") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        where = subprocess.run([sys.executable, "-c", "import kit; print(kit.__file__)"], cwd=copy, text=True,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(copy)}).stdout.strip()
        if not where.startswith(str(copy)):
            print(f"the copy imports kit from {where}, not from the copy: refusing to run", file=sys.stderr)
            return 2
        print("| mutation | file | result | seconds |\n|---|---|---|---|", flush=True)
        survivors, errors = [], []
        for m in chosen:
            outcome, seconds = run(m, copy, timeout)
            first = outcome.splitlines()[0]
            if first == "SURVIVED" and m.equivalent:
                first = f"survived (equivalent: {m.equivalent})"
            print(f"| {m.name} | {m.file} | {first} | {seconds:.0f} |", flush=True)
            if outcome == "SURVIVED" and not m.equivalent:
                survivors.append(m.name)
            elif outcome.startswith("error"):
                errors.append(f"{m.name}: {outcome}")
    print(f"\n{len(chosen)} mutations: {len(chosen) - len(survivors) - len(errors)} caught or equivalent, "
          f"{len(survivors)} survived, {len(errors)} errors")
    for e in errors:
        print(e)
    return 1 if survivors or errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
