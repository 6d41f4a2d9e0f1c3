"""Scalar models on the team's shared base: one more LoRA adapter plus a small fp32 head, for critics and reward models.

    critic = ScalarModel(team, "critic_0", lora_config(...), seed=cfg.seed)   # adds adapter "critic_0" to base 0
    v = critic(input_ids, attention_mask)           # (R,) float32, gradient through the adapter and the head
    v = critic.score_texts(["prompt a", "prompt b"])  # the same from text (tokenized as the sampler does)

What it is: `add_adapter` on the SAME PeftModel that holds the agents' adapters (no second copy of the weights) and
a `Linear(hidden, 1)` in fp32 on the decoder's final hidden state (after the last norm) of each row's last
non-padding token:

    s(x) = w . h_L(x)[last] + b        with h_L computed with the base + this model's adapter only

or, with `pooling="mean"` / `"sum"`, on the mean / the sum of h_L over the row's real tokens (padding left out):
s(x) = w . sum_t h_L(x)[t] + b is a score per token summed, which grows with the text's length, for a rubric that
counts (a reward model's `reward_model_pooling`; critics read the last token).

The base stays frozen; only the adapter and the head train, with the owner's optimizer (`parameters()`).

    head = ValueHead(team, "critic_0", adapter="agent_0")  # no new adapter: a head reading agent_0's own adapter
    v = head.score_texts(texts)                  # gradient through agent_0's adapter and the head
    v = head.score_texts(texts, train_trunk=False)   # the head only (the decoder runs without gradient)

`ValueHead` (IAC's use_separate_critic=false) is the same scorer on an agent's adapter: its `parameters()` are the
head's alone, and the value loss's gradient on the agent's LoRA weights is stepped by the agent's own optimizer
(kit/trainers/critic.py says how); it saves only `head.safetensors`.

What never sees it: the sampler and the compiled engine generate with `team.adapters` (the agents' adapters, from
`team.adapter_of`), and the policy optimizers hold `team.parameters_of(agent adapter)`; a scalar model's adapter
is in neither list, so it never samples and no policy step moves it. PEFT's `set_adapter` switches `requires_grad`
to the active adapter only; `forward` activates this adapter, then restores the previously active one and every
adapter's flag, keeping its own on (the backward comes after the forward returns).

How another algorithm adds its model (e.g. a reward model for issue 32): build a `ScalarModel` on the team with a
name of its own (`reward_model`), give it an optimizer over `model.parameters()`, and expose both as its
`models` / `optimizers` / `schedulers` dicts (see kit/trainers/critic.py's `Algorithm`): the trainer passes them to
kit/run/checkpoint.py, which saves `models/<name>/` (PEFT adapter + head.safetensors) and the optimizer and scheduler
states beside the agents', and loads them back bitwise on resume.

Not covered: a head on a base other than base 0 of a heterogeneous team is possible (`base=`) but untested.
Run its tests: python -m pytest tests/test_heads.py
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from kit.engine.models import adapter_parameters
from kit.engine.prefixes import shared_prefix_hidden
from kit.engine.rollout import encode_prompt, left_pad
from kit.engine.forward import checkpointed, position_ids

HEAD_FILE = "head.safetensors"
POOLINGS = ("last", "mean", "sum")  # what the head reads: the last real token, or the mean / sum over real tokens


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """The index of each row's last non-padding token, (R, L) -> (R,): left-padded prompts and right-padded
    completions alike (the highest position whose mask is 1)."""
    L = attention_mask.shape[1]
    positions = torch.arange(L, device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), positions, -1).max(-1).values


class ScalarModel:
    """One adapter named `name` on `team.models[base]` plus an fp32 Linear(hidden, 1) head; see the module docstring."""

    pooling = "last"

    def __init__(self, team, name: str, config, seed: int = 0, base: int = 0, pooling: str = "last"):
        if name in team.adapter_of:
            raise ValueError(f"scalar model name {name!r} is an agent's adapter: choose another name")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not one of {POOLINGS}")
        self.pooling = pooling
        self._place(team, name, name, base)
        active = self.model.active_adapter
        grads = {id(p): p.requires_grad for p in self.model.parameters()}
        gen = torch.random.get_rng_state()
        torch.manual_seed(seed)  # its adapter's init from the run's seed, without moving the caller's RNG stream
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                        category=FutureWarning)
                self.model.add_adapter(name, config)
        finally:
            torch.random.set_rng_state(gen)
        # adding an adapter must change nothing for the others: the same active adapter, the same trainable params
        self.model.set_adapter(active)
        for p in self.model.parameters():
            if id(p) in grads:
                p.requires_grad_(grads[id(p)])
        self._build_head()

    def _place(self, team, name: str, adapter: str, base: int) -> None:
        """Where it reads: `adapter` (its own, or an agent's for a ValueHead) on base `base` of the team."""
        self.team, self.name, self.adapter, self.base = team, name, adapter, base
        self.model = team.models[base]
        self.tokenizer = team.tokenizers[base]

    def _build_head(self) -> None:
        hf = self.model.get_base_model()
        self.decoder = getattr(hf, hf.base_model_prefix)
        device = next(self.model.parameters()).device
        # zero head: an untrained model scores everything 0 (a critic that knows nothing: A = R - 0)
        self.head = torch.nn.Linear(hf.config.hidden_size, 1, dtype=torch.float32, device=device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def adapter_parameters(self) -> list[torch.nn.Parameter]:
        """The LoRA weights of the adapter it reads through."""
        return adapter_parameters(self.model, self.adapter)

    def parameters(self) -> list[torch.nn.Parameter]:
        """What its optimizer holds: the adapter's LoRA weights, then the head's weight and bias (a stable order)."""
        return [*self.adapter_parameters(), *self.head.parameters()]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 train_trunk: bool = True) -> torch.Tensor:
        """(R, L) left- or right-padded rows -> (R,) float32 scores, with gradient through the head and, unless
        `train_trunk=False` (the decoder then runs without gradient), through the adapter."""
        previous = self.model.active_adapter
        flags = [(p, p.requires_grad) for n, p in self.model.named_parameters() if "lora_" in n]
        self.model.set_adapter(self.adapter)  # this adapter active and trainable; the base stays frozen
        try:
            with torch.set_grad_enabled(torch.is_grad_enabled() and train_trunk):
                pooled = self._pooled_hidden(input_ids, attention_mask)  # (R, H)
            return self.head(pooled.float()).squeeze(-1)  # (R,)
        finally:
            # the previous adapter active again and every flag as it was, except ours: a leaf whose requires_grad
            # is switched off after the forward gets no gradient from the backward that follows
            self.model.set_adapter(previous)
            for p, flag in flags:
                p.requires_grad_(flag)
            if train_trunk:
                for p in self.adapter_parameters():
                    p.requires_grad_(True)

    def _pooled_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """What the head reads, (R, H): the last real token's hidden state, or the mean / sum over real tokens (in
        fp32: a bf16 sum over hundreds of tokens would round away the small ones)."""
        if self.pooling == "last":
            return self._last_hidden(input_ids, attention_mask)
        mask = attention_mask.float()[..., None]  # (R, L, 1)
        total = (self._hidden(input_ids, attention_mask).float() * mask).sum(1)  # (R, H)
        return total if self.pooling == "sum" else total / mask.sum(1).clamp(min=1)

    def _last_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The decoder's final hidden state at each row's last token, (R, H); rows that begin alike (a prompt and
        its completions) forward their common beginning once when the team shares prompts (kit/engine/prefixes.py)."""
        if self.team.share_prompts and not checkpointed(self.model):
            last = shared_prefix_hidden(self.decoder, input_ids, attention_mask)
            if last is not None:
                return last
        hidden = self._hidden(input_ids, attention_mask)
        return hidden[torch.arange(len(hidden), device=hidden.device), last_token_index(attention_mask)]

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The decoder's final hidden states of every position, (R, L, H)."""
        return self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids(attention_mask), use_cache=False).last_hidden_state

    def encode(self, texts: list[str], use_chat_template: bool = False,
               max_tokens: int | None = None) -> dict[str, torch.Tensor]:
        """Token ids and mask of `texts`, left-padded (as the sampler encodes prompts)."""
        rows = [encode_prompt(self.tokenizer, t, use_chat_template, max_tokens) for t in texts]
        return left_pad(rows, self.tokenizer.pad_token_id, self.head.weight.device)

    def score_texts(self, texts: list[str], use_chat_template: bool = False,
                    max_tokens: int | None = None, train_trunk: bool = True) -> torch.Tensor:
        """(len(texts),) scores of whole texts (a prompt, or a prompt and its completion written out)."""
        enc = self.encode(texts, use_chat_template, max_tokens)
        return self(enc["input_ids"], enc["attention_mask"], train_trunk)

    # ---- checkpoint (kit/run/checkpoint.py calls these)

    def save(self, folder: Path) -> None:
        """`folder/<name>/`: the adapter in PEFT format and head.safetensors."""
        self.model.save_pretrained(folder, selected_adapters=[self.name])
        self._save_head(folder)

    def load(self, folder: Path) -> None:
        """Load what `save` wrote into this model (in place: the optimizer keeps pointing at the same tensors)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        where = Path(folder) / self.name
        weights = load_file(str(where / "adapter_model.safetensors"), device=str(self.head.weight.device))
        result = set_peft_model_state_dict(self.model, weights, adapter_name=self.name)
        missing = [k for k in result.missing_keys if "lora_" in k and f".{self.name}." in k]
        if missing:
            raise ValueError(f"checkpoint {folder} lacks weights for model {self.name}: {missing[:3]}...")
        self._load_head(folder)

    def _save_head(self, folder: Path) -> None:
        from safetensors.torch import save_file

        (Path(folder) / self.name).mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
                  str(Path(folder) / self.name / HEAD_FILE))

    def _load_head(self, folder: Path) -> None:
        from safetensors.torch import load_file

        head = load_file(str(Path(folder) / self.name / HEAD_FILE), device=str(self.head.weight.device))
        with torch.no_grad():
            for k, v in self.head.state_dict().items():
                v.copy_(head[k])


class ValueHead(ScalarModel):
    """An fp32 head named `name` on an agent's OWN adapter `adapter` (use_separate_critic=false): no new adapter.

    Its `parameters()` (what its optimizer holds) are the head's only; `adapter_parameters()` are the agent's
    LoRA weights, which the value loss's gradient also reaches (the actor's optimizer steps them: kit/trainers/critic.py).
    A checkpoint holds `<name>/head.safetensors` only (the adapter is saved as the agent's)."""

    def __init__(self, team, name: str, adapter: str):
        if name in team.adapter_of:
            raise ValueError(f"value head name {name!r} is an agent's adapter: choose another name")
        if adapter not in team.adapters:
            raise ValueError(f"value head {name!r} reads adapter {adapter!r}, which no agent has ({team.adapters})")
        self._place(team, name, adapter, team.base_of[team.agents_of_adapter(adapter)[0]])
        self._build_head()

    def parameters(self) -> list[torch.nn.Parameter]:
        """The head's weight and bias: the adapter belongs to the agent (and its optimizer)."""
        return list(self.head.parameters())

    def save(self, folder: Path) -> None:
        """`folder/<name>/head.safetensors`."""
        self._save_head(folder)

    def load(self, folder: Path) -> None:
        self._load_head(folder)
