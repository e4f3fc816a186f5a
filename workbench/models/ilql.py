"""Implicit Language Q-Learning (Snell et al., 2022) with AgileRL's ``ILQL`` interface.

``ILQL(dataset, net_config, ...)`` takes AgileRL's arguments and has its
methods (``forward``, ``get_downstream_rs``, ``get_weights``, ``awac_loss``,
``get_v_loss``, ``get_q_loss``, ``get_cql_loss``, ``get_dm_loss``,
``get_loss``, ``learn``, ``soft_update``, ``hardUpdate``, ``clone``,
``save_checkpoint``, ``load_checkpoint``), written here without agilerl.

Networks (the GPT of :mod:`workbench.models.gpt`, nanoGPT's layout)::

    model          GPT trunk read by the value heads        tokens -> (B, T, n_embd)
    target_model   Polyak copy of ``model``                  (no gradients)
    actor          policy GPT trunk, ``pi`` its head         tokens -> (B, T, vocab) logits
    v              MLP n_embd -> 2n -> 2n -> 1                V(s) at ``state_idxs``
    q, q2          MLP n_embd -> 2n -> 2n -> vocab            Q(s, .) at ``action_idxs`` (q2 when double_q)
    target_q(2)    Polyak copies of q (and q2)

Decoding (:meth:`ILQL.generate`) samples from the policy's logits shifted by
``beta * (Q - V)``: ILQL's perturbed policy.

Here: the hyperparameters and their checks, the networks and optimizer, the agent (forward,
losses, training, decoding, checkpoints) and its registration as the model ``ilql``. What a
checkpoint's contents are checked against is in :mod:`workbench.models.ilql_checkpoint`.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.gpt import GPT, GPT2_CONFIG, TINY_CONFIG, check_net_config, count_parameters
from workbench.models.ilql_checkpoint import (CHECKPOINT_FORMAT, CHECKPOINT_VERSION, CheckpointError, check_optimizer,
                                              check_state, number_list)
from workbench.models.toy_language import ToyLanguageDataset
from workbench.checkpoints import write_checkpoint
from workbench.params import SEED_MAX, Choices, Range, check_arguments, check_memory, matches
from workbench.registry import list_models, memory_is_accounted, register_model

# GPT, its configs and check_net_config live in workbench.models.gpt, CheckpointError in
# workbench.models.ilql_checkpoint; they are exported here too, as before
__all__ = ["ILQL", "GPT", "GPT2_CONFIG", "TINY_CONFIG", "CheckpointError", "check_net_config", "HYPERPARAMETERS",
           "check_hyperparameters", "estimate_memory"]

def _check_vocab(net_config: dict[str, Any], dataset: Any) -> None:
    tokenizer = getattr(dataset, "tokenizer", None)
    if tokenizer is not None and tokenizer.vocab_size > net_config["vocab_size"]:
        raise ValueError(f"net_config['vocab_size'] ({net_config['vocab_size']}) is smaller than the "
                         f"dataset's vocabulary ({tokenizer.vocab_size}); set it to at least that.")


#: ILQL's hyperparameters: the constructor's arguments after ``dataset`` and ``net_config``, in its order
#: (a test holds the two together). The agent keeps them as attributes, a checkpoint by these names.
HYPERPARAMETERS = ("index", "batch_size", "lr", "alpha", "beta", "gamma", "tau", "mutation", "transition_weight",
                   "clip_weight", "value_max", "value_min", "detach_v", "detach_q", "detach_pi", "double_q",
                   "per_token", "exp_weights", "dm_margin", "cql_temp", "weight_decay", "device")
_RULES = ("batch_size >= 1, lr > 0, 0 <= alpha <= 1, 0 <= gamma <= 1, 0 < tau < 1, cql_temp > 0, "
          "weight_decay >= 0")


def check_hyperparameters(hyperparameters: dict[str, Any], owner: str = "ILQL") -> dict[str, Any]:
    """Check ILQL's hyperparameters (:data:`HYPERPARAMETERS`) by the constructor's rules; returns them
    with ``device`` as a string.

    The types are the constructor's annotations (checked by :func:`workbench.params.check_arguments`),
    the ranges those of ``_RULES``. The constructor and :meth:`ILQL.load_checkpoint` both check with
    this function.

    Raises:
        TypeError: a value of the wrong type.
        ValueError: a missing or unknown name, a value out of range, not finite, or a device this
            process cannot use (``meta`` holds no values).
    """
    h = dict(hyperparameters)
    missing = [k for k in HYPERPARAMETERS if k not in h]
    unknown = [k for k in h if k not in HYPERPARAMETERS]
    if missing or unknown:
        raise ValueError(f"{owner}: hyperparameters " + (f"missing {missing}" if missing else "")
                         + (" and " if missing and unknown else "") + (f"unknown {unknown}" if unknown else "")
                         + f"; ILQL's are {list(HYPERPARAMETERS)}.")
    check_arguments(ILQL, owner, **{k: v for k, v in h.items() if k != "device"})  # the device: below
    checks = {
        "batch_size": h["batch_size"] >= 1, "lr": h["lr"] > 0, "alpha": 0 <= h["alpha"] <= 1,
        "gamma": 0 <= h["gamma"] <= 1, "tau": 0 < h["tau"] < 1, "cql_temp": h["cql_temp"] > 0,
        "weight_decay": h["weight_decay"] >= 0,
    }
    for name, ok in checks.items():
        if not ok:
            raise ValueError(f"{owner}: {name}={h[name]!r} is out of range ({_RULES}).")
    if not h["per_token"]:
        raise ValueError(f"{owner}: per_token=False (utterance-level ILQL) is not implemented; use per_token=True.")
    if h["value_min"] is not None and h["value_max"] is not None and h["value_min"] > h["value_max"]:
        raise ValueError(f"{owner}: value_min ({h['value_min']}) is above value_max ({h['value_max']}).")
    h["device"] = _check_device(h["device"], owner)
    return h


def _check_device(device: Any, owner: str) -> str:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{owner}: device must be a string such as 'cpu' or 'cuda', got {device!r}.")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{owner}: device {device!r} is not a device name; pass 'cpu' or e.g. 'cuda:0'.") from None
    if resolved.type == "meta":
        raise ValueError(f"{owner}: device 'meta' holds shapes but no values: an agent cannot train or act there; "
                         "pass 'cpu' or an accelerator such as 'cuda'.")
    try:
        torch.empty(0, device=resolved)  # the cheapest proof that the device exists here
    except Exception as err:  # RuntimeError, AssertionError (no CUDA build) ...
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{owner}: device {str(device)!r} cannot be used here ({first}); pass 'cpu' or an "
                         "accelerator this process has.") from None
    return str(device)


def _head_parameters(n_embd: int, out: int) -> int:
    return (n_embd + 1) * 2 * n_embd + (2 * n_embd + 1) * 2 * n_embd + (2 * n_embd + 1) * out


def estimate_memory(net_config: dict[str, Any], double_q: bool = True) -> dict[str, int] | None:
    """Bytes an ILQL agent of this (validated) net_config holds, by part, counted without building it.

    ``networks``: the parameters of every network (trunk, policy, heads and the targets);
    ``optimizer``: AdamW's two moments of each trainable parameter, allocated at the first step.
    """
    c, itemsize = net_config, torch.get_default_dtype().itemsize
    trunk, actor = count_parameters(c), count_parameters(c, lm_head=True)
    if trunk is None or actor is None:
        return None
    heads = _head_parameters(c["n_embd"], 1) + _head_parameters(c["n_embd"], c["vocab_size"]) * (2 if double_q else 1)
    targets = trunk + _head_parameters(c["n_embd"], c["vocab_size"]) * (2 if double_q else 1)
    trainable = trunk + actor + heads
    return {"networks": (trainable + targets) * itemsize, "optimizer": 2 * trainable * itemsize}


def _mlp_head(n_embd: int, out: int, dropout: float) -> nn.Sequential:
    """Two hidden layers of 2 n_embd, as ILQL's value and Q heads."""
    return nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(2 * n_embd, 2 * n_embd), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(2 * n_embd, out))


