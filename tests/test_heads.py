"""The scalar model on the shared base (kit/engine/heads.py): one more adapter and an fp32 head, unseen by the agents;
the value head on an agent's own adapter (use_separate_critic=false).

Run: python -m pytest tests/test_heads.py      (a few seconds, the tiny model)
"""

import pytest
import torch

from kit.run import checkpoint
from kit.run.config import load_config
from kit.engine.heads import ScalarModel, ValueHead, last_token_index
from kit.engine.models import build_team, lora_config
from kit.engine.rollout import Sampler


def team_and_critic(tmp_path=None):
    cfg = load_config("tiny_cpu", overrides=["progress=false"])
    team = build_team(cfg, log=lambda *_: None)
    critic = ScalarModel(team, "critic_0", lora_config(cfg.lora_r, cfg.lora_alpha, 0.0, cfg.lora_target_modules),
                         seed=cfg.seed)
    return cfg, team, critic


def bare_team():
    return build_team(load_config("tiny_cpu", overrides=["progress=false"]), log=lambda *_: None)


def test_last_token_index_by_hand():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])  # left-padded, right-padded, one token
    assert last_token_index(mask).tolist() == [3, 2, 0]


def test_the_critic_lives_on_the_same_base_and_the_agents_never_see_it():
    cfg = load_config("tiny_cpu", overrides=["progress=false"])
    team = build_team(cfg, log=lambda *_: None)
    base_params = {n for n, p in team.models[0].named_parameters() if "lora_" not in n}
    agent_params = {a: [p.detach().clone() for p in team.parameters_of(a)] for a in team.adapters}
    requests = [(0, "a0 sum 12"), (1, "a1 sum 7")]
    before = Sampler.from_config(team, cfg).sample(requests, 3, keys=[(0,), (1,)]).texts
    critic = ScalarModel(team, "critic_0", lora_config(4, 8, 0.0, "all-linear"), seed=0)
    assert critic.model is team.models[0]  # one copy of the weights
    assert {n for n, p in team.models[0].named_parameters() if "lora_" not in n} == base_params
    assert team.adapters == ["agent_0", "agent_1"]  # the sampler, the engines and the policy optimizers' list
    ids = {id(p) for a in team.adapters for p in team.parameters_of(a)}
    assert not ids & {id(p) for p in critic.parameters()}
    assert not any(p.requires_grad for n, p in team.models[0].named_parameters() if "lora_" not in n)
    # a trained critic changes nothing of what the agents sample
    opt = torch.optim.AdamW(critic.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (critic.score_texts(["a0 sum 12", "x go 3"]) - 1.0).pow(2).sum().backward()
        opt.step()
    assert critic.adapter_parameters()[1].abs().sum() > 0  # lora_B moved (zero at init)
    assert Sampler.from_config(team, cfg).sample(requests, 3, keys=[(0,), (1,)]).texts == before
    for a in team.adapters:
        assert all(torch.equal(p, q) for p, q in zip(team.parameters_of(a), agent_params[a]))


def test_forward_reads_the_last_real_token_and_grads_reach_adapter_and_head_only():
    _, team, critic = team_and_critic()
    with torch.no_grad():
        critic.head.weight.normal_()
        critic.head.bias.fill_(0.5)
    enc = critic.encode(["a0 sum 12", "x go 3"])  # left-padded
    v = critic(enc["input_ids"], enc["attention_mask"])
    assert v.shape == (2,) and v.dtype == torch.float32
    alone = critic.score_texts(["x go 3"])  # the shorter row unpadded: the same score
    torch.testing.assert_close(v[1:], alone, rtol=1e-5, atol=1e-5)
    # right padding (a completion's tail) scores the same row too
    ids, att = enc["input_ids"][1:], enc["attention_mask"][1:]
    real = ids[att.bool()][None]
    pad = torch.full((1, 3), critic.tokenizer.pad_token_id)
    right = critic(torch.cat([real, pad], 1), torch.cat([torch.ones_like(real), torch.zeros_like(pad)], 1))
    torch.testing.assert_close(right, alone, rtol=1e-5, atol=1e-5)
    v.sum().backward()
    assert critic.head.weight.grad is not None and critic.head.bias.grad is not None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.adapter_parameters())
    assert all(p.grad is None for n, p in team.models[0].named_parameters() if "lora_" not in n)
    assert all(p.grad is None for a in team.adapters for p in team.parameters_of(a))


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_a_pooled_head_reads_the_mean_or_the_sum_over_real_tokens_whatever_the_padding(pooling):
    """pooling=mean/sum: s = w . (mean or sum over the row's real tokens of h_L) + b, by hand from the decoder's
    hidden states of each text alone (no padding), and the same for the padded batch; "last" differs."""
    cfg = load_config("tiny_cpu", overrides=["progress=false"])
    team = build_team(cfg, log=lambda *_: None)
    rm = ScalarModel(team, "reward_model", lora_config(4, 8, 0.0, "all-linear"), seed=0, pooling=pooling)
    with torch.no_grad():
        rm.head.weight.normal_(generator=torch.Generator().manual_seed(0))
        rm.head.bias.fill_(0.5)
        for p in rm.adapter_parameters():  # a trained-looking adapter: lora_B is zero at init
            p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(1))
    texts = ["a0 sum 12", "x go 3"]
    got = rm.score_texts(texts).detach()  # left-padded: the second row is shorter
    want = []
    team.models[0].set_adapter("reward_model")
    with torch.no_grad():
        for text in texts:
            ids = rm.encode([text])["input_ids"]  # (1, L), no padding
            h = rm.decoder(input_ids=ids).last_hidden_state[0].float()  # (L, H)
            pooled = h.sum(0) if pooling == "sum" else h.mean(0)
            want.append(float(pooled @ rm.head.weight[0] + 0.5))
    team.models[0].set_adapter("agent_0")
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-4, atol=1e-4)
    last = ScalarModel(team, "other", lora_config(4, 8, 0.0, "all-linear"), seed=0)
    with torch.no_grad():
        last.head.load_state_dict(rm.head.state_dict())
        for p, q in zip(last.adapter_parameters(), rm.adapter_parameters()):
            p.copy_(q)
    assert not torch.allclose(last.score_texts(texts).detach(), got, atol=1e-3)
    with pytest.raises(ValueError, match="pooling='max'"):
        ScalarModel(team, "third", lora_config(4, 8, 0.0, "all-linear"), pooling="max")


