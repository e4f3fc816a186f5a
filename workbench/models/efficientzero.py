"""EfficientZero's dynamics network, checkpoint-compatible with LightZero.

``DynamicsNetwork`` computes the same function as LightZero's
``lzero.model.efficientzero_model.DynamicsNetwork`` and has the same
``state_dict`` keys and shapes, so LightZero checkpoints load with
``strict=True``. Key layout (BN; LN swaps ``norm_common``/``norm_reward`` for
LayerNorms over (C, H, W) and the MLP's BatchNorm1d for LayerNorm)::

    conv.weight                               3x3, num_channels -> latent channels, no bias
    norm_common.{weight,bias,running_*,num_batches_tracked}
    resblocks.{i}.conv1.0.weight              3x3 conv, no bias   (conv1 = conv, BN, activation)
    resblocks.{i}.conv1.1.*                   BatchNorm2d (always BN, as upstream)
    resblocks.{i}.conv2.0.weight / conv2.1.*  (conv2 = conv, BN; the block ends act(x + identity))
    conv1x1_reward.{weight,bias}
    norm_reward.*
    lstm.{weight_ih_l0,weight_hh_l0,bias_ih_l0,bias_hh_l0}
    norm_value_prefix.*                       BatchNorm1d(lstm_hidden_size)
    fc_reward_head.{0,1,3,...}.*              Linear, norm, activation, ..., Linear (zero-init last)

As upstream, every hidden layer of the reward MLP has ``fc_reward_layers[0]``
units (the list's length sets the number of hidden layers), and one
activation object serves every call site of a network. Unlike upstream, the
default activation is a fresh ``nn.ReLU(inplace=True)`` per network, not one
object shared by every network in the process.

The module also provides EfficientZero's value transform and the two-hot
support projection used by the loss and the dashboards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workbench.params import Range, check_arguments, matches
from workbench.registry import register_model

__all__ = [
    "DynamicsNetwork",
    "ResBlock",
    "value_transform",
    "inverse_value_transform",
    "scalar_to_support",
    "support_to_scalar",
]


# --- support transforms -------------------------------------------------------

def value_transform(x: torch.Tensor, eps: float = 0.001) -> torch.Tensor:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, EfficientZero's invertible squashing."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1) - 1) + eps * x


def inverse_value_transform(y: torch.Tensor, eps: float = 0.001) -> torch.Tensor:
    """h^{-1}(y) = sign(y)(((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1 + 4 * eps * (torch.abs(y) + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(y) * (root * root - 1)


def _half_width(support_size: int) -> int:
    if not matches(support_size, int) or support_size < 3 or support_size % 2 == 0:
        raise ValueError(f"support_size must be an odd int >= 3 (atoms -S..S), got {support_size!r}.")
    return (support_size - 1) // 2


def scalar_to_support(x: torch.Tensor, support_size: int, transform: bool = True, eps: float = 0.001) -> torch.Tensor:
    """Two-hot projection of scalars onto the integer atoms -S..S.

    Args:
        x: scalars, any shape (*).
        support_size: number of atoms, odd (601 -> atoms -300..300).
        transform: apply :func:`value_transform` first, as EfficientZero does.
        eps: the transform's epsilon.

    Returns:
        (*, support_size) probabilities: the two atoms around the (clamped)
        value share the mass so that their mean is the value.
    """
    half = _half_width(support_size)
    y = value_transform(x, eps) if transform else x
    y = y.clamp(-half, half)
    low = y.floor()
    upper_weight = y - low
    out = torch.zeros(*y.shape, support_size, dtype=y.dtype, device=y.device)
    low_index = (low + half).long()
    out.scatter_(-1, low_index.unsqueeze(-1), (1 - upper_weight).unsqueeze(-1))
    high_index = (low_index + 1).clamp(max=support_size - 1)
    # at the top atom upper_weight is 0, so adding there changes nothing
    out.scatter_add_(-1, high_index.unsqueeze(-1), upper_weight.unsqueeze(-1))
    return out


def support_to_scalar(logits: torch.Tensor, transform: bool = True, eps: float = 0.001) -> torch.Tensor:
    """Expected value of softmax(logits) over the atoms -S..S, mapped back through h^-1.

    Args:
        logits: (*, support_size).
        transform: apply :func:`inverse_value_transform` after the expectation.

    Returns:
        (*) scalars.
    """
    half = _half_width(logits.shape[-1])
    atoms = torch.arange(-half, half + 1, dtype=logits.dtype, device=logits.device)
    y = (F.softmax(logits, dim=-1) * atoms).sum(-1)
    return inverse_value_transform(y, eps) if transform else y


# --- network --------------------------------------------------------------------

class ResBlock(nn.Module):
    """Basic residual block, DI-engine's layout: act(BN(conv(act(BN(conv x)))) + x).

    ``conv1`` is (conv3x3, BatchNorm2d, activation), ``conv2`` is (conv3x3,
    BatchNorm2d); the same activation object ends the block as ``act``.
    """

    def __init__(self, channels: int, activation: nn.Module) -> None:
        super().__init__()
        self.act = activation
        self.conv1 = nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels),
                                   activation)
        self.conv2 = nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        x = self.conv2(self.conv1(x))
        return self.act(x + identity)


def _reward_mlp(in_features: int, hidden: int, out_features: int, hidden_layers: int, activation: nn.Module,
                norm_type: str, last_zero: bool) -> nn.Sequential:
    """Linear, norm, activation for each hidden layer, then a bare Linear (DI-engine MLP layout)."""
    layers: list[nn.Module] = []
    size = in_features
    for _ in range(hidden_layers):
        layers += [nn.Linear(size, hidden), nn.BatchNorm1d(hidden) if norm_type == "BN" else nn.LayerNorm(hidden),
                   activation]
        size = hidden
    last = nn.Linear(size, out_features)
    if last_zero:
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    layers.append(last)
    return nn.Sequential(*layers)


class DynamicsNetwork(nn.Module):
    """EfficientZero's dynamics network: next latent state, LSTM reward state and value prefix.

    Args:
        observation_shape: shape of the observation (C, H, W); sets the
            latent's H, W (divided by 16, rounded up, when downsample).
        action_encoding_dim: number of action planes at the end of the input.
        num_res_blocks: residual blocks after the first 3x3 conv.
        num_channels: channels of the input: latent channels + action planes.
        reward_head_channels: channels of the 1x1 reward conv.
        fc_reward_layers: hidden layers of the reward MLP; each has
            fc_reward_layers[0] units (LightZero's rule).
        output_support_size: number of atoms of the categorical value prefix.
        flatten_output_size_for_reward_head: reward_head_channels x H x W,
            the LSTM's input size.
        downsample: whether the representation downsampled observations by 16.
        lstm_hidden_size: hidden size of the reward LSTM.
        last_linear_layer_init_zero: zero-initialise the reward MLP's last layer.
        activation: activation module used at every call site; a fresh
            nn.ReLU(inplace=True) when None.
        norm_type: 'BN' or 'LN'.
        reward_head_hidden_channels: newer LightZero's name for fc_reward_layers.
        flatten_input_size_for_reward_head: newer LightZero's name for
            flatten_output_size_for_reward_head.

    Shape:
        state_action_encoding (B, num_channels, H, W); reward_hidden_state a
        pair (h, c), each (1, B, lstm_hidden_size). Returns next_latent_state
        (B, num_channels - action_encoding_dim, H, W), the next (h, c) and
        value_prefix logits (B, output_support_size).

    Examples:
        >>> import torch
        >>> from workbench.models.efficientzero import DynamicsNetwork
        >>> net = DynamicsNetwork((16, 6, 6), action_encoding_dim=2, num_channels=18, reward_head_channels=4,
        ...                       fc_reward_layers=[32], output_support_size=21,
        ...                       flatten_output_size_for_reward_head=4 * 6 * 6, lstm_hidden_size=64)
        >>> x = torch.randn(3, 18, 6, 6)                         # 16 latent channels + 2 action planes
        >>> hidden = net.initial_hidden_state(3)                 # (h, c), each (1, 3, 64)
        >>> latent, hidden, value_prefix = net(x, hidden)
        >>> tuple(latent.shape), tuple(hidden[0].shape), tuple(value_prefix.shape)
        ((3, 16, 6, 6), (1, 3, 64), (3, 21))
        >>> net.load_state_dict(lightzero_state_dict, strict=True)  # doctest: +SKIP
    """

    def __init__(
        self,
        observation_shape: Sequence[int],
        action_encoding_dim: Annotated[int, Range(1, None)] = 2,
        num_res_blocks: Annotated[int, Range(0, 64)] = 1,
        num_channels: Annotated[int, Range(2, None)] = 64,
        reward_head_channels: Annotated[int, Range(1, None)] = 64,
        fc_reward_layers: Sequence[int] = (32,),
        output_support_size: Annotated[int, Range(1, None)] = 601,
        flatten_output_size_for_reward_head: Annotated[int, Range(1, None)] = 64,
        downsample: bool = False,
        lstm_hidden_size: Annotated[int, Range(1, None)] = 512,
        last_linear_layer_init_zero: bool = True,
        activation: nn.Module | None = None,
        norm_type: Literal["BN", "LN"] = "BN",
        *,
        reward_head_hidden_channels: Sequence[int] | None = None,
        flatten_input_size_for_reward_head: Annotated[int | None, Range(1, None)] = None,
    ) -> None:
        super().__init__()
        # every argument's type, and the Annotated ranges and Literal choices of the signature
        check_arguments(
            DynamicsNetwork, "DynamicsNetwork", observation_shape=observation_shape,
            action_encoding_dim=action_encoding_dim, num_res_blocks=num_res_blocks, num_channels=num_channels,
            reward_head_channels=reward_head_channels, fc_reward_layers=fc_reward_layers,
            output_support_size=output_support_size,
            flatten_output_size_for_reward_head=flatten_output_size_for_reward_head, downsample=downsample,
            lstm_hidden_size=lstm_hidden_size, last_linear_layer_init_zero=last_linear_layer_init_zero,
            activation=activation, norm_type=norm_type, reward_head_hidden_channels=reward_head_hidden_channels,
            flatten_input_size_for_reward_head=flatten_input_size_for_reward_head)
        # Newer LightZero spellings. A canonical argument left at its default counts as not given.
        if reward_head_hidden_channels is not None:
            if list(fc_reward_layers) not in ([32], list(reward_head_hidden_channels)):
                raise ValueError(
                    f"DynamicsNetwork: fc_reward_layers={list(fc_reward_layers)} and reward_head_hidden_channels="
                    f"{list(reward_head_hidden_channels)} name the same setting; give one of them."
                )
            fc_reward_layers = reward_head_hidden_channels
        if flatten_input_size_for_reward_head is not None:
            if flatten_output_size_for_reward_head not in (64, flatten_input_size_for_reward_head):
                raise ValueError(
                    f"DynamicsNetwork: flatten_output_size_for_reward_head={flatten_output_size_for_reward_head} and "
                    f"flatten_input_size_for_reward_head={flatten_input_size_for_reward_head} name the same setting; "
                    "give one of them."
                )
            flatten_output_size_for_reward_head = flatten_input_size_for_reward_head
        # the rules the annotations cannot state
        shape = list(observation_shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(
                f"DynamicsNetwork: observation_shape must be a sequence of three positive ints (C, H, W), "
                f"got {observation_shape!r} ({len(shape)} dims); e.g. [12, 96, 96]."
            )
        if num_channels <= action_encoding_dim:
            raise ValueError(
                f"DynamicsNetwork: num_channels ({num_channels}) must exceed action_encoding_dim "
                f"({action_encoding_dim}): the input is the latent state plus the action planes."
            )
        fc_reward_layers = list(fc_reward_layers)
        if not fc_reward_layers or min(fc_reward_layers) < 1:
            raise ValueError(f"DynamicsNetwork: fc_reward_layers must be a non-empty list of positive ints, "
                             f"got {fc_reward_layers!r}.")

        self.observation_shape = tuple(shape)
        self.action_encoding_dim = action_encoding_dim
        self.num_channels = num_channels
        self.latent_channels = num_channels - action_encoding_dim
        self.reward_head_channels = reward_head_channels
        self.flatten_output_size_for_reward_head = flatten_output_size_for_reward_head
        self.lstm_hidden_size = lstm_hidden_size
        self.output_support_size = output_support_size
        self.norm_type = norm_type
        self.downsample = downsample
        h, w = shape[-2], shape[-1]
        self.latent_hw = (math.ceil(h / 16), math.ceil(w / 16)) if downsample else (h, w)
        self.activation = nn.ReLU(inplace=True) if activation is None else activation

        c = self.latent_channels
        self.conv = nn.Conv2d(num_channels, c, kernel_size=3, stride=1, padding=1, bias=False)
        self.norm_common = nn.BatchNorm2d(c) if norm_type == "BN" else nn.LayerNorm([c, *self.latent_hw])
        self.resblocks = nn.ModuleList([ResBlock(c, self.activation) for _ in range(num_res_blocks)])
        self.conv1x1_reward = nn.Conv2d(c, reward_head_channels, 1)
        self.norm_reward = (nn.BatchNorm2d(reward_head_channels) if norm_type == "BN"
                            else nn.LayerNorm([reward_head_channels, *self.latent_hw]))
        self.lstm = nn.LSTM(input_size=flatten_output_size_for_reward_head, hidden_size=lstm_hidden_size)
        self.norm_value_prefix = nn.BatchNorm1d(lstm_hidden_size)  # BN for both norm types, as upstream
        self.fc_reward_head = _reward_mlp(lstm_hidden_size, fc_reward_layers[0], output_support_size,
                                          len(fc_reward_layers), self.activation, norm_type,
                                          last_linear_layer_init_zero)

    def _check_inputs(self, x: torch.Tensor, hidden) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"DynamicsNetwork expects state_action_encoding of shape (B, {self.num_channels}, H, W), "
                             f"got {got}.")
        if not x.is_floating_point():
            raise TypeError(f"DynamicsNetwork expects a floating-point state_action_encoding, got {x.dtype}.")
        weight = self.conv.weight
        if x.dtype != weight.dtype or x.device != weight.device:
            raise TypeError(f"DynamicsNetwork's weights are {weight.dtype} on {weight.device}, the "
                            f"state_action_encoding {x.dtype} on {x.device}: they must match. Convert the input "
                            f"(x.to('{weight.device}', {weight.dtype})) or the model (model.to(...)).")
        b, ch, h, w = x.shape
        if ch != self.num_channels:
            raise ValueError(
                f"DynamicsNetwork expects {self.num_channels} input channels ({self.latent_channels} latent + "
                f"{self.action_encoding_dim} action planes), got {ch} in shape {tuple(x.shape)}."
            )
        if self.reward_head_channels * h * w != self.flatten_output_size_for_reward_head:
            raise ValueError(
                f"DynamicsNetwork: flatten_output_size_for_reward_head is {self.flatten_output_size_for_reward_head}, "
                f"but reward_head_channels x H x W = {self.reward_head_channels} x {h} x {w} = "
                f"{self.reward_head_channels * h * w} for this input. Build with "
                f"flatten_output_size_for_reward_head={self.reward_head_channels * h * w}."
            )
        if self.training and b == 1:
            raise ValueError("DynamicsNetwork got a batch of 1 in training mode: its BatchNorm layers need more "
                             "than one value per channel. Use a batch of 2 or more, or call model.eval() first.")
        expected = (1, b, self.lstm_hidden_size)
        if (not isinstance(hidden, (tuple, list)) or len(hidden) != 2
                or any(not isinstance(t, torch.Tensor) or tuple(t.shape) != expected for t in hidden)):
            got = ([tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in hidden]
                   if isinstance(hidden, (tuple, list)) else type(hidden).__name__)
            raise ValueError(
                f"DynamicsNetwork expects reward_hidden_state = (h, c), each of shape {expected}, got {got}. "
                f"Start an unroll with zeros: (torch.zeros{expected}, torch.zeros{expected})."
            )
        if any(t.dtype != x.dtype or t.device != x.device for t in hidden):
            raise TypeError(
                f"DynamicsNetwork expects reward_hidden_state (h, c) of the input's dtype and device ({x.dtype} on "
                f"{x.device}), got {[f'{t.dtype} on {t.device}' for t in hidden]}. Start an unroll with "
                "model.initial_hidden_state(batch_size, device=x.device, dtype=x.dtype)."
            )

    def forward(self, state_action_encoding: torch.Tensor,
                reward_hidden_state: tuple[torch.Tensor, torch.Tensor]):
        """Predict the next latent state, the next LSTM state and the value prefix.

        Args:
            state_action_encoding: (B, num_channels, H, W), the latent state
                followed by the action planes.
            reward_hidden_state: (h, c), each (1, B, lstm_hidden_size).

        Returns:
            (tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]): ``(next_latent_state,
                next_reward_hidden_state, value_prefix)``:
                (B, latent channels, H, W), ((1, B, L), (1, B, L)), (B, output_support_size).
        """
        self._check_inputs(state_action_encoding, reward_hidden_state)
        state_encoding = state_action_encoding[:, : -self.action_encoding_dim]  # (B, C_latent, H, W)
        x = self.conv(state_action_encoding)
        x = self.norm_common(x)
        x += state_encoding  # residual on the latent part; in place, as upstream
        x = self.activation(x)
        for block in self.resblocks:
            x = block(x)
        next_latent_state = x

        x = self.conv1x1_reward(next_latent_state)
        x = self.norm_reward(x)
        x = self.activation(x)
        x = x.reshape(-1, self.flatten_output_size_for_reward_head).unsqueeze(0)  # (1, B, F)
        value_prefix, next_reward_hidden_state = self.lstm(x, tuple(reward_hidden_state))
        value_prefix = value_prefix.squeeze(0)  # (B, L)
        value_prefix = self.norm_value_prefix(value_prefix)
        value_prefix = self.activation(value_prefix)
        value_prefix = self.fc_reward_head(value_prefix)  # (B, support)
        return next_latent_state, next_reward_hidden_state, value_prefix

    def get_dynamic_mean(self) -> float:
        """Mean |w| over the 3x3 conv's weight and every residual-block parameter."""
        tensors = [self.conv.weight] + [p for block in self.resblocks for p in block.parameters()]
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        return flat.abs().mean().item()

    def get_reward_mean(self) -> tuple[np.ndarray, float]:
        """The reward weights (1x1 reward conv weight, then every reward-MLP parameter), and their mean |w|."""
        tensors = [self.conv1x1_reward.weight, *self.fc_reward_head.parameters()]
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu().numpy()
        return flat, float(np.abs(flat).mean())

    def initial_hidden_state(self, batch_size: int, device=None, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero (h, c), each (1, batch_size, lstm_hidden_size), to start an unroll."""
        shape = (1, batch_size, self.lstm_hidden_size)
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)

    def encode_actions(self, latent: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Concatenate one-hot action planes to a latent state.

        Args:
            latent: (B, latent channels, H, W).
            actions: (B,) int64 in [0, action_encoding_dim).

        Returns:
            (B, num_channels, H, W).
        """
        if not isinstance(latent, torch.Tensor) or latent.dim() != 4 or latent.shape[1] != self.latent_channels:
            got = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
            raise ValueError(f"encode_actions expects latent of shape (B, {self.latent_channels}, H, W), got {got}.")
        if not isinstance(actions, torch.Tensor):
            raise TypeError(f"actions must be an int64 tensor of shape ({latent.shape[0]},), got "
                            f"{type(actions).__name__}.")
        if actions.dtype != torch.long or actions.shape != latent.shape[:1]:
            raise ValueError(f"actions must be int64 of shape ({latent.shape[0]},), got {actions.dtype} "
                             f"{tuple(actions.shape)}.")
        if actions.numel() and (actions.min() < 0 or actions.max() >= self.action_encoding_dim):
            raise ValueError(f"actions must lie in [0, {self.action_encoding_dim}), got {actions.tolist()}.")
        planes = F.one_hot(actions, self.action_encoding_dim).to(latent.dtype)  # (B, A)
        planes = planes[:, :, None, None].expand(-1, -1, *latent.shape[2:])
        return torch.cat([latent, planes], dim=1)


# --- registry -----------------------------------------------------------------

def _example_inputs(model: DynamicsNetwork, batch_size: int, generator: torch.Generator | None = None):
    """A random latent with one-hot action planes, and a zero LSTM state."""
    h, w = model.latent_hw
    latent = torch.randn(batch_size, model.latent_channels, h, w, generator=generator)
    actions = torch.randint(model.action_encoding_dim, (batch_size,), generator=generator)
    return (model.encode_actions(latent, actions), model.initial_hidden_state(batch_size)), {}


def _objective(model: DynamicsNetwork, inputs, outputs) -> torch.Tensor:
    """Cross-entropy of the value prefix against a zero target, plus the latent's mean square."""
    latent, _, value_prefix = outputs
    target = scalar_to_support(torch.zeros(len(value_prefix)), model.output_support_size)
    return -(target * F.log_softmax(value_prefix, -1)).sum(-1).mean() + latent.pow(2).mean()


# Small enough to step interactively on a CPU: 16 latent channels + 2 action planes at 6x6.
register_model(
    "efficientzero_dynamics", family="dynamics", example_inputs=_example_inputs, objective=_objective,
    summary="EfficientZero dynamics network (LightZero-compatible), small CPU configuration",
    defaults=dict(observation_shape=[16, 6, 6], action_encoding_dim=2, num_res_blocks=1, num_channels=18,
                  reward_head_channels=8, fc_reward_layers=[32], output_support_size=21,
                  flatten_output_size_for_reward_head=8 * 6 * 6, lstm_hidden_size=64),
)(DynamicsNetwork)

# LightZero's Atari configuration: 96x96 observations downsampled to 6x6, 64 latent channels + 6 action planes.
register_model(
    "efficientzero_dynamics_atari", family="dynamics", example_inputs=_example_inputs, objective=_objective,
    summary="EfficientZero dynamics network, LightZero's Atari preset (64+6 channels at 6x6, LSTM 512, support 601)",
    defaults=dict(observation_shape=[12, 96, 96], action_encoding_dim=6, num_res_blocks=1, num_channels=70,
                  reward_head_channels=16, fc_reward_layers=[32], output_support_size=601,
                  flatten_output_size_for_reward_head=16 * 6 * 6, downsample=True, lstm_hidden_size=512),
)(DynamicsNetwork)
