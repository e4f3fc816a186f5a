"""Implicit Language Q-Learning (Snell et al., 2022) with AgileRL's ``ILQL`` interface.

``ILQL(dataset, net_config, ...)`` takes AgileRL's arguments and has its
methods (``forward``, ``get_downstream_rs``, ``get_weights``, ``awac_loss``,
``get_v_loss``, ``get_q_loss``, ``get_cql_loss``, ``get_dm_loss``,
``get_loss``, ``learn``, ``soft_update``, ``hardUpdate``, ``clone``,
``save_checkpoint``, ``load_checkpoint``), written here without agilerl.

Networks (GPT blocks as in nanoGPT, written compactly)::

    model          GPT trunk read by the value heads        tokens -> (B, T, n_embd)
    target_model   Polyak copy of ``model``                  (no gradients)
    actor          policy GPT trunk, ``pi`` its head         tokens -> (B, T, vocab) logits
    v              MLP n_embd -> 2n -> 2n -> 1                V(s) at ``state_idxs``
    q, q2          MLP n_embd -> 2n -> 2n -> vocab            Q(s, .) at ``action_idxs`` (q2 when double_q)
    target_q(2)    Polyak copies of q (and q2)

Decoding (:meth:`ILQL.generate`) samples from the policy's logits shifted by
``beta * (Q - V)``: ILQL's perturbed policy.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import math
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.toy_language import ToyLanguageDataset
from workbench.params import Choices, Range
from workbench.registry import create_model, list_models, register_model

__all__ = ["ILQL", "GPT", "GPT2_CONFIG", "TINY_CONFIG", "CheckpointError"]

GPT2_CONFIG = {  # the seed's default: GPT-2 small
    "arch": "gpt", "vocab_size": 50257, "n_layer": 12, "n_embd": 768, "n_head": 12, "dim_feedfwd": 3072,
    "block_size": 1024, "activation": "GELU", "dropout": 0.1, "layer_norm_eps": 1e-5, "min_layers": 8,
    "max_layers": 16, "bias": True,
}
TINY_CONFIG = {  # a CPU-sized GPT for the built-in toy task
    "arch": "gpt", "vocab_size": 16, "n_layer": 2, "n_embd": 64, "n_head": 4, "dim_feedfwd": 256,
    "block_size": 64, "activation": "GELU", "dropout": 0.0, "layer_norm_eps": 1e-5, "min_layers": 1,
    "max_layers": 4, "bias": True,
}
_CHECKPOINT_FORMAT = "workbench.ILQL"
_CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint file that is not an ILQL checkpoint of a version this code reads, or is damaged."""


def check_net_config(net_config: Any) -> dict[str, Any]:
    """Validate a GPT net_config; returns a copy. Errors name the key, the value and the fix."""
    if not isinstance(net_config, dict):
        raise TypeError(f"net_config must be a dict with keys {sorted(GPT2_CONFIG)}, got {type(net_config).__name__}.")
    unknown = [k for k in net_config if k not in GPT2_CONFIG]
    if unknown:
        hints = {k: difflib.get_close_matches(k, list(GPT2_CONFIG), n=1) for k in unknown}
        text = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise ValueError(f"net_config has unknown key(s) {text}; the keys are {sorted(GPT2_CONFIG)}.")
    missing = [k for k in GPT2_CONFIG if k not in net_config]
    if missing:
        raise ValueError(f"net_config is missing {missing}; e.g. workbench.models.ilql.GPT2_CONFIG has them all.")
    c = dict(net_config)
    if c["arch"] != "gpt":
        raise ValueError(f"net_config['arch'] must be 'gpt' (the only architecture ILQL uses), got {c['arch']!r}.")
    for key in ("vocab_size", "n_layer", "n_embd", "n_head", "dim_feedfwd", "block_size", "min_layers", "max_layers"):
        if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] < 1:
            raise ValueError(f"net_config[{key!r}] must be a positive int, got {c[key]!r}.")
    if c["n_embd"] % c["n_head"]:
        raise ValueError(f"net_config: n_embd ({c['n_embd']}) must be divisible by n_head ({c['n_head']}).")
    if not c["min_layers"] <= c["n_layer"] <= c["max_layers"]:
        raise ValueError(f"net_config: n_layer ({c['n_layer']}) must lie within min_layers..max_layers "
                         f"({c['min_layers']}..{c['max_layers']}).")
    if not isinstance(c["dropout"], (int, float)) or not 0 <= c["dropout"] < 1:
        raise ValueError(f"net_config['dropout'] must be in [0, 1), got {c['dropout']!r}.")
    if not isinstance(c["layer_norm_eps"], (int, float)) or c["layer_norm_eps"] <= 0:
        raise ValueError(f"net_config['layer_norm_eps'] must be > 0, got {c['layer_norm_eps']!r}.")
    if not isinstance(c["bias"], bool):
        raise ValueError(f"net_config['bias'] must be True or False, got {c['bias']!r}.")
    name = str(c["activation"]).lower()
    if name not in list_models(family="activation"):
        raise ValueError(f"net_config['activation'] {c['activation']!r} is not a registered activation; "
                         f"choose one of {list_models(family='activation')} (any case).")
    return c