def _gather(x: torch.Tensor, idxs: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) at positions idxs (B, N) -> (B, N, C)."""
    return torch.gather(x, 1, idxs.unsqueeze(2).expand(-1, -1, x.shape[2]))


# --- the agent ----------------------------------------------------------------------------

#: The agent's networks in the order they are registered (the optimizer's parameter order).
_NETWORKS = ("model", "actor", "v", "q", "q2", "target_model", "target_q", "target_q2")


def _make_networks(c: dict[str, Any], double_q: bool) -> dict[str, nn.Module | None]:
    """Every network of an agent with net_config ``c``, on the current default device (``meta`` for a layout)."""
    vocab, n_embd = c["vocab_size"], c["n_embd"]
    nets: dict[str, nn.Module | None] = {
        "model": GPT(c), "actor": GPT(c, lm_head=True), "v": _mlp_head(n_embd, 1, c["dropout"]),
        "q": _mlp_head(n_embd, vocab, c["dropout"]),
        "q2": _mlp_head(n_embd, vocab, c["dropout"]) if double_q else None,
    }
    nets["target_model"] = copy.deepcopy(nets["model"])
    nets["target_q"] = copy.deepcopy(nets["q"])
    nets["target_q2"] = copy.deepcopy(nets["q2"]) if double_q else None
    for name in ("target_model", "target_q", "target_q2"):
        if nets[name] is not None:
            nets[name].requires_grad_(False)
    return nets


def _trainable(networks: dict[str, nn.Module | None]) -> list[nn.Parameter]:
    return [p for name in _NETWORKS if networks[name] is not None
            for p in networks[name].parameters() if p.requires_grad]


def _make_optimizer(networks: dict[str, nn.Module | None], lr: float, weight_decay: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(_trainable(networks), lr=lr, weight_decay=weight_decay)


class ILQL(nn.Module):
    """Implicit Language Q-Learning agent with AgileRL's constructor and methods.

    Args:
        dataset: the offline dataset; its ``tokenizer`` (``pad_token_id``,
            ``eos_token_id``, ``vocab_size``) is used when present. May be None.
        net_config: GPT configuration (keys of :data:`GPT2_CONFIG`, the default).
        index: index of the agent in a population.
        batch_size: batch size of :meth:`learn`'s samples.
        lr: AdamW learning rate.
        alpha: Polyak rate of :meth:`soft_update`.
        beta: AWR temperature of the policy weights (0: behaviour cloning).
        gamma: discount.
        tau: expectile of the value loss.
        mutation: the most recent mutation (population training).
        transition_weight: policy weight of tokens that are not actions.
        clip_weight: clip the policy weights at this value.
        value_max: clip target Q values from above.
        value_min: clip target Q values from below.
        detach_v: the V head does not train the trunk.
        detach_q: the Q heads do not train the trunk.
        detach_pi: the policy does not train its trunk.
        double_q: twin Q heads; targets take their minimum.
        per_token: per-token ILQL (the only mode here; ``False`` is an error).
        exp_weights: exp(beta (Q - V)) policy weights; else binary advantage weights.
        dm_margin: margin of the DM loss.
        cql_temp: temperature of the CQL loss.
        weight_decay: AdamW weight decay.
        device: where the networks live.

    Raises:
        ValueError: a net_config or hyperparameter out of range (the message names it), or
            ``per_token=False``.
        TypeError: a value of the wrong type.
        workbench.params.MemoryLimitError: the networks would not fit in memory.

    Examples:
        >>> from workbench.models.ilql import ILQL, TINY_CONFIG
        >>> from workbench.models.toy_language import ToyLanguageDataset
        >>> data = ToyLanguageDataset(size=256)
        >>> agent = ILQL(data, {**TINY_CONFIG, "vocab_size": data.tokenizer.vocab_size}, lr=1e-3)
        >>> sorted(agent.learn(data.sample(8)))
        ['cql_loss', 'dm_loss', 'loss', 'mean_advantage', 'mean_q', 'mean_v', 'q_loss', 'token_loss', 'v_loss']
        >>> answers = agent.generate(data.prompts(4), max_length=5, beta=8.0)   # the perturbed policy
        >>> data.score(answers).shape                                            # fitting words per answer
        torch.Size([4])
    """

    def __init__(self, dataset: Any, net_config: dict[str, Any] | None = None, index: int = 0, batch_size: int = 64,
                 lr: float = 1e-5, alpha: float = 0.005, beta: float = 0.0, gamma: float = 0.99, tau: float = 0.6,
                 mutation: str | None = None, transition_weight: float = 0.0, clip_weight: float | None = None,
                 value_max: float | None = None, value_min: float | None = None, detach_v: bool = False,
                 detach_q: bool = False, detach_pi: bool = False, double_q: bool = True, per_token: bool = True,
                 exp_weights: bool = True, dm_margin: float = 0.0, cql_temp: float = 1.0, weight_decay: float = 0.0,
                 device: str = "cpu") -> None:
        super().__init__()
        self.dataset = dataset
        # AgileRL keeps the hyperparameters as plain attributes (mutations change them there)
        hyperparameters = check_hyperparameters(dict(
            index=index, batch_size=batch_size, lr=lr, alpha=alpha, beta=beta, gamma=gamma, tau=tau,
            mutation=mutation, transition_weight=transition_weight, clip_weight=clip_weight, value_max=value_max,
            value_min=value_min, detach_v=detach_v, detach_q=detach_q, detach_pi=detach_pi, double_q=double_q,
            per_token=per_token, exp_weights=exp_weights, dm_margin=dm_margin, cql_temp=cql_temp,
            weight_decay=weight_decay, device=device))
        net_config = check_net_config(copy.deepcopy(GPT2_CONFIG if net_config is None else net_config))
        _check_vocab(net_config, dataset)
        if not memory_is_accounted():  # create_model("ilql", ...) has checked its estimate with its limit
            check_memory(estimate_memory(net_config, hyperparameters["double_q"]),
                         f"ILQL(net_config with n_layer={net_config['n_layer']}, n_embd={net_config['n_embd']}, "
                         f"block_size={net_config['block_size']}, vocab_size={net_config['vocab_size']})",
                         device=hyperparameters["device"])
        self.__dict__.update(hyperparameters)
        self.net_config = net_config
        self.fitness: list[float] = []
        self.scores: list[float] = []
        self.steps: list[int] = [0]
        self._build()

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The constructor's arguments besides dataset and net_config, as the attributes hold them now."""
        return {k: getattr(self, k) for k in HYPERPARAMETERS}

    def _build(self) -> None:
        networks = _make_networks(self.net_config, self.double_q)
        for module in networks.values():
            if module is not None:
                module.to(self.device)
        self._install(networks, _make_optimizer(networks, self.lr, self.weight_decay))

    def _install(self, networks: dict[str, nn.Module | None], optimizer: torch.optim.Optimizer) -> None:
        """Put networks in place, registered in the canonical order (the optimizer's parameter order)."""
        for name in _NETWORKS:
            self._modules.pop(name, None)
            self.__dict__.pop(name, None)
        for name in _NETWORKS:
            setattr(self, name, networks[name])
        self.optimizer = optimizer
        if next(self.parameters(), None) is not None:
            self.device = str(next(self.parameters()).device)

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() / .cpu() move the networks; batches follow them to the same device
        super()._apply(fn, recurse)
        self.device = str(next(self.parameters()).device)
        return self

    def _pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        pairs = [(self.model, self.target_model), (self.q, self.target_q)]
        return pairs + ([(self.q2, self.target_q2)] if self.double_q else [])

    def _targets(self) -> list[nn.Module]:
        return [t for _, t in self._pairs()]

    # --- forward ---------------------------------------------------------------------------
    def clip_values(self, values: torch.Tensor) -> torch.Tensor:
        if self.value_min is not None or self.value_max is not None:
            return torch.clamp(values, min=self.value_min, max=self.value_max)
        return values

    def forward(self, tokens: torch.Tensor, state_idxs: torch.Tensor, action_idxs: torch.Tensor,
                attn_mask: torch.Tensor | None = None, prefix_embs: torch.Tensor | None = None,
                prefix_attn_mask: torch.Tensor | None = None, remove_prefix_position_embs: bool = False,
                qv_kwargs: dict | None = None, policy_kwargs: dict | None = None, target_kwargs: dict | None = None,
                skip_policy_on_train: bool = False, detach_full_policy: bool = False) -> dict[str, Any]:
        """Values, Q values and policy logits of a batch.

        Args:
            tokens: (B, T) int64.
            state_idxs: (B, S) positions whose hidden state is a state (V is read there).
            action_idxs: (B, A) positions whose hidden state chooses the next token (Q is read there).
            attn_mask: (B, T), 1 for real tokens.
            prefix_embs: (B, P, n_embd) embeddings put before the tokens; see `GPT.forward`.
            prefix_attn_mask: (B, P), 1 for real prefix positions.
            remove_prefix_position_embs: leave position embeddings off the prefix.
            qv_kwargs: keyword arguments of `GPT.forward` that replace the shared ones for the value trunk.
            policy_kwargs: the same for the policy.
            target_kwargs: the same for the target trunk.
            skip_policy_on_train: in training mode, skip the policy (``logits`` None).
            detach_full_policy: run the policy without gradients.

        Returns:
            ``vs`` (B, S); ``target_vs`` (B, S) (V on the target trunk, no
            gradients); ``qs`` (B, A, vocab), a (q1, q2) pair when double_q;
            ``target_qs`` (B, A, vocab) min of the target twins, clipped to
            [value_min, value_max]; ``logits`` (B, T, vocab) or None;
            ``hidden_states`` (B, T, n_embd) of the value trunk.
        """
        self._check_batch(tokens, state_idxs, action_idxs, attn_mask)
        shared = dict(attn_mask=attn_mask, prefix_embs=prefix_embs, prefix_attn_mask=prefix_attn_mask,
                      remove_prefix_position_embs=remove_prefix_position_embs)
        hidden, _ = self.model(tokens, **{**shared, **(qv_kwargs or {})})
        with torch.no_grad():
            target_hidden, _ = self.target_model(tokens, **{**shared, **(target_kwargs or {})})
        states, actions = _gather(hidden, state_idxs), _gather(hidden, action_idxs)
        vs = self.v(states.detach() if self.detach_v else states).squeeze(2)
        actions_in = actions.detach() if self.detach_q else actions
        qs = (self.q(actions_in), self.q2(actions_in)) if self.double_q else self.q(actions_in)
        with torch.no_grad():
            target_actions = _gather(target_hidden, action_idxs)
            target_qs = self.target_q(target_actions)
            if self.double_q:
                target_qs = torch.minimum(target_qs, self.target_q2(target_actions))
            target_vs = self.v(_gather(target_hidden, state_idxs)).squeeze(2)
        logits = None
        if not (skip_policy_on_train and self.training):
            with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_full_policy):
                policy_args = {**shared, **(policy_kwargs or {})}
                if self.detach_pi:
                    with torch.no_grad():
                        trunk, _ = self.actor(tokens, **policy_args)
                    logits = self.actor.lm_head(trunk)
                else:
                    _, logits = self.actor(tokens, **policy_args)
        return {"vs": vs, "target_vs": target_vs, "qs": qs, "target_qs": self.clip_values(target_qs),
                "logits": logits, "hidden_states": hidden}

    def _check_batch(self, tokens, state_idxs, action_idxs, attn_mask) -> None:
        for name, t in (("tokens", tokens), ("state_idxs", state_idxs), ("action_idxs", action_idxs)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype not in (torch.int64, torch.int32):
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"ILQL: {name} must be a (B, N) int64 tensor, got {got}.")
        B, T = tokens.shape
        if state_idxs.shape[0] != B or action_idxs.shape[0] != B:
            raise ValueError(f"ILQL: batch sizes differ: tokens {B}, state_idxs {state_idxs.shape[0]}, "
                             f"action_idxs {action_idxs.shape[0]}.")
        if attn_mask is not None and (not isinstance(attn_mask, torch.Tensor) or tuple(attn_mask.shape) != (B, T)):
            got = tuple(attn_mask.shape) if isinstance(attn_mask, torch.Tensor) else type(attn_mask).__name__
            raise ValueError(f"ILQL: attn_mask must be a tensor of the shape of tokens {(B, T)} (1 for real tokens, "
                             f"0 for padding), got {got}.")
        vocab = self.net_config["vocab_size"]
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(f"ILQL: token ids must lie in [0, {vocab}) (net_config['vocab_size']), got "
                             f"[{tokens.min().item()}, {tokens.max().item()}].")
        for name, idx in (("state_idxs", state_idxs), ("action_idxs", action_idxs)):
            if idx.numel() and (idx.min() < 0 or idx.max() >= T):
                raise ValueError(f"ILQL: {name} must index positions 0..{T - 1} of tokens, got "
                                 f"[{idx.min().item()}, {idx.max().item()}].")

    # --- loss terms (AgileRL's names and argument order) --------------------------------
    def get_downstream_rs(self, rs: torch.Tensor, gamma: float) -> torch.Tensor:
        """Discounted reward-to-go: out[:, t] = sum_k>=t gamma^(k-t) rs[:, k]. rs (B, A) -> (B, A)."""
        out = torch.zeros_like(rs)
        running = torch.zeros_like(rs[:, 0])
        for t in range(rs.shape[1] - 1, -1, -1):
            running = rs[:, t] + gamma * running
            out[:, t] = running
        return out

    def get_weights(self, tokens: torch.Tensor, vs: torch.Tensor, qs: torch.Tensor, state_idxs: torch.Tensor,
                    action_idxs: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        """Per-token policy weights (B, T): exp(beta (Q - V)) (or the binary variant) at action
        positions, ``transition_weight`` elsewhere, clipped at ``clip_weight``. vs, qs (B, A)."""
        weights = torch.full(tokens.shape, float(self.transition_weight), device=tokens.device)
        advantage = qs - vs
        if self.exp_weights:
            w = torch.exp(self.beta * advantage)
        else:
            positive = (advantage > 0).float()
            w = self.beta * positive + (1 - self.beta) * (1 - positive)
        valid = terminals[:, :-1] == 0  # padded actions keep the transition weight
        rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None].expand_as(action_idxs)
        weights[rows[valid], action_idxs[valid]] = w[valid].to(weights.dtype)
        if self.clip_weight is not None:
            weights = torch.clamp(weights, max=self.clip_weight)
        return weights

    def awac_loss(self, tokens: torch.Tensor, attn_mask: torch.Tensor, logits: torch.Tensor,
                  w: torch.Tensor) -> torch.Tensor:
        """Weighted next-token cross-entropy of the policy over real tokens."""
        w = w.detach()
        losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                                 reduction="none").reshape(tokens.shape[0], -1)
        mask = attn_mask[:, 1:]
        return (losses * w[:, :-1] * mask).sum() / mask.sum().clamp(min=1.0)

    @staticmethod
    def _masked_mean(x: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        live = 1 - terminals[:, :-1]
        return (x * live).sum() / live.sum().clamp(min=1.0)

    def get_v_loss(self, vs: torch.Tensor, target_qs: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        """Expectile regression of V towards the target Q of the taken action (expectile tau). (B, A)."""
        diff = target_qs.detach() - vs
        weight = torch.where(diff >= 0, self.tau, 1 - self.tau)
        return self._masked_mean(weight * diff ** 2, terminals)

    def get_q_loss(self, vns: torch.Tensor, qs, rs: torch.Tensor, gamma: float, terminals: torch.Tensor) -> torch.Tensor:
        """TD loss of Q (each twin) towards rs + gamma (1 - done') V(s'). qs: (B, A) or a pair."""
        target = rs + gamma * (1 - terminals[:, 1:]) * vns.detach()
        twins = qs if isinstance(qs, tuple) else (qs,)
        return sum(self._masked_mean((target - q) ** 2, terminals) for q in twins)

    def get_cql_loss(self, qs, action_tokens: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        """CQL: cross-entropy of softmax(Q / cql_temp) against the data's actions. qs: (B, A, vocab) or a pair."""
        twins = qs if isinstance(qs, tuple) else (qs,)
        total = 0.0
        for q in twins:
            B, A, V = q.shape
            ce = F.cross_entropy(q.reshape(-1, V) / self.cql_temp, action_tokens.reshape(-1), reduction="none")
            total = total + self._masked_mean(ce.reshape(B, A), terminals)
        return total

    def get_dm_loss(self, qs, data_qs, terminals: torch.Tensor, margin: float) -> torch.Tensor:
        """Penalise any action's Q above the data action's Q minus ``margin``: sum over the vocabulary
        of max(Q(s, a) - Q(s, a_data) + margin, 0)^2. qs (B, A, vocab), data_qs (B, A), or pairs."""
        pairs = zip(qs, data_qs) if isinstance(qs, tuple) else [(qs, data_qs)]
        total = 0.0
        for q, data_q in pairs:
            excess = torch.clamp(q - data_q.unsqueeze(-1) + margin, min=0.0) ** 2
            total = total + self._masked_mean(excess.sum(-1), terminals)
        return total

    # --- training ----------------------------------------------------------------------------
    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        needed = ("tokens", "attn_mask", "state_idxs", "action_idxs", "rewards", "terminals")
        if not isinstance(batch, dict):
            raise TypeError(f"ILQL batch must be a dict of tensors with keys {list(needed)}, got "
                            f"{type(batch).__name__} (see workbench.models.toy_language.ToyLanguageDataset.collate).")
        missing = [k for k in needed if k not in batch]
        if missing:
            raise KeyError(f"ILQL batch is missing {missing}; a batch has {list(needed)} "
                           "(see workbench.models.toy_language.ToyLanguageDataset.collate).")
        not_tensors = [k for k in needed if not isinstance(batch[k], torch.Tensor)]
        if not_tensors:
            raise TypeError(f"ILQL batch: {not_tensors} must be tensors, got "
                            f"{[type(batch[k]).__name__ for k in not_tensors]}.")
        b, a = batch["tokens"].shape[:1], batch["action_idxs"].shape
        # the other layouts follow the actions': (B, A) and (B, A + 1); tokens themselves are checked in forward
        if len(a) == 2 and batch["tokens"].dim() == 2:
            shapes = {"state_idxs": (*b, a[1] + 1), "rewards": (*b, a[1]), "terminals": (*b, a[1] + 1)}
            wrong = {k: tuple(batch[k].shape) for k, want in shapes.items() if tuple(batch[k].shape) != want}
            if wrong:
                listed = ", ".join(f"{k} must be {shapes[k]}, got {v}" for k, v in wrong.items())
                raise ValueError(f"ILQL batch: with tokens of {tuple(batch['tokens'].shape)} and action_idxs of "
                                 f"{tuple(a)} (B, A), {listed} (state_idxs and terminals (B, A + 1), rewards (B, A)).")
        return {k: batch[k].to(self.device) for k in needed}

    def get_loss(self, batch: dict[str, torch.Tensor], awac_weight: float = 1.0, v_loss_weight: float = 1.0,
                 q_loss_weight: float = 1.0, cql_loss_weight: float = 0.01, dm_loss_weight: float = 0.0,
                 mc_returns: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The ILQL loss of a batch.

        Args:
            batch: ``tokens``, ``attn_mask``, ``state_idxs``, ``action_idxs``, ``rewards``, ``terminals``.
            awac_weight: weight of the AWAC (advantage-weighted token) loss.
            v_loss_weight: weight of the expectile V loss.
            q_loss_weight: weight of the Q regression loss.
            cql_loss_weight: weight of the conservative (CQL) loss.
            dm_loss_weight: weight of the distribution-matching margin loss.
            mc_returns: regress V on the discounted return-to-go instead of the target Q.

        Returns:
            The weighted total and a dict of the terms (``token_loss``, ``v_loss``,
            ``q_loss``, ``cql_loss``, ``dm_loss``) with ``mean_q``, ``mean_v``,
            ``mean_advantage`` (over real actions, detached).
        """
        b = self._to_device(batch)
        out = self(b["tokens"], b["state_idxs"], b["action_idxs"], b["attn_mask"])
        return self._loss_terms(b, out, awac_weight, v_loss_weight, q_loss_weight, cql_loss_weight,
                                dm_loss_weight, mc_returns)

    def _loss_terms(self, b, out, awac_weight, v_loss_weight, q_loss_weight, cql_loss_weight, dm_loss_weight,
                    mc_returns):
        tokens, terminals, rs = b["tokens"], b["terminals"], b["rewards"]
        action_tokens = torch.gather(tokens, 1, b["action_idxs"] + 1)  # the token each action chose, (B, A)
        pick = lambda q: torch.gather(q, 2, action_tokens.unsqueeze(2)).squeeze(2)  # noqa: E731
        full_qs = out["qs"]
        data_qs = tuple(pick(q) for q in full_qs) if self.double_q else pick(full_qs)
        target_qs = pick(out["target_qs"])
        vs = out["vs"]
        vt, vtp1 = vs[:, :-1], vs[:, 1:]
        with torch.no_grad():
            weights = self.get_weights(tokens, vt, target_qs, b["state_idxs"], b["action_idxs"], terminals)
        v_target = self.get_downstream_rs(rs, self.gamma) if mc_returns else target_qs
        terms = {
            "token_loss": self.awac_loss(tokens, b["attn_mask"], out["logits"], weights),
            "v_loss": self.get_v_loss(vt, v_target, terminals),
            "q_loss": self.get_q_loss(vtp1, data_qs, rs, self.gamma, terminals),
            "cql_loss": self.get_cql_loss(full_qs, action_tokens, terminals),
            "dm_loss": self.get_dm_loss(full_qs, data_qs, terminals, self.dm_margin),
        }
        loss = (awac_weight * terms["token_loss"] + v_loss_weight * terms["v_loss"] + q_loss_weight * terms["q_loss"]
                + cql_loss_weight * terms["cql_loss"] + dm_loss_weight * terms["dm_loss"])
        with torch.no_grad():
            q_min = torch.minimum(*data_qs) if self.double_q else data_qs
            terms["mean_q"] = self._masked_mean(q_min, terminals)
            terms["mean_v"] = self._masked_mean(vt, terminals)
            terms["mean_advantage"] = self._masked_mean(q_min - vt, terminals)
        return loss, terms

    def learn(self, batch: dict[str, torch.Tensor], **loss_weights: Any) -> dict[str, float]:
        """One AdamW step on the ILQL loss of ``batch``, then :meth:`soft_update`.

        Returns:
            ``loss`` and every term of :meth:`get_loss` as floats.
        """
        self.train()
        loss, terms = self.get_loss(batch, **loss_weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.soft_update()
        self.steps[-1] += 1
        return {"loss": loss.item(), **{k: v.item() for k, v in terms.items()}}

    @torch.no_grad()
    def soft_update(self) -> None:
        """Polyak averaging of the targets: target <- alpha * online + (1 - alpha) * target."""
        for online, target in self._pairs():
            for p, t in zip(online.parameters(), target.parameters()):
                t.mul_(1 - self.alpha).add_(p, alpha=self.alpha)
            for b, tb in zip(online.buffers(), target.buffers()):
                tb.copy_(b)

    @torch.no_grad()
    def hardUpdate(self) -> None:  # noqa: N802 (AgileRL's name)
        """Copy the online networks into the targets."""
        for online, target in self._pairs():
            target.load_state_dict(online.state_dict())

    # --- decoding ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, max_length: Annotated[int, Range(0, None)], beta: float = 1.0,
                 temperature: float = 1.0,
                 eos_token_id: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuations from ILQL's perturbed policy: softmax((logits + beta (Q - V)) / temperature).

        Q is the minimum of the target twins (clipped), V the value head, both
        at the last position; ``beta=0`` samples the policy alone.

        Args:
            prompts: (B, P) int64 prompts (no padding).
            max_length: tokens to add at most.
            beta: weight of the advantage Q - V added to the policy's logits.
            temperature: > 0; smaller is greedier.
            eos_token_id: rows stop after this token (the dataset tokenizer's by default);
                finished rows are padded with ``pad``.
            generator: random source of the sampling.

        Returns:
            (B, P + n) tokens, n <= max_length.
        """
        check_arguments(ILQL.generate, "ILQL.generate", max_length=max_length, beta=beta, temperature=temperature,
                        eos_token_id=eos_token_id)
        if temperature <= 0:  # an open bound, which a Range (inclusive) cannot state
            raise ValueError(f"ILQL.generate: temperature must be > 0 (smaller is greedier), got {temperature!r}.")
        vocab = self.net_config["vocab_size"]
        if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2 \
                or prompts.dtype not in (torch.int64, torch.int32):
            got = (f"{tuple(prompts.shape)} {prompts.dtype}" if isinstance(prompts, torch.Tensor)
                   else type(prompts).__name__)
            raise ValueError(f"ILQL.generate: prompts must be a (B, P) int64 tensor of token ids, got {got}.")
        if prompts.shape[1] == 0:
            raise ValueError(f"ILQL.generate: prompts of shape {tuple(prompts.shape)} have no tokens; give each row "
                             "at least one (e.g. <bos>).")
        if prompts.numel() and (prompts.min() < 0 or prompts.max() >= vocab):
            raise ValueError(f"ILQL.generate: token ids must lie in [0, {vocab}), got "
                             f"[{prompts.min().item()}, {prompts.max().item()}].")
        tokenizer = getattr(self.dataset, "tokenizer", None)
        eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", 0)
        was_training = self.training
        self.eval()
        try:
            tokens = prompts.to(self.device)
            done = torch.zeros(len(tokens), dtype=torch.bool, device=self.device)
            for _ in range(max_length):
                last = torch.full((len(tokens), 1), tokens.shape[1] - 1, device=self.device)
                _, logits = self.actor(tokens)
                hidden, _ = self.target_model(tokens)
                h = _gather(hidden, last)
                q = self.target_q(h)
                if self.double_q:
                    q = torch.minimum(q, self.target_q2(h))
                advantage = self.clip_values(q) - self.v(_gather(self.model(tokens)[0], last))
                scores = (logits[:, -1] + beta * advantage[:, 0]) / temperature
                probs = torch.softmax(scores.float(), -1)
                nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(self.device)[:, 0]
                nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
                tokens = torch.cat([tokens, nxt[:, None]], 1)
                if eos is not None:
                    done |= nxt == eos
                    if done.all():
                        break
            return tokens
        finally:
            self.train(was_training)

    # --- population utilities and checkpoints ------------------------------------------
    def clone(self, index: int | None = None) -> ILQL:
        """An independent agent with identical weights, optimizer state and hyperparameters."""
        twin = ILQL(self.dataset, self.net_config,
                    **{**self.hyperparameters, "index": self.index if index is None else index})
        twin.load_state_dict(self.state_dict())
        twin.optimizer.load_state_dict(self.optimizer.state_dict())
        twin.fitness, twin.scores, twin.steps = list(self.fitness), list(self.scores), list(self.steps)
        return twin

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Save weights, optimizer state and hyperparameters to ``path``.

        The file is written next to ``path`` and moved into place in one
        rename, so a crash leaves the old file or the new one, never half of one.
        """
        path = Path(path)
        state = {
            "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
            "net_config": self.net_config,
            "hyperparameters": self.hyperparameters,
            "network": self.state_dict(), "optimizer": self.optimizer.state_dict(),
            "fitness": list(self.fitness), "scores": list(self.scores), "steps": list(self.steps),
        }
        write_checkpoint(state, path)

    def load_checkpoint(self, path: str | os.PathLike, device: str | torch.device | None = None,
                        memory_limit: Any = None) -> None:
        """Restore an agent saved by :meth:`save_checkpoint` (networks are rebuilt to its net_config).

        Loading reads tensors and plain data only (``torch.load(weights_only=True)``):
        a file cannot run code. Everything is checked before anything changes: the
        net_config, the hyperparameters (by the constructor's rules), the device, the
        memory the networks would take, and the keys, shapes and dtypes of every
        network's and the optimizer's state. A failed load leaves the agent as it was.

        Args:
            path: the checkpoint file.
            device: where to put the networks; by default the device the checkpoint
                names (its ``device`` hyperparameter), e.g. ``device="cpu"`` loads a
                GPU checkpoint on a machine without one.
            memory_limit: the most bytes the networks and optimizer state may take
                (an int or a size such as ``'16GB'``; ``'off'`` skips the check); by
                default the environment variable ``WORKBENCH_MEMORY_LIMIT``, else 80 %
                of the memory available on the device.

        Raises:
            FileNotFoundError: no such file.
            CheckpointError: damaged, not an ILQL checkpoint, a newer version, or a value,
                key, shape or dtype that does not fit (the message names it).
            workbench.params.MemoryLimitError: the net_config it asks for would not fit.
        """
        if device is not None:  # the argument first: a bad one is the caller's, not the file's
            check_hyperparameters({**self.hyperparameters, "device": device}, owner="load_checkpoint")
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"No checkpoint at {str(path)!r}.")
        where = repr(str(path))
        from workbench import checkpoints  # (its reader's messages: a truncated file, a pickled object, a folder)

        try:  # (no size limit here: the memory the net_config asks for is checked below)
            state = checkpoints.read_checkpoint(path, max_bytes=max(1, path.stat().st_size))
        except checkpoints.CheckpointError as exc:
            raise CheckpointError(str(exc).replace("Save it again with torch.save(...)",
                                                   "Save it again with ILQL.save_checkpoint()")) from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{where} is not an ILQL checkpoint (no '{CHECKPOINT_FORMAT}' marker); "
                                  "save one with ILQL.save_checkpoint().")
        version = state.get("version", 0)
        if not matches(version, int):
            raise CheckpointError(f"{where} has a version {version!r} that is not an int; it is damaged.")
        if version > CHECKPOINT_VERSION:
            raise CheckpointError(f"{where} is checkpoint version {version}; this workbench reads up "
                                  f"to {CHECKPOINT_VERSION}. Upgrade workbench.")
        needed = ("net_config", "hyperparameters", "network", "optimizer", "fitness", "scores", "steps")
        missing = [k for k in needed if k not in state]
        if missing:
            raise CheckpointError(f"{where} lacks {missing}; a checkpoint written by ILQL.save_checkpoint() has "
                                  f"{list(needed)}. It is damaged or incomplete.")
        problem = f"{where} does not fit: "
        try:
            net_config = check_net_config(state["net_config"])
            if not isinstance(state["hyperparameters"], dict):
                raise TypeError(f"hyperparameters must be a dict, got {type(state['hyperparameters']).__name__}")
            given = dict(state["hyperparameters"])
            if device is not None:
                given["device"] = device
            hyperparameters = check_hyperparameters(given, owner="hyperparameters")
            _check_vocab(net_config, self.dataset)
            fitness, scores, steps = (number_list(state[k], k, integer=k == "steps")
                                      for k in ("fitness", "scores", "steps"))
        except (TypeError, ValueError) as err:
            hint = (" Or load it onto another device: load_checkpoint(path, device='cpu')."
                    if str(err).startswith("hyperparameters: device") else "")
            raise CheckpointError(f"{problem}{err}{hint}") from None
        double_q, target = hyperparameters["double_q"], hyperparameters["device"]
        check_memory(estimate_memory(net_config, double_q),
                     f"The checkpoint {where} (net_config n_layer={net_config['n_layer']}, n_embd="
                     f"{net_config['n_embd']}, block_size={net_config['block_size']}, vocab_size="
                     f"{net_config['vocab_size']})", memory_limit, target)
        with torch.device("meta"):  # the layout the net_config asks for: shapes only, nothing allocated
            layout = _make_networks(net_config, double_q)
        check_state(_holder(layout).state_dict(), state["network"], f"{problem}network")
        check_optimizer(state["optimizer"], _trainable(layout), f"{problem}optimizer")
        # every check passed: build and fill new networks beside the old ones, then swap them in
        try:
            networks = _make_networks(net_config, double_q)
            holder = _holder(networks).to(target)
            holder.load_state_dict(state["network"])
            optimizer = _make_optimizer(networks, hyperparameters["lr"], hyperparameters["weight_decay"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as err:
            first = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
            raise CheckpointError(f"{problem}{first}") from None
        self.net_config = net_config
        self.__dict__.update(hyperparameters)
        self._install(networks, optimizer)
        self.fitness, self.scores, self.steps = fitness, scores, steps


def _holder(networks: dict[str, nn.Module | None]) -> nn.Module:
    """A module holding ``networks`` under the agent's names: its state_dict has the agent's keys."""
    holder = nn.Module()
    for name in _NETWORKS:
        if networks[name] is not None:
            holder.add_module(name, networks[name])
    return holder



# --- registry ---------------------------------------------------------------------------

def _example_inputs(model: ILQL, batch_size: int, generator: torch.Generator | None = None):
    batch = model.dataset.sample(batch_size, generator)
    return (batch["tokens"], batch["state_idxs"], batch["action_idxs"]), {"attn_mask": batch["attn_mask"]}


def _objective(model: ILQL, inputs, outputs: dict[str, Any]) -> torch.Tensor:
    """The ILQL loss, with the toy task's rewards recomputed from the tokens."""
    (tokens, _, _), _ = inputs
    batch = model.dataset.collate(tokens)
    defaults = {k: p.default for k, p in inspect.signature(ILQL.get_loss).parameters.items() if k not in ("self", "batch")}
    loss, _ = model._loss_terms(batch, outputs, **defaults)  # the weights get_loss uses by default
    return loss


def _registry_config(n_layer: int, n_embd: int, n_head: int, block_size: int, dropout: float, activation: str,
                     vocab_size: int) -> dict[str, Any]:
    return {**TINY_CONFIG, "vocab_size": vocab_size, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
            "block_size": block_size, "dim_feedfwd": 4 * n_embd, "dropout": dropout, "activation": activation,
            "max_layers": max(TINY_CONFIG["max_layers"], n_layer)}


def _memory(n_layer: int, n_embd: int, n_head: int, block_size: int, dropout: float, activation: str,
            double_q: bool, dataset_size: int, **kwargs: Any) -> int | None:
    """Bytes of every network's parameters (the optimizer's moments come at the first step) and the data."""
    config = _registry_config(n_layer, n_embd, n_head, block_size, dropout, activation, ToyLanguageDataset.VOCAB_SIZE)
    networks = estimate_memory(config, double_q)
    return None if networks is None else networks["networks"] + ToyLanguageDataset.estimate_bytes(dataset_size)


@register_model("ilql", family="rl", example_inputs=_example_inputs, objective=_objective, memory=_memory)
def ilql(n_layer: Annotated[int, Range(1, 48)] = 2, n_embd: Annotated[int, Range(8, 4096)] = 64,
         n_head: Annotated[int, Range(1, 64)] = 4, block_size: Annotated[int, Range(8, 4096)] = 64,
         dropout: Annotated[float, Range(0.0, 0.9)] = 0.0, lr: Annotated[float, Range(1e-7, 1.0)] = 1e-3,
         alpha: Annotated[float, Range(0.0, 1.0)] = 0.005, tau: Annotated[float, Range(0.01, 0.99)] = 0.7,
         gamma: Annotated[float, Range(0.0, 1.0)] = 0.99, double_q: bool = True,
         activation: Annotated[str, Choices(lambda: list_models(family="activation"))] = "gelu",
         dataset_size: Annotated[int, Range(1, 1_000_000)] = 2048,
         seed: Annotated[int, Range(0, SEED_MAX)] = 0) -> ILQL:
    """ILQL agent (AgileRL-compatible), tiny GPT on the built-in colour-naming task.

    Args:
        n_layer: transformer blocks per GPT.
        n_embd: embedding width.
        n_head: attention heads (must divide n_embd).
        block_size: longest sequence.
        dropout: dropout rate.
        lr: AdamW learning rate.
        alpha: Polyak rate of the target networks.
        tau: expectile of the value loss.
        gamma: discount.
        double_q: twin Q heads.
        activation: the GPT blocks' activation, any registered activation.
        dataset_size: sequences in the offline toy dataset.
        seed: seed of the toy dataset (its range is the signature's).
    """
    if n_embd % n_head:
        raise ValueError(f"Model 'ilql': n_embd ({n_embd}) must be divisible by n_head ({n_head}); e.g. "
                         f"n_head={math.gcd(n_embd, n_head)} or n_embd={n_embd + n_head - n_embd % n_head}.")
    dataset = ToyLanguageDataset(size=dataset_size, seed=seed)
    config = _registry_config(n_layer, n_embd, n_head, block_size, dropout, activation, dataset.tokenizer.vocab_size)
    return ILQL(dataset, config, lr=lr, alpha=alpha, tau=tau, gamma=gamma, double_q=double_q)
