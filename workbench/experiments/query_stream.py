"""``query_stream``: a QueryModule indexes a stream of Zipf-distributed (observation, action) keys."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from workbench.experiments.base import Experiment, evaluation, register_experiment
from workbench.params import Range, check_seed
from workbench.registry import create_model

__all__ = ["KeyStream", "QueryStream"]


class KeyStream:
    """Rows of (observation, action) keys with Zipf-distributed popularity, as MCTS node lookups see.

    Key ``k`` in ``[0, key_space)`` is the pair (observation ``k // actions``,
    action ``k % actions``); observations are distinct random float vectors.
    The key of popularity rank ``r`` (0 = most popular) is drawn with
    probability proportional to ``(r + 1) ** -zipf_exponent``; ranks are
    assigned to keys by a random permutation.

    Args:
        key_space: number of distinct keys.
        zipf_exponent: 0 draws uniformly; larger values concentrate on few keys.
        observation_dim: features per observation.
        actions: number of actions.
        generator: the random source of the table and of every draw.
    """

    def __init__(self, key_space: int, zipf_exponent: float, observation_dim: int, actions: int,
                 generator: torch.Generator) -> None:
        self.key_space, self.actions, self.generator = key_space, actions, generator
        observations = -(-key_space // actions)
        self.observations = torch.randn(observations, observation_dim, generator=generator)
        weights = torch.arange(1, key_space + 1, dtype=torch.float64) ** -zipf_exponent
        self.cdf = torch.cumsum(weights / weights.sum(), 0)  # inverse-CDF sampling works for any key_space
        self.key_of_rank = torch.randperm(key_space, generator=generator)

    def sample(self, rows: int,
               generator: torch.Generator | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``rows`` draws: the input dict (observation (rows, D) float32, action (rows,) int64) and the key ids;
        from ``generator`` when given (the stream's own draws are then left as they were)."""
        u = torch.rand(rows, generator=generator or self.generator, dtype=torch.float64)
        rank = torch.searchsorted(self.cdf, u).clamp_(max=self.key_space - 1)
        keys = self.key_of_rank[rank]
        return {"observation": self.observations[keys // self.actions], "action": keys % self.actions}, keys


@register_experiment("query_stream")
class QueryStream(Experiment):
    """A QueryModule indexes a stream of Zipf-distributed (observation, action) keys."""

    accelerated = False  # the module's index is a Python dict of hashed keys: host work

    @dataclass
    class Config:
        """Configuration of ``query_stream``.

        Args:
            key_space: number of distinct (observation, action) keys.
            zipf_exponent: skew of key popularity (0 = uniform).
            batch_size: rows per step.
            observation_dim: features per observation.
            actions: number of actions.
        """

        key_space: Annotated[int, Range(1, 50_000_000)] = 100_000
        zipf_exponent: Annotated[float, Range(0.0, 5.0)] = 1.1
        batch_size: Annotated[int, Range(1, 10_000_000)] = 4096
        observation_dim: Annotated[int, Range(1, 1024)] = 4
        actions: Annotated[int, Range(1, 4096)] = 8

    @classmethod
    def estimate_memory(cls, c: Config) -> dict[str, int]:
        """The key stream (observations, the popularity CDF and its float64 temporaries, the rank
        permutation), the true-index table, the module's hash table at its largest (every key
        seen: open addressing at load <= 1/2, doubled as it grows) and one step's rows."""
        per_key = 4 * 8 + 8 + 8 + 8 + 64 + 16
        observations = -(-c.key_space // c.actions) * c.observation_dim * 4
        return {"data": c.key_space * per_key + observations,
                "activations": c.batch_size * (12 * c.observation_dim + 128)}

    def setup(self) -> None:
        c = self.config
        self.model = create_model("query_module", in_keys=["observation", "action"])
        self.stream = KeyStream(c.key_space, c.zipf_exponent, c.observation_dim, c.actions, self.generator)
        # the index each true key id received, -1 while unseen: an independent check of the module's answers
        self.index_of_key = torch.full((c.key_space,), -1, dtype=torch.int64)

    def get_extra_state(self) -> dict[str, Any]:
        """``index_of_key``: the index each true key id received (-1 while unseen), the check of the answers."""
        return {"index_of_key": self.index_of_key.clone()}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        value = state.get("index_of_key") if isinstance(state, dict) else None
        want = self.index_of_key
        if not isinstance(value, torch.Tensor) or value.dtype != want.dtype or value.shape != want.shape \
                or sorted(state) != ["index_of_key"]:
            got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(state)[:80]
            raise ValueError(f"the extra state must be {{'index_of_key': an int64 tensor of shape "
                             f"{tuple(want.shape)}}} (one entry per key of key_space), got {got}.")
        self.index_of_key = value.clone()

    def train_step(self) -> dict[str, float]:
        batch, keys = self.stream.sample(self.config.batch_size)
        size_before = len(self.model.hash_to_int)
        start = time.perf_counter()
        index = self.model(batch)["_index"]
        elapsed = time.perf_counter() - start
        known = self.index_of_key[keys]
        seen = known >= 0
        self.index_of_key[keys] = index
        # a row is wrong if a known key got another index or one key got two indices in this batch
        wrong = (seen & (index != known)) | (self.index_of_key[keys] != index)
        return {
            "rows": float(len(keys)),
            "new_keys": float(len(self.model.hash_to_int) - size_before),
            "map_size": float(len(self.model.hash_to_int)),
            "hit_rate": seen.double().mean().item(),
            "rows_per_s": len(keys) / max(elapsed, 1e-9),
            "index_errors": float(wrong.sum()),
        }

    @evaluation
    def evaluate(self, rows: int | None = None, seed: int = 12345) -> dict[str, float]:
        """Look up a fresh sample of keys without adding any (``extend=False``): how much of the stream
        the map answers now, and whether it answers right. The sample is drawn from the stream's
        distribution with a generator of its own: the map and the training stream are left as they were.

        Args:
            rows: keys to look up; None: the config's ``batch_size``.
            seed: the sample's seed, in [0, 2**63 - 1] (the same keys at every call by default).

        Returns:
            ``hit_rate`` (share of the rows the map holds), ``index_errors`` (rows answered with an
            index other than the one their key received, or found though never added, or missed
            though added) and ``coverage`` (the share of the key space the map holds).

        Raises:
            ValueError: ``rows`` not an int >= 1, or a bad seed.
        """
        c = self.config
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ValueError(f"evaluate: rows must be an int >= 1 (keys to look up), or None for the config's "
                             f"batch_size ({c.batch_size}), got {rows!r}.")
        check_seed(seed, "evaluate")
        batch, keys = self.stream.sample(c.batch_size if rows is None else rows, torch.Generator().manual_seed(seed))
        size = len(self.model.hash_to_int)
        index = self.model(batch, extend=False)["_index"].cpu()
        known, found = self.index_of_key[keys], index < size
        wrong = (found != (known >= 0)) | (found & (index != known))
        return {"hit_rate": found.double().mean().item(), "index_errors": float(wrong.sum()),
                "coverage": size / c.key_space}
