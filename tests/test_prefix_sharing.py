"""Critics and reward models forward the common beginning of their texts once (kit/engine/prefixes.py): the same scores and
gradients as forwarding every whole text. Run: python -m pytest tests/test_prefix_sharing.py"""

import pytest
import torch

import kit.engine.heads
from kit.run.config import load_config
from kit.engine.heads import ScalarModel, ValueHead
from kit.engine.models import Team, adapter_parameters, attach_adapters, build_tiny_model, lora_config
from kit.engine.prefixes import prefix_groups, shared_prefix_hidden
from kit.trainers.trainer import Trainer


def test_groups_share_a_prompt_not_only_the_system_turn():
    # two prompts (1 1 1 1, 2 2 2 2) after a common system turn (9 9), two completions each: two groups of
    # prefix 6 save 6 + 6 forwards; one group of prefix 2 would save 3 * 2
    rows = [[9, 9, 2, 2, 2, 2, 6], [9, 9, 1, 1, 1, 1, 5], [9, 9, 2, 2, 2, 2, 5], [9, 9, 1, 1, 1, 1, 6]]
    assert prefix_groups(rows) == [(6, [0, 2]), (6, [1, 3])]


def test_a_longer_group_with_a_shorter_prefix_when_it_saves_more():
    # [1 2 3 4], [1 2 3 5] share 3 (saves 3); with [1 2 9] all three share 2 (saves 2 * 2 = 4); [7 8] alone
    assert prefix_groups([[7, 8], [1, 2, 3, 5], [1, 2, 9], [1, 2, 3, 4]]) == [(0, [0]), (2, [1, 2, 3])]


def test_each_row_keeps_a_token_of_its_own_and_nothing_shared_is_none():
    assert prefix_groups([[4, 5, 6], [4, 5, 6]]) == [(2, [0, 1])]  # identical texts: the last token is each row's
    assert prefix_groups([[4, 5], [4, 7, 8]]) == [(1, [0, 1])]
    assert prefix_groups([[1, 2, 3], [1, 2, 3, 4]]) == [(2, [0, 1])]  # a row that begins another keeps its last
    assert prefix_groups([[1, 2], [3, 4], [5]]) is None
    assert prefix_groups([[1], [1]]) is None  # one-token rows have nothing before their last token


def make_team(family="tiny"):
    if family == "tiny":
        model, tok = build_tiny_model(0)
    else:  # a window (5) shorter than the texts: the cache keeps each layer's kind (Gemma 3 mixes both)
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

        torch.manual_seed(0)
        shape = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                     num_key_value_heads=2, sliding_window=5)
        model = MistralForCausalLM(MistralConfig(num_hidden_layers=2, **shape)) if family == "mistral" else \
            Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=3, head_dim=8, **shape, layer_types=[
                "sliding_attention", "full_attention", "sliding_attention"]))
        tok = None
    pm = attach_adapters(model, ["agent_0"], lora_config(4, 8, 0.0, "all-linear"))
    return Team([pm], [tok], [0], ["agent_0"])


def scorer(team, kind):
    torch.manual_seed(3)
    model = ScalarModel(team, "critic_0", lora_config(4, 8, 0.0, "all-linear"), seed=0) if kind == "critic" \
        else ValueHead(team, "critic_0", adapter="agent_0")
    with torch.no_grad():  # a fresh LoRA B and head are zero: give them an effect
        for p in [*adapter_parameters(model.model, model.adapter), *model.head.parameters()]:
            p.add_(torch.randn_like(p) * 0.3)
    return model


