"""The GPT that the ILQL agent builds on: nanoGPT's layout, written compactly.

A GPT is configured by a ``net_config``: a plain dict (AgileRL's form, and what an ILQL
checkpoint stores) with the keys of :data:`GPT2_CONFIG`. :func:`check_net_config` checks one;
:class:`GPT` builds the network::

    wte, wpe       token and position embeddings               tokens -> (B, T, n_embd)
    h[i]           Block: x + attn(ln_1 x), then x + mlp(ln_2 x)  (B, T, n_embd)
    ln_f           final LayerNorm
    lm_head        optional linear head to vocabulary logits     (B, T, vocab_size)
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.params import Range, check_value, param_info
from workbench.registry import create_model, get_spec, list_models

__all__ = ["GPT", "GPT2_CONFIG", "TINY_CONFIG", "check_net_config", "count_parameters"]

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

_POSITIVE = Annotated[int, Range(1, None)]
#: The type of each net_config key, checked by workbench.params.check_value; the rules that tie
#: keys together, and the open bounds a Range (inclusive) cannot state, follow in check_net_config.
_KEY_TYPES = {
    "arch": str, "vocab_size": _POSITIVE, "n_layer": _POSITIVE, "n_embd": _POSITIVE, "n_head": _POSITIVE,
    "dim_feedfwd": _POSITIVE, "block_size": _POSITIVE, "activation": str, "dropout": float, "layer_norm_eps": float,
    "min_layers": _POSITIVE, "max_layers": _POSITIVE, "bias": bool,
}


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
        raise ValueError(f"net_config is missing {missing}; e.g. workbench.models.gpt.GPT2_CONFIG has them all.")
    c = dict(net_config)
    for key, annotation in _KEY_TYPES.items():
        check_value(param_info(key, annotation, GPT2_CONFIG[key]), c[key], "net_config")
    if c["arch"] != "gpt":
        raise ValueError(f"net_config['arch'] must be 'gpt' (the only architecture ILQL uses), got {c['arch']!r}.")
    if c["n_embd"] % c["n_head"]:
        raise ValueError(f"net_config: n_embd ({c['n_embd']}) must be divisible by n_head ({c['n_head']}).")
    if not c["min_layers"] <= c["n_layer"] <= c["max_layers"]:
        raise ValueError(f"net_config: n_layer ({c['n_layer']}) must lie within min_layers..max_layers "
                         f"({c['min_layers']}..{c['max_layers']}).")
    if not 0 <= c["dropout"] < 1:
        raise ValueError(f"net_config['dropout'] must be in [0, 1), got {c['dropout']!r}.")
    if c["layer_norm_eps"] <= 0:
        raise ValueError(f"net_config['layer_norm_eps'] must be > 0, got {c['layer_norm_eps']!r}.")
    if c["activation"].lower() not in list_models(family="activation"):
        raise ValueError(f"net_config['activation'] {c['activation']!r} is not a registered activation; "
                         f"choose one of {list_models(family='activation')} (any case).")
    return c


def count_parameters(net_config: dict[str, Any], lm_head: bool = False) -> int | None:
    """The number of parameters of ``GPT(net_config, lm_head)``, counted from the (validated) config without
    building it; None when the activation's parameter count is unknown."""
    c = net_config
    e, f, b = c["n_embd"], c["dim_feedfwd"], int(bool(c["bias"]))
    activation = get_spec(str(c["activation"]).lower()).estimate_memory()
    if activation is None:
        return None
    itemsize = torch.get_default_dtype().itemsize
    norm = e * (1 + b)
    block = (2 * norm + 3 * e * e + 3 * e * b + e * e + e * b + e * f + f * b + f * e + e * b
             + -(-activation // itemsize))
    head = c["vocab_size"] * e if lm_head else 0
    return (c["vocab_size"] + c["block_size"]) * e + c["n_layer"] * block + norm + head


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
