"""``ilql``: offline ILQL on the built-in colour-naming task, decoded with the perturbed policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import torch

from workbench.experiments.base import Experiment, evaluation, register_experiment
from workbench.models.ilql import TINY_CONFIG, estimate_memory
from workbench.models.ilql_checkpoint import number_list
from workbench.models.toy_language import ToyLanguageDataset
from workbench.params import Range, check_seed
from workbench.registry import create_model

__all__ = ["OfflineILQL"]


@register_experiment("ilql")
class OfflineILQL(Experiment):
    """ILQL learns from a mediocre behaviour policy's answers and decodes better ones."""

    @dataclass
    class Config:
        """Configuration of ``ilql``.

        Args:
            batch_size: sequences per training step.
            lr: AdamW learning rate.
            n_layer: transformer blocks per GPT.
            n_embd: embedding width.
            n_head: attention heads.
            alpha: Polyak rate of the target networks.
            tau: expectile of the value loss.
            gamma: discount.
            cql_weight: weight of the CQL loss.
            dataset_size: offline sequences from the behaviour policy.
            eval_every: decode and score every this many steps (0: never).
            eval_prompts: prompts decoded per evaluation.
            decode_beta: weight of Q - V added to the policy's logits when decoding.
            temperature: sampling temperature when decoding.
        """

        batch_size: Annotated[int, Range(1, 4096)] = 64
        lr: Annotated[float, Range(1e-7, 1.0)] = 1e-3
        n_layer: Annotated[int, Range(1, 12)] = 2
        n_embd: Annotated[int, Range(8, 1024)] = 64
        n_head: Annotated[int, Range(1, 16)] = 4
        alpha: Annotated[float, Range(0.0, 1.0)] = 0.05
        tau: Annotated[float, Range(0.01, 0.99)] = 0.7
        gamma: Annotated[float, Range(0.0, 1.0)] = 0.99
        cql_weight: Annotated[float, Range(0.0, 10.0)] = 0.01
        dataset_size: Annotated[int, Range(16, 1_000_000)] = 2048
        eval_every: Annotated[int, Range(0, 100_000)] = 50
        eval_prompts: Annotated[int, Range(1, 100_000)] = 256
        decode_beta: Annotated[float, Range(0.0, 100.0)] = 8.0
        temperature: Annotated[float, Range(0.01, 10.0)] = 1.0

    @classmethod
    def estimate_memory(cls, c: Config) -> dict[str, int] | None:
        """Every network's parameters, the trainable ones' gradients and AdamW's moments; the
        offline dataset; the activations of a training step (the value and policy trunks keep each
        block's outputs and attention weights for the backward pass, and as many gradients) or of
        an evaluation (eval_prompts sequences decoded without gradients), whichever is larger."""
        if c.n_embd % c.n_head:
            raise ValueError(f"Experiment 'ilql': n_embd ({c.n_embd}) must be divisible by n_head ({c.n_head}).")
        vocab = ToyLanguageDataset.VOCAB_SIZE
        config = {**TINY_CONFIG, "vocab_size": vocab, "n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head,
                  "dim_feedfwd": 4 * c.n_embd, "max_layers": max(TINY_CONFIG["max_layers"], c.n_layer)}
        networks = estimate_memory(config, double_q=True)
        if networks is None:
            return None
        value, length = torch.get_default_dtype().itemsize, 4 + 4  # the toy task's longest sequence
        per_token = c.n_layer * (18 * c.n_embd + c.n_head * length)
        train = 2 * c.batch_size * length * (2 * per_token + 3 * vocab + 12 * c.n_embd) * value
        decode = c.eval_prompts * length * (8 * c.n_embd + 2 * c.n_head * length + 3 * vocab) * value
        return {"parameters": networks["networks"], "gradients": networks["optimizer"] // 2,
                "optimizer": networks["optimizer"], "data": ToyLanguageDataset.estimate_bytes(c.dataset_size),
                "activations": max(train, decode)}

    def setup(self) -> None:
        c = self.config
        self.model = create_model("ilql", n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head, lr=c.lr,
                                  alpha=c.alpha, tau=c.tau, gamma=c.gamma, dataset_size=c.dataset_size,
                                  seed=self.seed).to(self.device)
        self.dataset = self.model.dataset

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The agent's AdamW (``model.optimizer``), which its ``learn`` steps."""
        return self.model.optimizer

    def get_extra_state(self) -> dict[str, Any]:
        """The agent's AgileRL bookkeeping: ``steps`` (its learn() count), ``fitness`` and ``scores``."""
        return {"steps": list(self.model.steps), "fitness": list(self.model.fitness), "scores": list(self.model.scores)}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or sorted(state) != ["fitness", "scores", "steps"]:
            raise ValueError(f"the ILQL agent's extra state must have 'steps', 'fitness' and 'scores', got "
                             f"{sorted(state) if isinstance(state, dict) else type(state).__name__}.")
        steps = number_list(state["steps"], "extra state 'steps'", integer=True)
        fitness = number_list(state["fitness"], "extra state 'fitness'", integer=False)
        scores = number_list(state["scores"], "extra state 'scores'", integer=False)
        self.model.steps, self.model.fitness, self.model.scores = steps, fitness, scores

    def train_step(self) -> dict[str, float]:
        batch = self.dataset.sample(self.config.batch_size, self.generator)
        metrics = self.model.learn(batch, cql_loss_weight=self.config.cql_weight)
        every = self.config.eval_every
        if every and (self.step_count + 1) % every == 0:
            metrics.update(self.evaluate())
        return metrics

    @evaluation
    def evaluate(self, prompts: int | None = None, seed: int = 12345) -> dict[str, float]:
        """Mean reward on the same fresh prompts of: the perturbed policy (``policy_reward``), the
        policy alone (``bc_reward``, beta 0) and the behaviour policy that made the data
        (``behaviour_reward``). Uses its own generator: the training stream is not shifted."""
        c = self.config
        if prompts is not None and (isinstance(prompts, bool) or not isinstance(prompts, int) or prompts < 1):
            raise ValueError(f"evaluate: prompts must be an int >= 1 (prompts to decode), or None for the config's "
                             f"eval_prompts ({c.eval_prompts}), got {prompts!r}.")
        check_seed(seed, "evaluate")
        generator = torch.Generator().manual_seed(seed)
        asks = self.dataset.prompts(c.eval_prompts if prompts is None else prompts, generator)
        most = self.dataset.utterance_length + 1
        perturbed = self.model.generate(asks, most, beta=c.decode_beta, temperature=c.temperature, generator=generator)
        plain = self.model.generate(asks, most, beta=0.0, temperature=c.temperature, generator=generator)
        behaviour = self.dataset.behaviour(asks, generator)
        return {"policy_reward": self.dataset.score(perturbed).mean().item(),
                "bc_reward": self.dataset.score(plain).mean().item(),
                "behaviour_reward": self.dataset.score(behaviour).mean().item()}
