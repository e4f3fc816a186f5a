"""A tiny built-in language task for offline RL: name things of the prompt's colour.

A prompt names a colour (``<bos> red <sep>``); the agent answers with up to
``utterance_length`` words and ``<eos>``. Each colour has two words that fit it
(red: apple, rose); each fitting word among the first ``utterance_length``
answer tokens earns a reward of 1 when it is said, so an answer's return is
the number of fitting words. Stopping early or saying anything else earns
nothing for that slot.

The offline data comes from a mediocre behaviour policy: each word fits the
colour with probability ``p_good`` plus chance, and it stops early now and
then, so the data's mean reward is well below the best possible L and
there is something for offline RL to improve on. Everything is generated
from a seed; nothing is downloaded.

Batches are in AgileRL's ILQL layout (``tokens, attn_mask, state_idxs,
action_idxs, rewards, terminals``): the hidden state at position ``t``
predicts token ``t + 1``, so the action of token ``t + 1`` is read at
``action_idxs = t``; ``state_idxs`` lists those positions plus the state after
the last action (a terminal), so a sequence of n actions has n + 1 states.
Padding: tokens and indices 0, ``attn_mask`` 0, ``terminals`` 1.
"""

from __future__ import annotations

import torch

from workbench.params import check_seed

__all__ = ["ToyTokenizer", "ToyLanguageDataset"]