def rows_of(vocab):
    """Left-padded rows: two prompts with three and two completions of different lengths, a text alone, and the
    first prompt alone (a row that begins three others)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(1, vocab, (9,), generator=g).tolist(), torch.randint(1, vocab, (12,), generator=g).tolist()
    tails = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (3, 5, 1, 4, 2)]
    rows = [a + tails[0], b + tails[1], a + tails[2], a + tails[3], b + tails[4],
            torch.randint(1, vocab, (7,), generator=g).tolist(), a]  # the last: a prompt alone (a v critic's text)
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def scores_and_grads(model, ids, mask, share):
    model.team.share_prompts = share
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = None
    s = model(ids, mask)
    (s * torch.linspace(0.5, 2.0, len(s))).sum().backward()
    return s.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("family", ["tiny", "mistral", "gemma3"])
@pytest.mark.parametrize("kind", ["critic", "value head"])
def test_shared_scores_and_gradients_equal_whole_rows(family, kind, monkeypatch):
    team = make_team(family)
    model = scorer(team, kind)
    ids, mask = rows_of(100 if family != "tiny" else len(team.tokenizers[0]))
    real, used = kit.engine.heads.shared_prefix_hidden, []
    monkeypatch.setattr(kit.engine.heads, "shared_prefix_hidden", lambda *a: used.append(real(*a)) or used[-1])
    s0, g0 = scores_and_grads(model, ids, mask, share=False)
    assert not used
    s1, g1 = scores_and_grads(model, ids, mask, share=True)
    assert used and used[-1] is not None  # the shared path ran
    torch.testing.assert_close(s1, s0, atol=1e-5, rtol=1e-5)
    # a prefix counted once instead of once per row would be off by O(1) in the adapter's gradient
    assert max(float((x - y).norm() / y.norm()) for x, y in zip(g1, g0)) < 1e-4


def test_rows_with_nothing_worth_sharing_forward_whole():
    decoder = scorer(make_team(), "critic").decoder
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    assert shared_prefix_hidden(decoder, ids, torch.ones_like(ids)) is None
    # a shared first token among long rows: 11 positions in two passes instead of 12, not worth a second call
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 11, 12, 13, 14, 15]])
    assert shared_prefix_hidden(decoder, ids, torch.ones_like(ids)) is None


def test_gradient_checkpointing_scores_whole_rows(monkeypatch):
    team = make_team()
    model = scorer(team, "critic")
    hf = team.models[0].get_base_model()
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    team.models[0].train()
    monkeypatch.setattr(kit.engine.heads, "shared_prefix_hidden", lambda *a: pytest.fail("shared under checkpointing"))
    ids, mask = rows_of(len(team.tokenizers[0]))
    model(ids, mask).sum().backward()


@pytest.mark.parametrize("overrides", [
    ["algorithm=iac", "critic_type=q"],
    ["algorithm=iac", "critic_type=q", "use_separate_critic=false"],
    ["algorithm=maac", "critic_type=q"],
    ["algorithm=marlhf", "marlhf_rl_algorithm=iac", "critic_type=q"],
])
def test_critic_training_with_and_without_sharing_ends_at_the_same_weights(tmp_path, overrides, monkeypatch):
    """One step of 2 iterations: the critics start at V = 0, so both runs take the same advantages and what differs
    is the critics' (and a value head's actor's) fit through the shared forward; its second iteration sends the
    value gradient into the critic's adapter. (From the second step on, q advantages are differences of nearly
    equal Q values, where float rounding of other matmul shapes, 1e-7, grows to 1e-4 in the actors.)"""
    real, shared = kit.engine.heads.shared_prefix_hidden, []
    monkeypatch.setattr(kit.engine.heads, "shared_prefix_hidden", lambda *a: shared.append(real(*a)) or shared[-1])
    runs = {}
    for share in (False, True):
        cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / str(share)}", "progress=false",
                                                 f"share_prompts={str(share).lower()}", "num_iterations=2", *overrides])
        trainer = Trainer(cfg)
        trainer.train(max_steps=1)
        models = trainer.algorithm.models.values()
        runs[share] = [p.detach().clone() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)] + \
            [p.detach().clone() for m in models for p in m.parameters()]
        lora_b = [p for m in models for p in m.adapter_parameters() if p.shape[1] < p.shape[0]]  # zero at the start
        assert any(float(p.detach().norm()) > 0 for p in lora_b)
        trainer.close()
        assert bool(shared) == share and (not share or any(h is not None for h in shared))
    assert max(float((x - y).norm() / max(y.norm(), 1e-12)) for x, y in zip(runs[True], runs[False])) < 1e-4


def test_right_padded_rows_give_what_left_padded_ones_do():
    decoder = scorer(make_team(), "critic").decoder
    ids, mask = rows_of(100)
    lengths = mask.sum(1)
    right = torch.stack([torch.roll(r, -int(len(r) - n)) for r, n in zip(ids, lengths)])
    right_mask = torch.stack([torch.roll(m, -int(len(m) - n)) for m, n in zip(mask, lengths)])
    with torch.no_grad():
        torch.testing.assert_close(shared_prefix_hidden(decoder, right, right_mask),
                                   shared_prefix_hidden(decoder, ids, mask), atol=1e-5, rtol=1e-5)