def test_checkpoint_saves_and_loads_the_model_and_its_optimizer_bitwise(tmp_path):
    cfg, team, critic = team_and_critic()
    opts = {a: torch.optim.AdamW(team.parameters_of(a), lr=0.1) for a in team.adapters}
    opts["critic_0"] = torch.optim.AdamW(critic.parameters(), lr=0.1)
    scheds = {a: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0) for a, o in opts.items()}
    for _ in range(2):
        opts["critic_0"].zero_grad()
        critic.score_texts(["a0 sum 12", "x go 3"]).pow(2).sum().backward()
        opts["critic_0"].step()
    saved = [p.detach().clone() for p in critic.parameters()]
    path = checkpoint.save(tmp_path, 2, team, opts, scheds, {}, models={"critic_0": critic})
    assert (path / "models" / "critic_0" / "head.safetensors").exists()
    assert checkpoint.unreadable(path) is None

    _, team2, critic2 = team_and_critic()
    opts2 = {a: torch.optim.AdamW(team2.parameters_of(a), lr=0.1) for a in team2.adapters}
    opts2["critic_0"] = torch.optim.AdamW(critic2.parameters(), lr=0.1)
    scheds2 = {a: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0) for a, o in opts2.items()}
    checkpoint.load_into(path, team2, opts2, scheds2, models={"critic_0": critic2})
    assert all(torch.equal(p, q) for p, q in zip(critic2.parameters(), saved))
    state, state2 = opts["critic_0"].state_dict()["state"], opts2["critic_0"].state_dict()["state"]
    assert all(torch.equal(state[k]["exp_avg_sq"], state2[k]["exp_avg_sq"]) for k in state)
    # a damaged head makes the checkpoint unreadable, as a damaged adapter does
    (path / "models" / "critic_0" / "head.safetensors").write_bytes(b"broken")
    assert checkpoint.unreadable(path) is not None


