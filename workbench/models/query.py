"""QueryModule, SipHash and HashToInt: torchrl-compatible, vectorized and reproducible.

A :class:`QueryModule` turns rows of one or more keys of a tensordict (for
example an MCTS node's observation and action) into contiguous int64 indices
of a storage: equal rows get equal indices, new rows the next free index in
first-seen order. It follows ``torchrl.data.QueryModule`` (same constructor,
same ``forward``, same indices on the same row streams) and differs where
torchrl's version bites:

* :class:`SipHash` computes SipHash-1-3 (the algorithm behind Python's
  ``hash()``, which torchrl calls row by row under a key drawn anew in every
  process) for all rows in one compiled loop (numba) under a fixed key, so
  a hash is the same in every process;
* :class:`HashToInt` is an open-addressing table probed in the same kind of
  compiled loop, not a Python dict walked row by row;
* with several in_keys and no hash modules given, the rows of all keys are
  hashed in one pass (see :class:`QueryModule`);
* the key-to-index map is part of ``state_dict()`` (torchrl's raises
  ``TypeError``), so a map can be saved and loaded into a fresh process.

Rows are compared by their bytes in their own dtype, as torchrl compares
them, with ``-0.0`` written as ``0.0`` and every NaN as one NaN, so equal
numbers hash equal. Rows of different dtypes are different rows. Hashing
and the map run on the CPU (as torchrl's do); indices come back on the
input's device.
"""

from __future__ import annotations

import copy
import math
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.models._query_kernels import lookup_insert, siphash_blocks
from workbench.params import check_arguments
from workbench.registry import register_model

__all__ = ["QueryModule", "SipHash", "HashToInt", "check_rows", "row_bytes", "siphash"]

NestedKey = str | tuple[str, ...]

_DEFAULT_KEY = bytes(16)  # all zeros: the key Python's hash() uses under PYTHONHASHSEED=0
_EXACT_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


# --- rows -> bytes -> SipHash ------------------------------------------------------------