# --- the GPT (nanoGPT's layout) -------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.n_head, self.dropout = c["n_head"], c["dropout"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.resid_dropout = nn.Dropout(c["dropout"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_eps"], bias=c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_eps"], bias=c["bias"])
        self.mlp = nn.Sequential(
            nn.Linear(c["n_embd"], c["dim_feedfwd"], bias=c["bias"]),
            create_model(str(c["activation"]).lower()),
            nn.Linear(c["dim_feedfwd"], c["n_embd"], bias=c["bias"]),
            nn.Dropout(c["dropout"]),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT trunk: token + position embeddings, blocks, final LayerNorm; optional LM head.

    Args:
        net_config: a validated net_config (see :data:`GPT2_CONFIG`).
        lm_head: add a linear head to vocabulary logits (the policy's).
    """

    def __init__(self, net_config: dict[str, Any], lm_head: bool = False) -> None:
        super().__init__()
        c = net_config
        self.block_size, self.n_embd = c["block_size"], c["n_embd"]
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.drop = nn.Dropout(c["dropout"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_eps"], bias=c["bias"])
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False) if lm_head else None
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor, attn_mask: torch.Tensor | None = None,
                prefix_embs: torch.Tensor | None = None, prefix_attn_mask: torch.Tensor | None = None,
                remove_prefix_position_embs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states of the token positions (prefix positions dropped) and LM logits.

        Args:
            tokens: (B, T) int64.
            attn_mask: (B, T), 1 for real tokens, 0 for padding (keys masked out).
            prefix_embs: (B, P, n_embd) embeddings placed before the tokens.
            prefix_attn_mask: (B, P) mask of the prefix.
            remove_prefix_position_embs: give the prefix no position embeddings
                (the tokens then start at position 0).

        Returns:
            hidden (B, T, n_embd) and logits (B, T, vocab) or None without an LM head.
        """
        B, T = tokens.shape
        x = self.wte(tokens)
        mask = torch.ones(B, T, dtype=torch.bool, device=tokens.device) if attn_mask is None else attn_mask.bool()
        P = 0
        if prefix_embs is not None:
            P = prefix_embs.shape[1]
            prefix_mask = (torch.ones(B, P, dtype=torch.bool, device=tokens.device) if prefix_attn_mask is None
                           else prefix_attn_mask.bool())
            x, mask = torch.cat([prefix_embs, x], 1), torch.cat([prefix_mask, mask], 1)
        positions = T if (prefix_embs is not None and remove_prefix_position_embs) else P + T
        if positions > self.block_size:
            raise ValueError(f"GPT: sequence of {positions} positions exceeds block_size {self.block_size}; "
                             "use shorter inputs or a larger net_config['block_size'].")
        pos = self.wpe(torch.arange(positions, device=tokens.device))
        if prefix_embs is not None and remove_prefix_position_embs:
            x = torch.cat([x[:, :P], x[:, P:] + pos], 1)
        else:
            x = x + pos
        S = P + T
        causal = torch.ones(S, S, dtype=torch.bool, device=tokens.device).tril()
        # padding keys are masked; a query always sees itself so that no row is fully masked
        attend = (causal & mask[:, None, :]) | torch.eye(S, dtype=torch.bool, device=tokens.device)
        x = self.drop(x)
        for block in self.h:
            x = block(x, attend[:, None])  # (B, 1, S, S) broadcast over heads
        hidden = self.ln_f(x)[:, P:]  # (B, T, n_embd)
        return hidden, (self.lm_head(hidden) if self.lm_head is not None else None)


def _mlp_head(n_embd: int, out: int, dropout: float) -> nn.Sequential:
    """Two hidden layers of 2 n_embd, as ILQL's value and Q heads."""
    return nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(2 * n_embd, 2 * n_embd), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(2 * n_embd, out))


def _gather(x: torch.Tensor, idxs: torch.Tensor) -> torch.Tensor:
    """x (B, T, C) at positions idxs (B, N) -> (B, N, C)."""
    return torch.gather(x, 1, idxs.unsqueeze(2).expand(-1, -1, x.shape[2]))


# --- the agent ----------------------------------------------------------------------------

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
        arguments = locals()
        self.__dict__.update({k: arguments[k] for k in _HYPERPARAMETERS})
        self.device = str(device)
        self._check_hyperparameters()
        self.net_config = check_net_config(copy.deepcopy(GPT2_CONFIG if net_config is None else net_config))
        tokenizer = getattr(dataset, "tokenizer", None)
        if tokenizer is not None and tokenizer.vocab_size > self.net_config["vocab_size"]:
            raise ValueError(f"net_config['vocab_size'] ({self.net_config['vocab_size']}) is smaller than the "
                             f"dataset's vocabulary ({tokenizer.vocab_size}); set it to at least that.")
        self.fitness: list[float] = []
        self.scores: list[float] = []
        self.steps: list[int] = [0]
        self._build()

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The constructor's arguments besides dataset and net_config, as the attributes hold them now."""
        return {k: getattr(self, k) for k in _HYPERPARAMETERS}

    def _check_hyperparameters(self) -> None:
        h = self.hyperparameters
        checks = {
            "batch_size": isinstance(h["batch_size"], int) and h["batch_size"] >= 1,
            "lr": h["lr"] > 0, "alpha": 0 <= h["alpha"] <= 1, "gamma": 0 <= h["gamma"] <= 1,
            "tau": 0 < h["tau"] < 1, "cql_temp": h["cql_temp"] > 0, "weight_decay": h["weight_decay"] >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ILQL: {name}={h[name]!r} is out of range (batch_size >= 1, lr > 0, "
                                 "0 <= alpha <= 1, 0 <= gamma <= 1, 0 < tau < 1, cql_temp > 0, weight_decay >= 0).")
        if not h["per_token"]:
            raise ValueError("ILQL: per_token=False (utterance-level ILQL) is not implemented; use per_token=True.")
        if h["value_min"] is not None and h["value_max"] is not None and h["value_min"] > h["value_max"]:
            raise ValueError(f"ILQL: value_min ({h['value_min']}) is above value_max ({h['value_max']}).")

    def _build(self) -> None:
        c, vocab, n_embd = self.net_config, self.net_config["vocab_size"], self.net_config["n_embd"]
        self.model = GPT(c)
        self.actor = GPT(c, lm_head=True)
        self.v = _mlp_head(n_embd, 1, c["dropout"])
        self.q = _mlp_head(n_embd, vocab, c["dropout"])
        self.q2 = _mlp_head(n_embd, vocab, c["dropout"]) if self.double_q else None
        self.target_model = copy.deepcopy(self.model)
        self.target_q = copy.deepcopy(self.q)
        self.target_q2 = copy.deepcopy(self.q2) if self.double_q else None
        for target in self._targets():
            target.requires_grad_(False)
        self.to(self.device)
        self.optimizer = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.lr,
                                           weight_decay=self.weight_decay)

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
            prefix_embs, prefix_attn_mask, remove_prefix_position_embs: see :meth:`GPT.forward`.
            qv_kwargs, policy_kwargs, target_kwargs: keyword arguments of
                :meth:`GPT.forward` that replace the shared ones for the value
                trunk, the policy and the target trunk.
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
        if attn_mask is not None and tuple(attn_mask.shape) != (B, T):
            raise ValueError(f"ILQL: attn_mask must have the shape of tokens {(B, T)}, got {tuple(attn_mask.shape)}.")
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
        missing = [k for k in needed if k not in batch]
        if missing:
            raise KeyError(f"ILQL batch is missing {missing}; a batch has {list(needed)} "
                           "(see workbench.models.toy_language.ToyLanguageDataset.collate).")
        return {k: batch[k].to(self.device) for k in needed}

    def get_loss(self, batch: dict[str, torch.Tensor], awac_weight: float = 1.0, v_loss_weight: float = 1.0,
                 q_loss_weight: float = 1.0, cql_loss_weight: float = 0.01, dm_loss_weight: float = 0.0,
                 mc_returns: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The ILQL loss of a batch.

        Args:
            batch: ``tokens``, ``attn_mask``, ``state_idxs``, ``action_idxs``, ``rewards``, ``terminals``.
            awac_weight, v_loss_weight, q_loss_weight, cql_loss_weight, dm_loss_weight: term weights.
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
    def generate(self, prompts: torch.Tensor, max_length: int, beta: float = 1.0, temperature: float = 1.0,
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
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
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
            "format": _CHECKPOINT_FORMAT, "version": _CHECKPOINT_VERSION,
            "net_config": self.net_config,
            "hyperparameters": self.hyperparameters,
            "network": self.state_dict(), "optimizer": self.optimizer.state_dict(),
            "fitness": list(self.fitness), "scores": list(self.scores), "steps": list(self.steps),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, path: str | os.PathLike) -> None:
        """Restore an agent saved by :meth:`save_checkpoint` (networks are rebuilt to its net_config).

        Loading reads tensors and plain data only (``torch.load(weights_only=True)``):
        a file cannot run code.

        Raises:
            FileNotFoundError: no such file.
            CheckpointError: damaged, not an ILQL checkpoint, or a newer version.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"No checkpoint at {str(path)!r}.")
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{str(path)!r} is not a readable checkpoint ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0][:200]}). It may be damaged or not a torch file.") from None
        if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
            raise CheckpointError(f"{str(path)!r} is not an ILQL checkpoint (no '{_CHECKPOINT_FORMAT}' marker); "
                                  "save one with ILQL.save_checkpoint().")
        if state.get("version", 0) > _CHECKPOINT_VERSION:
            raise CheckpointError(f"{str(path)!r} is checkpoint version {state['version']}; this workbench reads up "
                                  f"to {_CHECKPOINT_VERSION}. Upgrade workbench.")
        self.net_config = check_net_config(state["net_config"])
        self.__dict__.update({k: v for k, v in state["hyperparameters"].items() if k in _HYPERPARAMETERS})
        self._build()
        self.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.fitness, self.scores, self.steps = list(state["fitness"]), list(state["scores"]), list(state["steps"])


_HYPERPARAMETERS = tuple(inspect.signature(ILQL).parameters)[2:]  # index ... device: all but dataset, net_config


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


@register_model("ilql", family="rl", example_inputs=_example_inputs, objective=_objective)
def ilql(n_layer: Annotated[int, Range(1, 48)] = 2, n_embd: Annotated[int, Range(8, 4096)] = 64,
         n_head: Annotated[int, Range(1, 64)] = 4, block_size: Annotated[int, Range(8, 4096)] = 64,
         dropout: Annotated[float, Range(0.0, 0.9)] = 0.0, lr: Annotated[float, Range(1e-7, 1.0)] = 1e-3,
         alpha: Annotated[float, Range(0.0, 1.0)] = 0.005, tau: Annotated[float, Range(0.01, 0.99)] = 0.7,
         gamma: Annotated[float, Range(0.0, 1.0)] = 0.99, double_q: bool = True,
         activation: Annotated[str, Choices(lambda: list_models(family="activation"))] = "gelu",
         dataset_size: Annotated[int, Range(1, 1_000_000)] = 2048, seed: int = 0) -> ILQL:
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
        seed: seed of the toy dataset.
    """
    dataset = ToyLanguageDataset(size=dataset_size, seed=seed)
    config = {**TINY_CONFIG, "vocab_size": dataset.tokenizer.vocab_size, "n_layer": n_layer, "n_embd": n_embd,
              "n_head": n_head, "block_size": block_size, "dim_feedfwd": 4 * n_embd, "dropout": dropout,
              "activation": activation,
              "max_layers": max(TINY_CONFIG["max_layers"], n_layer)}
    return ILQL(dataset, config, lr=lr, alpha=alpha, tau=tau, gamma=gamma, double_q=double_q)