def test_a_value_head_reads_the_agents_own_adapter_and_adds_none():
    """s = w . h_L(x)[last] + b with h_L from the base + agent_0's adapter; its optimizer holds the head only; the
    gradient reaches agent_0's LoRA weights unless train_trunk=False."""
    team = bare_team()
    adapters = set(team.models[0].peft_config)
    head = ValueHead(team, "critic_0", "agent_0")
    assert set(team.models[0].peft_config) == adapters and head.adapter == "agent_0"
    assert [id(p) for p in head.parameters()] == [id(head.head.weight), id(head.head.bias)]
    assert [id(p) for p in head.adapter_parameters()] == [id(p) for p in team.parameters_of("agent_0")]
    with torch.no_grad():
        head.head.weight.copy_(torch.linspace(-1, 1, head.head.weight.shape[1])[None])
        head.head.bias.fill_(0.25)
    with torch.no_grad():  # agent_0's adapter: lora_B off zero, so reading it differs from the bare base
        for n, p in team.models[0].named_parameters():
            if "lora_B" in n and ".agent_0." in n:
                p.normal_(0, 0.1)
    enc = head.encode(["a0 sum 12"])
    team.models[0].set_adapter("agent_0")
    with torch.no_grad():
        h = head.decoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state[0, -1]
        with team.models[0].disable_adapter():
            bare = head.decoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    assert not torch.allclose(h, bare[0, -1])
    team.models[0].set_adapter("agent_1")  # another adapter active: the head still reads agent_0's, then restores
    v = head.score_texts(["a0 sum 12"])
    assert team.models[0].active_adapter == "agent_1"
    torch.testing.assert_close(v, (h.float() @ head.head.weight[0] + 0.25)[None], rtol=1e-5, atol=1e-5)
    v.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in team.parameters_of("agent_0"))
    assert all(p.grad is None for p in team.parameters_of("agent_1"))
    for p in [*team.parameters_of("agent_0"), *head.parameters()]:
        p.grad = None
    head.score_texts(["a0 sum 12"], train_trunk=False).sum().backward()
    assert head.head.weight.grad is not None
    assert all(p.grad is None for p in team.parameters_of("agent_0"))


def test_a_value_head_refuses_an_adapter_no_agent_has():
    team = bare_team()
    with pytest.raises(ValueError, match="agent_7"):
        ValueHead(team, "critic_0", "agent_7")


def test_a_value_head_checkpoint_is_its_head_only_and_loads_bitwise(tmp_path):
    team = bare_team()
    head = ValueHead(team, "critic_0", "agent_0")
    with torch.no_grad():
        head.head.weight.normal_()
        head.head.bias.fill_(-0.5)
    opts = {a: torch.optim.AdamW(team.parameters_of(a), lr=0.1) for a in team.adapters}
    scheds = {a: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0) for a, o in opts.items()}
    path = checkpoint.save(tmp_path, 1, team, opts, scheds, {}, models={"critic_0": head})
    assert sorted(f.name for f in (path / "models" / "critic_0").iterdir()) == ["head.safetensors"]
    assert checkpoint.unreadable(path) is None
    team2 = bare_team()
    head2 = ValueHead(team2, "critic_0", "agent_0")
    opts2 = {a: torch.optim.AdamW(team2.parameters_of(a), lr=0.1) for a in team2.adapters}
    scheds2 = {a: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0) for a, o in opts2.items()}
    checkpoint.load_into(path, team2, opts2, scheds2, models={"critic_0": head2})
    assert all(torch.equal(p, q) for p, q in zip(head2.parameters(), head.parameters()))
    (path / "models" / "critic_0" / "head.safetensors").write_bytes(b"broken")
    assert checkpoint.unreadable(path) is not None