def check_rows(x: Any, what: str = "input") -> None:
    """Raise a clear error unless ``x`` is a (B, ...) tensor of a dtype :class:`SipHash` hashes."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor with rows along dim 0, got {type(x).__name__}.")
    if x.dim() == 0:
        raise ValueError(f"{what} is 0-dimensional; keys need a batch dimension: shape (B, ...), e.g. x.reshape(1).")
    if not (x.is_floating_point() or x.dtype in _EXACT_DTYPES):
        raise TypeError(f"{what} has dtype {x.dtype}; keys must be bool, int8..int64, uint8 or a real floating dtype. "
                        "Convert it first, e.g. x.to(torch.int64).")


def row_bytes(x: torch.Tensor, what: str = "input") -> np.ndarray:
    """The bytes of each row that :class:`SipHash` hashes.

    Rows are the row's elements in its own dtype, C order, as torchrl hashes
    them, except that ``-0.0`` is written as ``0.0`` and every NaN as one NaN,
    so that equal numbers give equal bytes.

    Args:
        x: (B, ...) tensor of a bool, integer or floating dtype, any device.
        what: how error messages name ``x``.

    Returns:
        (B, L) uint8 array, L the row's size in bytes.

    Raises:
        TypeError: ``x`` is not a tensor or has a complex or unsigned 16-64 bit dtype.
        ValueError: ``x`` is 0-dimensional (it has no rows).
    """
    check_rows(x, what)
    rows = x.detach().to("cpu").reshape(x.shape[0], math.prod(x.shape[1:]))  # not -1: a (0, ...) batch has rows
    if rows.dtype == torch.bfloat16:  # numpy has no bfloat16: canonicalize in torch, hash its 2-byte pattern
        rows = rows + 0.0
        rows = rows.masked_fill(torch.isnan(rows), float("nan")).view(torch.int16)
    values = rows.numpy()
    if values.dtype.kind == "f":
        values = values + values.dtype.type(0)  # -0.0 + 0.0 is +0.0 under round-to-nearest
        nan = np.isnan(values)
        if nan.any():
            values[nan] = np.nan
    return np.ascontiguousarray(values).view(np.uint8).reshape(len(values), values.shape[1] * values.itemsize)


def _words(messages: np.ndarray) -> np.ndarray:
    """(B, L) uint8 -> (B, ceil(L/8)) little-endian uint64 words, the last zero-padded."""
    count, length = messages.shape
    if length % 8:
        padded = np.zeros((count, 8 * -(-length // 8)), dtype=np.uint8)
        padded[:, :length] = messages
        messages = padded
    return np.ascontiguousarray(messages).view("<u8").astype(np.uint64, copy=False)


def siphash(messages: np.ndarray, key: bytes = _DEFAULT_KEY, rounds: tuple[int, int] = (1, 3)) -> np.ndarray:
    """SipHash-c-d of every row of a byte matrix, in one compiled loop over the rows.

    Args:
        messages: (B, L) uint8, one L-byte message per row.
        key: the 16-byte key.
        rounds: (c, d) compression and finalization rounds; (1, 3) is the
            variant Python's ``hash()`` uses since 3.11, (2, 4) the paper's.

    Returns:
        (B,) uint64 digests.
    """
    count, length = messages.shape
    words = _words(messages)
    full = length // 8
    tail = words[:, full] if length % 8 else np.zeros(count, dtype=np.uint64)
    return _siphash(words[:, :full], tail, length, key, rounds)


def _siphash(blocks: np.ndarray, tail: np.ndarray, length: int, key: bytes, rounds: tuple[int, int]) -> np.ndarray:
    """SipHash of messages given as (B, W) full 8-byte blocks, (B,) zero-padded leftover bytes and their length."""
    k0, k1 = (np.uint64(int.from_bytes(half, "little")) for half in (key[:8], key[8:]))
    last = tail | np.uint64((length & 0xFF) << 56)  # the last block carries the length in its top byte
    return siphash_blocks(np.ascontiguousarray(blocks), np.ascontiguousarray(last), k0, k1, *rounds)


class SipHash(nn.Module):
    """Keyed SipHash of each row of a tensor, the same in every process.

    Same interface as ``torchrl.data.SipHash``: input (B, ...) of any bool,
    integer or floating dtype; output (B,) int64. torchrl's hashes each row's
    bytes with Python's ``hash()``, which is SipHash-1-3 under a key drawn
    anew in every process unless ``PYTHONHASHSEED`` is set. This one computes
    SipHash-1-3 itself, for all rows in one compiled loop (numba),
    under a fixed key (a buffer, so it travels in ``state_dict()``). With the
    default all-zero key the hashes equal torchrl's under ``PYTHONHASHSEED=0``
    (rows holding ``-0.0`` or non-canonical NaNs aside, see :func:`row_bytes`).

    Args:
        as_tensor: return the hashes as an int64 tensor; ``False`` returns, as
            torchrl's does, the bytes of each row that would be hashed.
        key: the 16-byte key; the same key gives the same hashes everywhere.
        rounds: (c, d) SipHash rounds; (2, 4) for the paper's SipHash-2-4.
    """

    def __init__(self, as_tensor: bool = True, *, key: bytes = _DEFAULT_KEY, rounds: tuple[int, int] = (1, 3)) -> None:
        super().__init__()
        if not isinstance(key, (bytes, bytearray)) or len(key) != 16:
            raise ValueError(f"SipHash key must be 16 bytes, got {key!r}. Example: SipHash(key=bytes(range(16))).")
        if len(rounds) != 2 or not all(isinstance(r, int) and r >= 1 for r in rounds):
            raise ValueError(f"SipHash rounds must be two positive ints (c, d), e.g. (1, 3) or (2, 4); got {rounds!r}.")
        self.as_tensor = as_tensor
        self.rounds = tuple(rounds)
        self.register_buffer("key", torch.tensor(list(key), dtype=torch.uint8))

    def forward(self, x: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor | list[bytes]:
        """Hash each row of ``x`` (B, ...), or of several tensors together (see :meth:`hash_rows`)."""
        if isinstance(x, (list, tuple)):
            return self.hash_rows(x)
        return self._digest(row_bytes(x), x.device)

    def hash_rows(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor | list[bytes]:
        """One hash per row of several (B, ...) tensors taken together.

        The message of row i is row i's bytes of every tensor in turn, each
        zero-padded to whole 8-byte words; a checksum of the tensors' dtypes
        and row shapes is folded into the key, so rows of differently shaped
        or typed tensors never hash alike by construction. One pass over the
        joint bytes takes far fewer rounds than hashing each tensor and then
        the stacked hashes.
        """
        parts = [_words(row_bytes(t, f"tensor {i}")) for i, t in enumerate(tensors)]
        if len({len(p) for p in parts}) > 1:
            raise ValueError(f"hash_rows needs tensors with the same number of rows, got {[len(p) for p in parts]}.")
        if not self.as_tensor:
            return [row.tobytes() for row in np.concatenate(parts, axis=1).view(np.uint8)]
        signature = zlib.crc32(repr([(str(t.dtype), tuple(t.shape[1:])) for t in tensors]).encode())
        key = (int.from_bytes(self._key[:8], "little") ^ signature).to_bytes(8, "little") + self._key[8:]
        blocks = np.concatenate(parts, axis=1)
        tail = np.zeros(len(blocks), dtype=np.uint64)
        return self._finish(_siphash(blocks, tail, 8 * blocks.shape[1], key, self.rounds), tensors[0].device)

    @property
    def _key(self) -> bytes:
        return bytes(self.key.tolist())

    def _digest(self, messages: np.ndarray, device: torch.device) -> torch.Tensor | list[bytes]:
        if not self.as_tensor:
            return [row.tobytes() for row in messages]
        return self._finish(siphash(messages, self._key, self.rounds), device)

    @staticmethod
    def _finish(digests: np.ndarray, device: torch.device) -> torch.Tensor:
        digests = digests.view(np.int64)
        # Python's hash() never returns -1 (it means "error" in C); torchrl's hashes inherit that
        digests[digests == -1] = -2
        return torch.from_numpy(digests).to(device)

    def extra_repr(self) -> str:
        return f"as_tensor={self.as_tensor}, rounds={self.rounds}"


# --- hash -> contiguous index -------------------------------------------------------

class HashToInt(nn.Module):
    """Maps int64 hash values to contiguous indices 0, 1, 2 ... in first-seen order.

    Same call as ``torchrl.data.HashToInt``: ``hash_to_int(hashes, extend=False)``
    returns, for hashes of shape (*), indices of the same shape and dtype;
    with ``extend=True`` unseen hashes are added (duplicates in one call share
    an index), otherwise they get the current size of the map.

    The map is an open-addressing hash table (linear probing, load <= 1/2)
    looked up and extended row by row in order in a compiled loop, so indices
    follow first-seen order exactly as torchrl's dict does.

    ``state_dict()`` holds ``keys`` (the hashes in index order) and ``values``
    (their indices), the layout torchrl's ``state_dict`` means to write, and
    works nested inside a parent module's ``state_dict()``.
    """

    _MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of h * 2**64/phi pick the slot
    #: state entries whose length is the map's size, not fixed by the module: a map of any size loads
    #: (``workbench.checkpoints.load_weights`` checks their presence, and ``load_state_dict`` their contents)
    resizable_state = ("keys", "values")

    def __init__(self) -> None:
        super().__init__()
        self._set_map(np.empty(0, dtype=np.int64))

    def __len__(self) -> int:
        return self._size

    @property
    def keys(self) -> torch.Tensor:
        """(N,) int64: the known hashes in index order (a copy)."""
        return torch.from_numpy(self._by_index[: self._size].copy())

    def forward(self, key: torch.Tensor, extend: bool = False) -> torch.Tensor:
        if not isinstance(key, torch.Tensor) or key.is_floating_point() or key.is_complex() or key.dtype == torch.bool:
            got = key.dtype if isinstance(key, torch.Tensor) else type(key).__name__
            raise TypeError(f"HashToInt expects an integer tensor of hashes, got {got}. "
                            "Hash the rows first, e.g. with SipHash().")
        flat = np.ascontiguousarray(key.detach().reshape(-1).to("cpu", torch.int64).numpy())
        if extend:
            self._reserve(len(flat))
        index, self._size = lookup_insert(self._table, self._bits, self._by_index, self._size, flat, extend, self._MIX)
        return torch.from_numpy(index).reshape(key.shape).to(device=key.device, dtype=key.dtype)

    def _reserve(self, extra: int) -> None:
        """Room for ``extra`` more hashes: the by-index array and the table (load <= 1/2) at least double."""
        need = self._size + extra
        if need > len(self._by_index):
            grown = np.empty(max(2 * len(self._by_index), need, 1024), dtype=np.int64)
            grown[: self._size] = self._by_index[: self._size]
            self._by_index = grown
        if 2 * need > len(self._table):
            self._build_table(max(need, len(self._table)))

    def _build_table(self, capacity: int) -> None:
        self._bits = max(10, int(2 * capacity - 1).bit_length())
        self._table = np.zeros((1 << self._bits, 2), dtype=np.int64)  # rows (hash, index); index -1: empty
        self._table[:, 1] = -1
        known = self._by_index[: self._size].copy()
        _, size = lookup_insert(self._table, self._bits, self._by_index, 0, known, True, self._MIX)
        assert size == self._size, "a hash twice in the map"  # the map's keys are distinct by construction

    def _set_map(self, keys: np.ndarray) -> None:
        self._by_index = np.array(keys, dtype=np.int64)
        self._size = len(keys)
        self._build_table(self._size)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:  # noqa: ANN001 (torch's signature)
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "keys"] = self.keys
        destination[prefix + "values"] = torch.arange(self._size, dtype=torch.int64)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:  # noqa: ANN001 (torch's signature)
        names = [prefix + "keys", prefix + "values"]
        absent = [n for n in names if n not in state_dict]
        if absent:
            missing_keys.extend(absent)
            return
        keys, values = state_dict[names[0]], state_dict[names[1]]
        problem = None
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)) or keys.dim() != 1 \
                or keys.shape != values.shape or keys.dtype != torch.int64 or values.dtype != torch.int64:
            problem = "'keys' and 'values' must be 1-D int64 tensors of equal length"
        elif not torch.equal(torch.sort(values).values, torch.arange(len(values))):
            problem = f"'values' must be the indices 0..{len(values) - 1}, each once"
        elif len(torch.unique(keys)) != len(keys):
            problem = "'keys' holds a hash twice"
        if problem:
            error_msgs.append(f"HashToInt map at {prefix or '<root>'!r}: {problem}. "
                              "Load a state_dict saved by HashToInt.state_dict().")
            return
        ordered = torch.empty_like(keys)
        ordered[values] = keys
        self._set_map(ordered.numpy())

    def extra_repr(self) -> str:
        return f"size={self._size}"


# --- QueryModule -------------------------------------------------------------------

def _key_name(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(key)


def _check_key(key: Any, what: str) -> NestedKey:
    if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
        return key
    raise TypeError(f"{what} must be a string or a tuple of strings (a nested key), got {key!r}.")


def _parts(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


def _overlap(a: NestedKey, b: NestedKey) -> str | None:
    """How writing ``a`` would meet ``b``: "is" (the same key), "contains" or "is inside" it, or None."""
    pa, pb = _parts(a), _parts(b)
    if pa[:len(pb)] != pb[:len(pa)]:
        return None
    return "is" if len(pa) == len(pb) else "contains" if len(pa) < len(pb) else "is inside"


def _check_layout(in_keys: list[NestedKey], index_key: NestedKey, hash_key: NestedKey) -> None:
    """Refuse keys that would lose or overwrite data: an empty name, index_key and hash_key on the
    same entry, an output key on an input's entry (nested keys count where one holds the other)."""
    examples = {"in_key": "in_keys=['observation', 'action']", "index_key": "index_key='_index'",
                "hash_key": "hash_key='_hash'"}
    for what, key in [*(("in_key", k) for k in in_keys), ("index_key", index_key), ("hash_key", hash_key)]:
        if "" in _parts(key):
            empty = "is an empty name" if isinstance(key, str) else "has an empty name in it"
            raise ValueError(f"QueryModule: {what} {key!r} {empty}. Name the key, e.g. {examples[what]}.")
    how = _overlap(index_key, hash_key)
    if how:
        clash = ("the same key: the hash would overwrite the index" if how == "is" else
                 "nested one in the other: one would be written over or into the other")
        raise ValueError(f"QueryModule: index_key {index_key!r} and hash_key {hash_key!r} are {clash}. Give them "
                         "separate keys, e.g. index_key='_index', hash_key='_hash' (the defaults).")
    for what, key, default in (("index_key", index_key, "_index"), ("hash_key", hash_key, "_hash")):
        for in_key in in_keys:
            how = _overlap(key, in_key)
            if how:
                free = default if not any(_overlap(default, k) for k in in_keys) else f"{default}_out"
                where = {"is": "is also an in_key", "contains": f"holds in_key {in_key!r}",
                         "is inside": f"lies inside in_key {in_key!r}"}[how]
                harm = "write into" if how == "is inside" else "overwrite"
                raise ValueError(f"QueryModule: {what} {key!r} {where}: writing the "
                                 f"{what.removesuffix('_key')} would {harm} that input. Choose an output key "
                                 f"apart from the in_keys, e.g. {what}={free!r}.")


