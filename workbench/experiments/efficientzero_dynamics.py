"""``efficientzero_dynamics``: learn a fixed random environment with a K-step recurrent unroll."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from workbench.experiments.base import Experiment, evaluation, register_experiment
from workbench.models.efficientzero import scalar_to_support, support_to_scalar
from workbench.params import Range
from workbench.registry import create_model, get_spec

__all__ = ["DynamicsUnroll", "Teacher"]


class Teacher(nn.Module):
    """A fixed random environment over latent states: z' = tanh(W [z; a]), r = <v, mean(z')> + b_a.

    Args:
        latent_channels: channels of the latent state.
        actions: number of discrete actions.
        reward_scale: rewards are roughly within +-reward_scale.
        generator: the random source of the fixed weights.
    """

    def __init__(self, latent_channels: int, actions: int, reward_scale: float, generator: torch.Generator) -> None:
        super().__init__()
        c = latent_channels
        weight = torch.randn(c, c + actions, 1, 1, generator=generator) * (1.5 / (c + actions) ** 0.5)
        self.register_buffer("weight", weight)
        self.register_buffer("reward_vector", torch.randn(c, generator=generator) / c**0.5)
        self.register_buffer("action_bias", torch.rand(actions, generator=generator) * 2 - 1)
        self.actions = actions
        self.reward_scale = reward_scale

    @torch.no_grad()
    def forward(self, latent: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        planes = F.one_hot(actions, self.actions).to(latent.dtype)[:, :, None, None].expand(-1, -1, *latent.shape[2:])
        next_latent = torch.tanh(F.conv2d(torch.cat([latent, planes], 1), self.weight))  # (B, C, H, W)
        pooled = next_latent.mean((2, 3))  # (B, C)
        reward = self.reward_scale * torch.tanh(pooled @ self.reward_vector * 3 + self.action_bias[actions])
        return next_latent, reward  # reward (B,)


@register_experiment("efficientzero_dynamics")
class DynamicsUnroll(Experiment):
    """The EfficientZero dynamics network learns a fixed random environment with a K-step recurrent unroll."""

    @dataclass
    class Config:
        """Configuration of ``efficientzero_dynamics``.

        Args:
            unroll_steps: K, the number of recurrent steps per training sequence.
            batch_size: sequences per training step.
            lr: Adam learning rate.
            latent_channels: channels of the latent state.
            actions: number of discrete actions (one-hot action planes).
            spatial: the latent is spatial x spatial.
            num_res_blocks: residual blocks of the dynamics network.
            lstm_hidden_size: hidden size of the reward LSTM.
            support_size: atoms of the value-prefix support (odd).
            reward_scale: rewards lie within +-reward_scale.
            consistency_weight: weight of the latent consistency loss.
            fc_reward_layers: hidden layers of the reward MLP.
        """

        unroll_steps: Annotated[int, Range(1, 50)] = 5
        batch_size: Annotated[int, Range(2, 4096)] = 64
        lr: Annotated[float, Range(1e-6, 1.0)] = 3e-3
        latent_channels: Annotated[int, Range(1, 256)] = 8
        actions: Annotated[int, Range(1, 64)] = 4
        spatial: Annotated[int, Range(1, 32)] = 4
        num_res_blocks: Annotated[int, Range(0, 16)] = 1
        lstm_hidden_size: Annotated[int, Range(1, 2048)] = 64
        support_size: Annotated[int, Range(3, 1201)] = 21
        reward_scale: Annotated[float, Range(0.0, 100.0)] = 1.0
        consistency_weight: Annotated[float, Range(0.0, 100.0)] = 2.0
        fc_reward_layers: list[int] = field(default_factory=lambda: [32])

    HEAD = 8  # channels of the reward head's 1x1 conv

    @classmethod
    def _model_kwargs(cls, c: Config) -> dict:
        if c.support_size % 2 == 0:
            raise ValueError(f"Experiment 'efficientzero_dynamics': support_size must be odd, got {c.support_size}; "
                             f"e.g. {c.support_size + 1}.")
        layers = c.fc_reward_layers
        if not layers or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers):
            raise ValueError(f"Experiment 'efficientzero_dynamics': fc_reward_layers must be a non-empty list of "
                             f"positive ints, got {layers!r}; e.g. [32].")
        return dict(observation_shape=[c.latent_channels, c.spatial, c.spatial], action_encoding_dim=c.actions,
                    num_channels=c.latent_channels + c.actions, num_res_blocks=c.num_res_blocks,
                    reward_head_channels=cls.HEAD, fc_reward_layers=list(layers), output_support_size=c.support_size,
                    flatten_output_size_for_reward_head=cls.HEAD * c.spatial * c.spatial,
                    lstm_hidden_size=c.lstm_hidden_size)

    @classmethod
    def estimate_memory(cls, c: Config) -> dict[str, int] | None:
        """Parameters with gradients and Adam's moments; the teacher's trajectories; the activations
        of a K-step unroll kept for the backward pass (and as many gradients), per sequence and
        step: the input, the trunk's and each residual block's feature maps, the reward head, the
        LSTM and the reward MLP (training batch, or evaluate's 256 sequences if more)."""
        params = get_spec("efficientzero_dynamics").estimate_memory(**cls._model_kwargs(c))
        if params is None:
            return None
        value, area = torch.get_default_dtype().itemsize, c.spatial * c.spatial
        per_step = ((c.latent_channels + c.actions) * area + (2 + 5 * c.num_res_blocks) * c.latent_channels * area
                    + 2 * cls.HEAD * area + 8 * c.lstm_hidden_size
                    + 3 * c.fc_reward_layers[0] * len(c.fc_reward_layers) + 4 * c.support_size)
        batch = max(c.batch_size, 256)
        return {"parameters": params, "gradients": params, "optimizer": 2 * params,
                "data": (c.unroll_steps + 1) * batch * (c.latent_channels * area + 4) * value,
                "activations": 2 * c.unroll_steps * batch * per_step * value}

    def setup(self) -> None:
        c = self.config
        self.model = create_model("efficientzero_dynamics", **self._model_kwargs(c)).to(self.device)
        self.teacher = Teacher(c.latent_channels, c.actions, c.reward_scale, self.generator)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=c.lr)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """A batch of teacher trajectories, on the CPU.

        Returns:
            ``z0`` (B, C, S, S), ``actions`` (B, K), the teacher's latents
            [z1..zK] and its value prefixes [r1, r1+r2, ...], each (B,).
        """
        c = self.config
        z = torch.tanh(torch.randn(batch_size, c.latent_channels, c.spatial, c.spatial, generator=self.generator))
        actions = torch.randint(c.actions, (batch_size, c.unroll_steps), generator=self.generator)
        z0, latents, prefixes, prefix = z, [], [], torch.zeros(batch_size)
        for k in range(c.unroll_steps):
            z, reward = self.teacher(z, actions[:, k])
            prefix = prefix + reward
            latents.append(z)
            prefixes.append(prefix)
        return z0, actions, latents, prefixes

    def losses(self, z0, actions, latents, prefixes) -> dict[str, torch.Tensor]:
        """Unroll the model K steps from z0 (the LSTM state carried across steps) and score it."""
        model, c = self.model, self.config
        latent = z0
        hidden = model.initial_hidden_state(len(z0), device=z0.device)
        vp_loss = consistency = 0.0
        errors = []
        for k in range(c.unroll_steps):
            latent, hidden, value_prefix = model(model.encode_actions(latent, actions[:, k]), hidden)
            target = scalar_to_support(prefixes[k], c.support_size)  # (B, support)
            vp_loss = vp_loss + -(target * F.log_softmax(value_prefix, -1)).sum(-1).mean()
            consistency = consistency + F.mse_loss(latent, latents[k])
            errors.append((support_to_scalar(value_prefix.detach()) - prefixes[k]).abs().mean())
        vp_loss = vp_loss / c.unroll_steps
        consistency = consistency / c.unroll_steps
        return {
            "loss": vp_loss + c.consistency_weight * consistency,
            "value_prefix_loss": vp_loss,
            "consistency_loss": consistency,
            "value_prefix_error": torch.stack(errors).mean(),
        }

    def train_step(self) -> dict[str, float]:
        batch = self.to_device(self.sample(self.config.batch_size))
        self.model.train()
        terms = self.losses(*batch)
        self.optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        self.optimizer.step()
        metrics = {k: v.item() for k, v in terms.items()}
        metrics["dynamic_mean"] = self.model.get_dynamic_mean()
        metrics["reward_mean"] = self.model.get_reward_mean()[1]
        return metrics

    @evaluation
    def evaluate(self, batch_size: int = 256) -> dict[str, float]:
        """Loss terms on fresh trajectories, in eval mode (BatchNorm running statistics)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"evaluate: batch_size must be an int >= 1 (trajectories to score), got {batch_size!r}.")
        generator_state = self.generator.get_state()
        try:
            self.model.eval()
            terms = self.losses(*self.to_device(self.sample(batch_size)))
        finally:
            self.model.train()
            self.generator.set_state(generator_state)  # evaluating does not shift the training stream
        return {k: v.item() for k, v in terms.items()}