class ToyTokenizer:
    """Word-level tokenizer of the toy task: 4 special tokens, 4 colours, 8 words."""

    special = ["<pad>", "<bos>", "<sep>", "<eos>"]
    colours = ["red", "green", "blue", "gold"]
    words = ["apple", "leaf", "sky", "sun", "rose", "moss", "sea", "coin"]  # word i fits colour i % 4

    def __init__(self) -> None:
        self.vocab = self.special + self.colours + self.words
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.sep_token_id, self.eos_token_id = 0, 1, 2, 3
        self.first_colour, self.first_word = len(self.special), len(self.special) + len(self.colours)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Space-separated tokens to ids; an unknown token is an error naming the vocabulary."""
        out = []
        for token in text.split():
            if token not in self.ids:
                raise ValueError(f"Unknown token {token!r}; the toy vocabulary is {self.vocab}.")
            out.append(self.ids[token])
        return out

    def decode(self, ids, skip_special: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return " ".join(self.vocab[i] for i in ids if not (skip_special and i < len(self.special)))


class ToyLanguageDataset(torch.utils.data.Dataset):
    """Offline sequences of the colour-naming task from a mediocre behaviour policy.

    Args:
        size: number of sequences.
        utterance_length: word slots per answer (L); an answer has at most L
            words, then ``<eos>``, so at most L + 1 actions.
        p_good: chance that the behaviour policy picks a fitting word on
            purpose (it also hits one by chance, 2 words in 8).
        p_stop: chance that it stops before each word after the first.
        seed: seed of the generated data.
    """

    #: The toy vocabulary's size (ToyTokenizer().vocab_size).
    VOCAB_SIZE = len(ToyTokenizer.special) + len(ToyTokenizer.colours) + len(ToyTokenizer.words)

    @staticmethod
    def estimate_bytes(size: int, utterance_length: int = 4) -> int:
        """Bytes a dataset of ``size`` sequences takes at its peak while it is made: its six tensors of
        (size, 4 + L) or so values (tokens, indices in int64) and the temporaries (an upper bound)."""
        return size * (4 + utterance_length) * 64

    def __init__(self, size: int = 2048, utterance_length: int = 4, p_good: float = 0.3, p_stop: float = 0.1,
                 seed: int = 0) -> None:
        check_seed(seed, "ToyLanguageDataset")
        if size < 1 or utterance_length < 1 or not 0 <= p_good <= 1 or not 0 <= p_stop < 1:
            raise ValueError(f"ToyLanguageDataset: need size >= 1, utterance_length >= 1, 0 <= p_good <= 1 and "
                             f"0 <= p_stop < 1; got size={size}, utterance_length={utterance_length}, "
                             f"p_good={p_good}, p_stop={p_stop}.")
        self.tokenizer = ToyTokenizer()
        self.utterance_length, self.p_good, self.p_stop = utterance_length, p_good, p_stop
        generator = torch.Generator().manual_seed(seed)
        self.tokens = self.behaviour(self.prompts(size, generator), generator)  # (N, 4 + L)
        self.data = self.collate(self.tokens)
        self.behaviour_reward = self.data["rewards"].sum(1).mean().item()

    @property
    def max_len(self) -> int:
        """Tokens of the longest sequence: <bos> colour <sep>, L words, <eos>."""
        return 4 + self.utterance_length

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.data.items()}

    def prompts(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """(n, 3) prompts ``<bos> colour <sep>`` with random colours."""
        t = self.tokenizer
        colour = t.first_colour + torch.randint(len(t.colours), (n,), generator=generator)
        return torch.stack([torch.full_like(colour, t.bos_token_id), colour, torch.full_like(colour, t.sep_token_id)], 1)

    def behaviour(self, prompts: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Answers of the behaviour policy to (n, 3) prompts: (n, 4 + L) tokens, padded."""
        t, n, length = self.tokenizer, len(prompts), self.utterance_length
        colour = prompts[:, 1] - t.first_colour
        fitting = t.first_word + colour[:, None] + len(t.colours) * torch.randint(2, (n, length), generator=generator)
        anything = t.first_word + torch.randint(len(t.words), (n, length), generator=generator)
        words = torch.where(torch.rand(n, length, generator=generator) < self.p_good, fitting, anything)
        stop = torch.rand(n, length, generator=generator) < self.p_stop
        stop[:, 0] = False  # at least one word
        count = torch.where(stop.any(1), stop.int().argmax(1), torch.full((n,), length))  # words before stopping
        slots = torch.arange(length + 1)
        answer = torch.cat([words, torch.zeros(n, 1, dtype=torch.long)], 1)
        answer = torch.where(slots < count[:, None], answer, t.pad_token_id)
        answer[torch.arange(n), count] = t.eos_token_id
        return torch.cat([prompts, answer], 1)

    def score(self, tokens: torch.Tensor) -> torch.Tensor:
        """(n,) rewards of (n, T) sequences ``<bos> colour <sep> answer``: the number of fitting
        words before ``<eos>`` among the first L answer tokens."""
        return self.token_rewards(tokens).sum(1)

    def token_rewards(self, tokens: torch.Tensor) -> torch.Tensor:
        """(n, L) reward of each of the first L answer tokens: 1 for a fitting word said before ``<eos>``."""
        t, length = self.tokenizer, self.utterance_length
        answer = tokens[:, 3:3 + length]
        before_eos = torch.cumsum((answer == t.eos_token_id).int(), 1) == 0
        is_word = (answer >= t.first_word) & (answer < t.first_word + len(t.words))
        fits = is_word & ((answer - t.first_word) % len(t.colours) == (tokens[:, 1:2] - t.first_colour))
        return (fits & before_eos).float()

    def collate(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """AgileRL's ILQL batch of (n, T) sequences ending in ``<eos>`` (then padding).

        Returns:
            ``tokens`` (n, T), ``attn_mask`` (n, T), ``state_idxs`` (n, A + 1),
            ``action_idxs`` (n, A), ``rewards`` (n, A) (1 at each fitting word),
            ``terminals`` (n, A + 1), A = T - 3 actions at most.
        """
        t = self.tokenizer
        n, width = tokens.shape
        real = tokens != t.pad_token_id
        actions = real[:, 3:].sum(1)  # answer tokens including <eos>
        most = width - 3
        slots = torch.arange(most)
        valid = slots < actions[:, None]  # (n, A)
        action_idxs = torch.where(valid, 2 + slots, 0)
        state_valid = torch.arange(most + 1) <= actions[:, None]
        state_idxs = torch.where(state_valid, 2 + torch.arange(most + 1), 0)
        rewards = torch.zeros(n, most)
        per_token = self.token_rewards(tokens)
        rewards[:, :per_token.shape[1]] = per_token
        terminals = (~(torch.arange(most + 1) < actions[:, None])).float()  # 1 from the state after the last action
        return {"tokens": tokens, "attn_mask": real.float(), "state_idxs": state_idxs, "action_idxs": action_idxs,
                "rewards": rewards, "terminals": terminals}

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """A random batch (with replacement) in the layout of :meth:`collate`."""
        index = torch.randint(len(self), (batch_size,), generator=generator)
        return {k: v[index] for k, v in self.data.items()}