def _get(data: Any, key: NestedKey) -> Any:
    """``data[key]`` for a TensorDict or a (nested) dict, with an error naming what exists."""
    parts = (key,) if isinstance(key, str) else key
    node = data
    for i, part in enumerate(parts):
        try:
            node = node[part] if isinstance(node, Mapping) else node.get(part)
        except (KeyError, AttributeError, TypeError):
            node = None
        if node is None:
            where = data if i == 0 else _get(data, parts[:i])
            have = sorted(map(str, where.keys())) if hasattr(where, "keys") else []
            raise KeyError(f"QueryModule: key {_key_name(key)!r} is missing from the input "
                           f"(it has {have}). Set in_keys to keys the input holds.")
    return node


def _is_tensordict(data: Any) -> bool:
    # duck-typed so that tensordict stays optional; checked first, as TensorDict also registers as a Mapping
    return hasattr(data, "batch_size") and hasattr(data, "set")


def _set(data: Any, key: NestedKey, value: torch.Tensor) -> None:
    if _is_tensordict(data):  # a TensorDict sets nested keys itself
        data.set(key, value)
        return
    parts = (key,) if isinstance(key, str) else key
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _copy(data: Any, out_keys: Sequence[NestedKey]) -> Any:
    """A shallow copy; for dicts, the nested dicts on the written paths are copied too."""
    if _is_tensordict(data):
        return data.copy()
    out = dict(data)
    for key in out_keys:
        if isinstance(key, tuple):
            node = out
            for part in key[:-1]:
                if isinstance(node.get(part), Mapping):
                    node[part] = dict(node[part])
                    node = node[part]
                else:
                    break
    return out


class QueryModule(nn.Module):
    """Turns rows of ``in_keys`` into storage indices: equal rows, equal index.

    Interface of ``torchrl.data.QueryModule``; see the module docstring for
    what differs. With hash modules given, each in_key is hashed per row by
    its hash module and, with several in_keys, the per-key hashes stacked to
    (B, K) are hashed again by the aggregator, as torchrl does. Without them,
    several in_keys are hashed together in one SipHash pass over each row's
    joint bytes (:meth:`SipHash.hash_rows`; for an observation and an action
    that is 7 SipHash rounds instead of 17); ``hash_module`` is then empty.
    ``hash_to_int`` maps the hash to an index.

    Args:
        in_keys: a key or a list of keys of the input (nested keys as tuples).
        index_key: where the int64 index is written. Defaults to ``"_index"``.
        hash_key: where the int64 hash is written. Defaults to ``"_hash"``.
        hash_module: a callable (B, ...) -> (B,) int64, or a list of them, one
            per in_key. A single one serves every key (deep-copied per key).
            Defaults to :class:`SipHash` (of all in_keys together, see above).
        hash_to_int: the stateful hash -> index map. Defaults to :class:`HashToInt`.
        aggregator: combines the per-key hashes (B, K) -> (B,) when there are
            several in_keys. Defaults to the single ``hash_module`` when one was
            given, else :class:`SipHash`. Ignored (with a warning) for one in_key.
        clone: return a shallow copy of the input instead of writing into it;
            ``forward(..., clone=)`` overrides it per call.

    Raises:
        ValueError: no in_keys, a hash_module list of the wrong length, an empty key name,
            ``hash_key`` equal to ``index_key``, or an output key that is an in_key (or holds
            one, or lies inside one): torchrl's builds these and loses an output or an input.
        TypeError: a key that is not a string/tuple, or a hash module that is not callable.

    Examples:
        >>> import torch
        >>> from workbench.models.query import QueryModule
        >>> q = QueryModule(["observation", "action"])
        >>> obs = torch.tensor([[0.5, 1.0], [2.0, 3.0], [0.5, 1.0]])
        >>> out = q({"observation": obs, "action": torch.tensor([1, 1, 1])})
        >>> out["_index"].tolist()                                # rows 0 and 2 are equal
        [0, 1, 0]
        >>> q({"observation": obs[:1], "action": torch.tensor([7])}, extend=False)["_index"].tolist()
        [2]
    """

    def __init__(
        self,
        in_keys: NestedKey | list[NestedKey],
        index_key: NestedKey = "_index",
        *,
        hash_key: NestedKey = "_hash",
        hash_module: Callable[[torch.Tensor], torch.Tensor] | list[Callable[[torch.Tensor], torch.Tensor]] | None = None,
        hash_to_int: Callable[..., torch.Tensor] | None = None,
        aggregator: Callable[[torch.Tensor], torch.Tensor] | None = None,
        clone: bool = False,
    ) -> None:
        super().__init__()
        keys = list(in_keys) if isinstance(in_keys, list) else [in_keys]
        if not keys:
            raise ValueError("QueryModule: in_keys cannot be empty; pass the keys whose rows identify an entry, "
                             "e.g. in_keys=['observation', 'action'].")
        self.in_keys = [_check_key(k, "each in_key") for k in keys]
        self.index_key = _check_key(index_key, "index_key")
        self.hash_key = _check_key(hash_key, "hash_key")
        _check_layout(self.in_keys, self.index_key, self.hash_key)
        self.out_keys = [self.index_key, self.hash_key]

        aggregator_given = aggregator is not None
        if aggregator is not None and len(self.in_keys) == 1:
            warnings.warn("QueryModule: an aggregator was given but there is only one in_key; it is not used.",
                          stacklevel=2)
        elif aggregator is None:
            aggregator = hash_module if hash_module is not None and not isinstance(hash_module, list) else SipHash()
        if hash_module is None:
            # one key: its own SipHash, as torchrl; several and no aggregator given: the aggregator hashes them jointly
            modules = [SipHash() for _ in self.in_keys] if len(self.in_keys) == 1 or aggregator_given else []
        elif isinstance(hash_module, list):
            if len(hash_module) != len(self.in_keys):
                raise ValueError(f"QueryModule: got {len(hash_module)} hash modules for {len(self.in_keys)} in_keys "
                                 f"{[_key_name(k) for k in self.in_keys]}; pass one per in_key or a single one.")
            modules = list(hash_module)
        else:
            modules = [copy.deepcopy(hash_module) if len(self.in_keys) > 1 else hash_module for _ in self.in_keys]
        for m in [*modules, aggregator]:
            if not callable(m):
                raise TypeError(f"QueryModule: hash modules and the aggregator must be callable, got {m!r}.")

        self.hash_module = dict(zip(self.in_keys, modules))  # torchrl's attribute: in_key -> hash module
        # registered as submodules (when they are modules) so their keys travel in state_dict()
        self.hash_modules = nn.ModuleList(m for m in modules if isinstance(m, nn.Module))
        self.aggregator = aggregator
        self.hash_to_int = HashToInt() if hash_to_int is None else hash_to_int
        self.clone = clone

    def _rows(self, tensordict: Any) -> list[torch.Tensor]:
        if not (isinstance(tensordict, Mapping) or _is_tensordict(tensordict)):
            raise TypeError(f"QueryModule expects a TensorDict or a dict of tensors, got {type(tensordict).__name__}.")
        values = [_get(tensordict, k) for k in self.in_keys]
        batch = []
        for key, value in zip(self.in_keys, values):
            check_rows(value, f"QueryModule in_key {_key_name(key)!r}")
            batch.append(value.shape[0])
        if len(set(batch)) > 1:
            sizes = ", ".join(f"{_key_name(k)!r}: {b}" for k, b in zip(self.in_keys, batch))
            raise ValueError(f"QueryModule: in_keys have different numbers of rows ({sizes}); every key needs "
                             "the same leading (batch) dimension.")
        return values

    def forward(self, tensordict: Any, *, extend: bool = True, write_hash: bool = True,
                clone: bool | None = None) -> Any:
        """Write the index (and hash) of every row.

        Args:
            tensordict: a ``tensordict.TensorDict`` or a dict of (B, ...) tensors.
            extend: add unseen rows to the map; ``False`` gives them the map's
                current size as index and leaves the map unchanged.
            write_hash: also write the hash at ``hash_key``.
            clone: write into a shallow copy (defaults to the constructor's ``clone``).

        Returns:
            The input (or its copy) with ``index_key`` (B,) int64 and ``hash_key`` (B,) int64.

        Raises:
            KeyError: an in_key is missing.
            ValueError: in_keys with different batch sizes, or 0-dimensional keys.
            TypeError: an unsupported dtype or input type.
        """
        check_arguments(QueryModule.forward, "QueryModule", extend=extend, write_hash=write_hash, clone=clone)
        values = self._rows(tensordict)  # every check happens before the map changes
        if not self.hash_module:
            hashed = self.aggregator(values)  # SipHash of the rows of all in_keys together
        else:
            hashes = [self.hash_module[k](v) for k, v in zip(self.in_keys, values)]
            hashed = self.aggregator(torch.stack(hashes, dim=-1)) if len(hashes) > 1 else hashes[0]
        index = self.hash_to_int(hashed, extend=extend)
        output = _copy(tensordict, self.out_keys) if (self.clone if clone is None else clone) else tensordict
        _set(output, self.index_key, index)
        if write_hash:
            _set(output, self.hash_key, hashed)
        return output

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, index_key={self.index_key!r}, hash_key={self.hash_key!r}"


# --- registry ------------------------------------------------------------------

def _example_inputs(model: QueryModule, batch_size: int, generator: torch.Generator | None = None):
    """Rows drawn from a few distinct values per key, so that some rows repeat."""
    data = {}
    for i, key in enumerate(model.in_keys):
        value = torch.randint(0, 3, (batch_size, 2), generator=generator)
        _set(data, key, value.float() if i == 0 else value)
    return (data,), {}


@register_model("query_module", family="storage", example_inputs=_example_inputs, objective=None,
                defaults=dict(in_keys=["observation", "action"]))
def query_module(in_keys: list[str], index_key: str = "_index", hash_key: str = "_hash",
                 clone: bool = False) -> QueryModule:
    """torchrl-compatible QueryModule: rows of keys -> contiguous storage indices.

    Args:
        in_keys: keys whose rows identify an entry.
        index_key: where the int64 index is written.
        hash_key: where the int64 hash is written.
        clone: return a copy of the input instead of writing into it.
    """
    return QueryModule(list(in_keys), index_key, hash_key=hash_key, clone=clone)
