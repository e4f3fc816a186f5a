"""``watch`` under ``torch.distributed``: one view of a data-parallel run across its processes.

Each rank watches its own replica (its shard of the batch); at every recorded step
:class:`DistributedRecorder` gathers the ranks' raw sums to rank 0 with ONE collective
(``torch.distributed.gather_object``) and rank 0 publishes a single record: the statistics of
the global batch. Rank 0's recorder feeds its subscribers and its run store; the other ranks
publish nothing of their own.

What a merged row is:

- ``activation`` and ``grad_output`` rows of one call site on several ranks are the rows of
  the concatenation of the ranks' tensors: counts add, sums are re-centred on a common shift
  before they add (so the variance keeps its precision), min and max combine. The shape is
  the concatenation's along dim 0 (rank 0's shape where the ranks' shapes do not concatenate).
- ``grad_output`` rows are scaled by ``grad_scale`` (``1 / world_size`` by default) before
  they merge: DDP and FSDP average the ranks' gradients, so the objective a data-parallel
  run optimizes is the mean of the ranks' losses, and the gradient of that objective w.r.t. an
  activation of rank ``r`` is ``1 / world_size`` of the gradient of rank ``r``'s own loss. With
  equal shards and a mean loss, that is what one process sees over the concatenated batch.
- ``param`` and ``param_grad`` rows are taken by the recorder itself at ``step()`` (the watch
  under it is started with ``parameters=False, parameter_grads=False``): under DDP from rank 0
  alone (the replicas are equal, and after the backward every ``.grad`` holds the averaged
  gradient; the watch's own gradient hooks run before DDP's all-reduce has finished and would
  see the rank's local gradient); for parameters that are DTensors (FSDP2's ``fully_shard``)
  from every rank's shard (``to_local()``), merged like the activations, shaped as the whole
  parameter.
- Histograms of a row merged from ranks whose ranges differ are re-binned onto the global
  [min, max]: each rank's counts are spread over the new bins in proportion to the overlap
  (values taken as uniform inside a bin), so the total count is exact and a value is placed
  within one of its rank's bin widths; where the ranks' ranges agree the counts just add.
- Metrics of a recorded step are the mean over the ranks that logged them (``metrics="mean"``)
  or rank 0's (``metrics="rank0"``); metrics of steps that are not recorded are rank 0's (the
  collective runs only at recorded steps).
- Errors carry the rank they happened on (``"rank"`` and a ``[rank r]`` prefix).

With ``per_rank=True`` rank 0 also keeps each rank's own rows (what that rank's watch
recorded, unscaled) in ``recorder.ranks[r]`` (a :class:`Recorder` each, to subscribe to) and
:meth:`DistributedRecorder.rank_frame` gives them with a ``rank`` column.

A rank whose watch fails does not hang the others: every rank reaches the collective at every
recorded step whatever its hooks did (they report failures in the record's errors), and a
failure of this module's own work on a rank sends an empty payload that names the error.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from workbench.instrument.recorder import Recorder, StepRecord, rows_frame

try:  # (the schema is taking the sums over from stats)
    from workbench.instrument.schema import SUMS
except ImportError:  # pragma: no cover
    from workbench.instrument.stats import SUMS

__all__ = ["DistributedRecorder", "watch_distributed", "merge_rows", "unwrap"]

SUM, SUM_SQ, ABS_SUM, MIN, MAX, NONZERO, NAN, INF, SHIFT = (SUMS.index(name) for name in (
    "sum", "sum_sq", "abs_sum", "min", "max", "nonzero", "nan", "inf", "shift"))
_EMPTY = np.array([0.0, 0.0, 0.0, math.nan, math.nan, 0.0, 0.0, 0.0, 0.0])
_METRICS = ("mean", "rank0")

ModuleSelector = str | Sequence[str] | Callable[[str], bool] | None


def unwrap(model: nn.Module) -> nn.Module:
    """The model a ``DistributedDataParallel`` (or ``DataParallel``) wraps, else ``model``: its
    module paths are the ones a user knows (no ``module.`` prefix)."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def _is_dtensor(x: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, DTensor)


def _selector(spec: ModuleSelector, what: str) -> Callable[[str], bool]:
    """The selection rule of ``watch(modules=..., exclude=...)``."""
    if spec is None:
        return lambda path: False
    if callable(spec):
        return spec
    patterns = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple, set)) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{what} must be a glob string, a list of globs or a predicate on the module path, "
                        f"got {spec!r}.")
    return lambda path: any(fnmatch.fnmatchcase(path, p) for p in patterns)


def tensor_sums(tensors: Sequence[torch.Tensor], bins: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The raw SUMS rows ``(n, 9)`` of ``tensors`` (and their histograms ``(n, bins)`` over each
    tensor's [min, max], or None), with torch's kernels in float64 and one host transfer."""
    if not tensors:
        return np.zeros((0, len(SUMS))), (np.zeros((0, bins), np.float32) if bins else None)
    rows, hists = [], []
    for t in tensors:
        x = t.detach()
        if x.is_complex():
            x = x.abs()
        x = x.reshape(-1).to(torch.float64)
        if x.numel() == 0:
            rows.append(torch.as_tensor(_EMPTY, device=x.device))
            if bins:
                hists.append(torch.zeros(bins, dtype=torch.float64, device=x.device))
            continue
        shift = torch.where(torch.isfinite(x[0]), x[0], torch.zeros_like(x[0]))
        centred = x - shift
        lo, hi = torch.aminmax(x)
        row = torch.stack([centred.sum(), centred.square().sum(), x.abs().sum(), lo, hi,
                           (x != 0).sum().double(), torch.isnan(x).sum().double(), torch.isinf(x).sum().double(),
                           shift])
        rows.append(row)
        if bins:
            width = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
            scale = torch.where(torch.isfinite(width), bins / width, torch.full_like(width, math.nan))
            scaled = torch.nan_to_num((x - lo) * scale, nan=-1.0, posinf=-1.0, neginf=-1.0)
            weight = (scaled >= 0).double()  # non-finite values (and a non-finite range) are not binned
            index = scaled.clamp_(0, bins - 1).long()
            hists.append(torch.zeros(bins, dtype=torch.float64, device=x.device).scatter_add_(0, index, weight))
    host = torch.cat([torch.stack(rows)] + ([torch.stack(hists)] if bins else []), 1).cpu().numpy()
    return host[:, :len(SUMS)].copy(), (host[:, len(SUMS):].astype(np.float32) if bins else None)


def _scale(sums: np.ndarray, factor: float) -> np.ndarray:
    """The sums of ``factor * x`` (factor > 0) from those of ``x``."""
    out = sums.copy()
    out[:, [SUM, ABS_SUM, MIN, MAX, SHIFT]] *= factor
    out[:, SUM_SQ] *= factor * factor
    return out


def _rebin(counts: np.ndarray, lo: float, hi: float, edges: np.ndarray) -> np.ndarray:
    """``counts`` of equal bins over [lo, hi] spread over the bins of ``edges`` in proportion to
    the overlap; a zero-width range puts its counts in the bin holding ``lo``."""
    bins = len(edges) - 1
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return np.zeros(bins)
    if hi <= lo:
        out = np.zeros(bins)
        width = edges[-1] - edges[0]
        at = 0 if width <= 0 else min(int((lo - edges[0]) / width * bins), bins - 1)
        out[max(at, 0)] = counts.sum()
        return out
    source = np.linspace(lo, hi, len(counts) + 1)
    below = np.interp(edges, source, np.r_[0.0, np.cumsum(counts, dtype=np.float64)])
    return np.diff(below)


def merge_rows(parts: Sequence[tuple[tuple, np.ndarray, np.ndarray, np.ndarray | None] | None],
               concat_kinds: Sequence[str] = ("activation", "grad_output"),
               ) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray | None, list[list[tuple[int, int]]]]:
    """Rows of several ranks merged into the rows of their tensors taken together.

    Args:
        parts: per rank, ``(keys, numel, sums, histograms or None)`` (None: the rank sent nothing).
            Rows of ranks with the same ``(module, call, kind, tensor)`` are one row.
        concat_kinds: the kinds whose shapes concatenate along dim 0 (the batch); other kinds keep
            the first rank's shape (a parameter's shards carry the whole parameter's shape).

    Returns:
        ``(keys, numel, sums, histograms, sources)``: merged rows in the order they first appear
        (rank 0's first), and for each the ``(rank, row)`` pairs it was made from.
    """
    index: dict[tuple, int] = {}
    keys: list[tuple] = []
    sources: list[list[tuple[int, int]]] = []
    for rank, part in enumerate(parts):
        if part is None:
            continue
        for i, key in enumerate(part[0]):
            name = key[:4]
            m = index.get(name)
            if m is None:
                m = index[name] = len(keys)
                keys.append(key)
                sources.append([])
            sources[m].append((rank, i))
    n = len(keys)
    numel = np.zeros(n, np.int64)
    sums = np.zeros((n, len(SUMS)))
    bins = next((p[3].shape[1] for p in parts if p is not None and p[3] is not None), None)
    hist = np.zeros((n, bins), np.float32) if bins else None
    for m, src in enumerate(sources):
        ns = np.array([parts[r][1][i] for r, i in src], np.int64)
        rows = np.stack([parts[r][2][i] for r, i in src])
        filled = ns > 0
        numel[m] = ns.sum()
        if not filled.any():
            sums[m] = _EMPTY
        else:
            n_r, s_r = ns[filled].astype(np.float64), rows[filled]
            shift = s_r[0, SHIFT]
            d = s_r[:, SHIFT] - shift
            with np.errstate(invalid="ignore", over="ignore"):
                sums[m, SUM] = (s_r[:, SUM] + n_r * d).sum()
                sums[m, SUM_SQ] = (s_r[:, SUM_SQ] + 2 * d * s_r[:, SUM] + n_r * d * d).sum()
            for column in (ABS_SUM, NONZERO, NAN, INF):
                sums[m, column] = s_r[:, column].sum()
            sums[m, MIN] = np.minimum.reduce(s_r[:, MIN])  # (NaN wins, as in torch.aminmax)
            sums[m, MAX] = np.maximum.reduce(s_r[:, MAX])
            sums[m, SHIFT] = shift
        key = keys[m]
        if key[2] in concat_kinds and len(src) > 1:
            shapes = [parts[r][0][i][4] for r, i in src]
            if all(len(s) >= 1 and len(s) == len(shapes[0]) and tuple(s[1:]) == tuple(shapes[0][1:])
                   and all(isinstance(v, int) for v in s[:1]) for s in shapes):
                keys[m] = key[:4] + ((sum(s[0] for s in shapes), *shapes[0][1:]),)
        if hist is not None:
            with_hist = [(r, i) for r, i in src if parts[r][3] is not None and parts[r][1][i] > 0]
            ranges = {(float(parts[r][2][i, MIN]), float(parts[r][2][i, MAX])) for r, i in with_hist}
            if len(ranges) <= 1:
                for r, i in with_hist:
                    hist[m] += parts[r][3][i]
            elif np.isfinite(sums[m, MIN]) and np.isfinite(sums[m, MAX]):
                edges = np.linspace(sums[m, MIN], sums[m, MAX], bins + 1)
                hist[m] = sum(_rebin(parts[r][3][i].astype(np.float64), parts[r][2][i, MIN], parts[r][2][i, MAX],
                                     edges) for r, i in with_hist)
    return tuple(keys), numel, sums, hist, sources


class DistributedRecorder(Recorder):
    """A :class:`Recorder` for one rank of a data-parallel run; rank 0's holds the whole run.

    Give it to ``watch(model, recorder=..., parameters=False, parameter_grads=False)`` on every
    rank (:func:`watch_distributed` does all of this). At each recorded step, :meth:`publish`
    runs one collective on every rank; rank 0 merges the ranks' rows (see the module docstring)
    and publishes the merged record to its subscribers and its store. Steps that are not recorded
    are published by rank 0 alone (their metrics are rank 0's).

    Args:
        model: the module being watched (the one DDP wraps); its parameters and gradients are
            read at each recorded step. None: no parameter rows.
        group: the process group (default: the world).
        per_rank: rank 0 also keeps each rank's own rows (``ranks``, :meth:`rank_frame`).
        parameters: record parameter values (once, or from the shards of DTensor parameters).
        parameter_grads: record parameter gradients as ``.grad`` holds them at ``step()`` (the
            averaged gradient under DDP and FSDP: call ``step()`` before ``zero_grad()``).
        modules, exclude: which modules' parameters, as in ``watch()``.
        bins: histogram bins of the parameter rows, or None (match the watch's ``histograms``).
        grad_scale: factor on ``grad_output`` rows before they merge (default ``1 / world_size``:
            the gradient of the mean of the ranks' losses, which DDP and FSDP optimize).
        metrics: ``"mean"`` (over the ranks, at recorded steps) or ``"rank0"``.
        max_rows: as :class:`Recorder`'s.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        ValueError, TypeError: a bad option (named, with what is expected).
    """

    def __init__(self, model: nn.Module | None = None, group: Any = None, per_rank: bool = False,
                 parameters: bool = True, parameter_grads: bool = True, modules: ModuleSelector = "*",
                 exclude: ModuleSelector = None, bins: int | None = None, grad_scale: float | None = None,
                 metrics: str = "mean", max_rows: int = 500_000) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("DistributedRecorder needs torch.distributed to be initialized: call "
                               "torch.distributed.init_process_group(...) first (torchrun sets the environment "
                               "it reads), or use workbench.watch() in a single process.")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be the torch.nn.Module being watched (or None), got {type(model).__name__}.")
        for name, flag in [("per_rank", per_rank), ("parameters", parameters), ("parameter_grads", parameter_grads)]:
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}.")
        if bins is not None and (isinstance(bins, bool) or not isinstance(bins, int) or bins < 1):
            raise ValueError(f"bins must be a positive int or None, got {bins!r}.")
        if metrics not in _METRICS:
            raise ValueError(f"metrics must be one of {_METRICS}, got {metrics!r}.")
        world = dist.get_world_size(group)
        if grad_scale is None:
            grad_scale = 1.0 / world
        if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)) or not (
                math.isfinite(grad_scale) and grad_scale > 0):
            raise ValueError(f"grad_scale must be a finite number > 0 (default 1 / world_size = {1 / world}), "
                             f"got {grad_scale!r}.")
        include, skip = _selector(modules, "modules"), _selector(exclude, "exclude")
        super().__init__(max_rows)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = world
        self.per_rank = per_rank
        self.bins = bins
        self.grad_scale = float(grad_scale)
        self.metrics_rule = metrics
        self.collectives = 0  # collectives run (one per recorded step)
        self.failures: list[dict] = []  # this module's own failures on this rank
        self._dst = dist.get_global_rank(group, 0) if group is not None else 0
        self._broken: str | None = None  # the collective failed: the group cannot be relied on any more
        self._held_errors: list[dict] = []  # errors of unrecorded steps, sent with the next recorded one
        self._warned_grads = False
        self.ranks: list[Recorder] = [Recorder(max_rows) for _ in range(world)] if per_rank and self.rank == 0 else []
        # parameters: unique tensors named by the first module path that owns them (as watch() names them)
        self._params: list[tuple[str, str, nn.Parameter]] = []
        if model is not None and (parameters or parameter_grads):
            seen: set[int] = set()
            for path, module in model.named_modules():
                if not (include(path) and not skip(path)):
                    continue
                for name, param in module.named_parameters(recurse=False):
                    if id(param) not in seen:
                        seen.add(id(param))
                        self._params.append((path, name, param))
        self._parameters, self._parameter_grads = parameters, parameter_grads

    # ------------------------------------------------------------ publishing
    def publish(self, record: StepRecord) -> None:
        if record.tensors is None:  # not a recorded step: no collective (ranks may log differently)
            if self.rank == 0:
                super().publish(record)
            else:
                self._held_errors.extend(record.errors)
            return
        try:
            payload = self._payload(record)
        except Exception as exc:  # never skip the collective: send what failed instead
            payload = {"step": record.step, "failed": self._failure(record.step, exc)}
        gathered = self._gather(payload, record.step)
        if self.rank != 0:
            return
        try:
            merged, own = self._merge(record, gathered)
        except Exception as exc:
            error = self._failure(record.step, exc)
            merged, own = dataclasses.replace(record, errors=record.errors + (error,)), None
        super().publish(merged)
        if own is not None:
            for recorder, rank_record in zip(self.ranks, own):
                if rank_record is not None:
                    recorder.publish(rank_record)

    def _failure(self, step: int, exc: BaseException) -> dict:
        error = {"step": step, "module": "", "call": 0, "kind": "distributed", "rank": self.rank,
                 "error": f"[rank {self.rank}] {type(exc).__name__}: {exc}",
                 "traceback": "".join(traceback.format_exception(exc))}
        self.failures.append(error)
        return error

    def _gather(self, payload: dict, step: int) -> list | None:
        if self._broken is not None:
            return [payload] + [None] * (self.world_size - 1) if self.rank == 0 else None
        out = [None] * self.world_size if self.rank == 0 else None
        try:
            dist.gather_object(payload, out, dst=self._dst, group=self.group)
            self.collectives += 1
        except Exception as exc:  # a peer gone: later steps are this rank's alone
            error = self._failure(step, exc)
            self._broken = error["error"]
            _warn(f"workbench: the distributed gather failed at step {step} ({error['error']}); from here rank "
                  f"{self.rank} records its own rows only.")
            if self.rank == 0:
                payload = {**payload, "errors": tuple(payload.get("errors", ())) + (error,)}
                return [payload] + [None] * (self.world_size - 1)
        return out

    def _payload(self, record: StepRecord) -> dict:
        errors = tuple(self._held_errors) + tuple(record.errors)
        self._held_errors = []
        payload = {"step": record.step, "keys": record.keys, "numel": record.numel, "sums": record.sums,
                   "histograms": record.histograms, "metrics": dict(record.metrics), "errors": errors,
                   "tensors": record.tensors if self.rank == 0 else None}
        keys, numel, tensors = [], [], []
        for path, name, param in self._params:
            sharded = _is_dtensor(param)
            if not (sharded or self.rank == 0):
                continue  # a replica: rank 0's is the one
            if self._parameters:
                keys.append((path, 0, "param", name, tuple(param.shape)))
                tensors.append(param.to_local() if sharded else param)
            grad = param.grad if self._parameter_grads else None
            if grad is not None:
                keys.append((path, 0, "param_grad", name, tuple(param.shape)))
                tensors.append(grad.to_local() if _is_dtensor(grad) else grad)
        if (self._parameter_grads and not self._warned_grads and any(p.requires_grad for *_, p in self._params)
                and not any(k[2] == "param_grad" for k in keys) and any(k[2] == "grad_output" for k in record.keys)
                and (self.rank == 0 or any(_is_dtensor(p) for *_, p in self._params))):
            self._warned_grads = True
            errors += ({"step": record.step, "module": "", "call": 0, "kind": "param_grad", "rank": self.rank,
                        "error": f"[rank {self.rank}] no parameter held a gradient at step() although the step ran "
                                 "a backward: call watch.step() before optimizer.zero_grad() to record the "
                                 "averaged parameter gradients (reported once)", "traceback": ""},)
            payload["errors"] = errors
        if tensors:
            sums, hist = tensor_sums(tensors, self.bins)
            payload["params"] = (tuple(keys), np.array([t.numel() for t in tensors], np.int64), sums, hist)
        return payload

    def _merge(self, record: StepRecord, gathered: list) -> tuple[StepRecord, list | None]:
        parts, params, own, errors, metrics = [], [], [], [], []
        for rank, payload in enumerate(gathered):
            if payload is None:
                parts.append(None)
                params.append(None)
                own.append(None)
                continue
            if payload.get("failed"):
                errors.append(payload["failed"])
            for error in payload.get("errors", ()):
                errors.append(error if error.get("rank") is not None else
                              {**error, "rank": rank, "error": f"[rank {rank}] {error['error']}"})
            if "keys" not in payload:
                parts.append(None)
                params.append(None)
                own.append(None)
                continue
            if payload["step"] != record.step:
                errors.append({"step": record.step, "module": "", "call": 0, "kind": "distributed", "rank": rank,
                               "error": f"[rank {rank}] sent step {payload['step']} at rank 0's step {record.step}: "
                                        "the ranks' watches count steps differently (start them at the same step)",
                               "traceback": ""})
            sums = payload["sums"]
            grads = [i for i, key in enumerate(payload["keys"]) if key[2] == "grad_output"]
            if grads and self.grad_scale != 1.0:
                sums = sums.copy()
                sums[grads] = _scale(sums[grads], self.grad_scale)
            parts.append((payload["keys"], payload["numel"], sums, payload["histograms"]))
            params.append(payload.get("params"))
            metrics.append(payload["metrics"])
            if self.per_rank:
                rows = [(payload["keys"], payload["numel"], payload["sums"], payload["histograms"])]
                if payload.get("params") is not None:
                    rows.append(payload["params"])
                keys = tuple(k for r in rows for k in r[0])
                hist = (np.concatenate([r[3] for r in rows]) if all(r[3] is not None for r in rows) else None)
                own.append(StepRecord(record.step, keys, np.concatenate([r[1] for r in rows]),
                                      np.concatenate([r[2] for r in rows]), hist, dict(payload["metrics"]),
                                      tuple(e for e in errors if e.get("rank") == rank),
                                      np.arange(len(keys))))
            else:
                own.append(None)
        keys, numel, sums, hist, sources = merge_rows(parts)
        pkeys, pnumel, psums, phist, _ = merge_rows(params, concat_kinds=())
        if hist is not None and phist is None and len(pkeys):
            phist = np.zeros((len(pkeys), hist.shape[1]), np.float32)
        if phist is not None and hist is None and len(keys):
            hist = np.zeros((len(keys), phist.shape[1]), np.float32)
        # which tensor each row is: rank 0's numbering where rank 0 has the row, new numbers elsewhere
        first = gathered[0].get("tensors") if gathered[0] is not None else None
        tensors = np.empty(len(keys) + len(pkeys), np.int64)
        fresh = (int(first.max()) + 1) if first is not None and len(first) else 0
        for m, src in enumerate(sources):
            if first is not None and src[0][0] == 0:
                tensors[m] = first[src[0][1]]
            else:
                tensors[m] = fresh
                fresh += 1
        tensors[len(keys):] = np.arange(fresh, fresh + len(pkeys))
        if self.metrics_rule == "rank0" or not metrics:
            merged_metrics = dict(record.metrics)
        else:
            merged_metrics = {}
            for name in dict.fromkeys(k for m in metrics for k in m):
                values = [float(m[name]) for m in metrics if name in m]
                merged_metrics[name] = sum(values) / len(values)
        merged = StepRecord(
            record.step, keys + pkeys, np.concatenate([numel, pnumel]), np.concatenate([sums, psums]),
            np.concatenate([hist, phist]) if hist is not None else None, merged_metrics, tuple(errors), tensors)
        return merged, (own if self.per_rank else None)

    # ---------------------------------------------------------- per-rank view
    def rank_frame(self) -> pd.DataFrame:
        """Each rank's own rows (``per_rank=True``, on rank 0), with a ``rank`` column first."""
        if not self.per_rank:
            raise ValueError("rank_frame() needs DistributedRecorder(per_rank=True) (watch_distributed(..., "
                             "per_rank=True)): without it only the merged rows are kept.")
        if self.rank != 0:
            raise ValueError(f"rank_frame() is rank 0's: this is rank {self.rank}, which sends its rows to rank 0.")
        frames = []
        for rank, recorder in enumerate(self.ranks):
            frame = rows_frame(recorder.records())
            frame.insert(0, "rank", np.full(len(frame), rank, np.int64))
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)


def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:  # (warnings as errors) never raised into the training step
        pass


def watch_distributed(model: nn.Module, store: str | Path | None = None, per_rank: bool = False, group: Any = None,
                      parameters: bool = True, parameter_grads: bool = True, histograms: bool = False,
                      bins: int = 32, modules: ModuleSelector = "*", exclude: ModuleSelector = None,
                      grad_scale: float | None = None, metrics: str = "mean", metadata: dict[str, Any] | None = None,
                      **options: Any):
    """``watch()`` one rank of a data-parallel run; rank 0's watch holds the whole run.

    Call it on every rank, with the same options, after ``init_process_group`` (and after
    wrapping the model in DDP or sharding it with ``fully_shard``)::

        ddp = DistributedDataParallel(model)
        with watch_distributed(ddp, store="runs/ddp") as w:   # written by rank 0 only
            for x, y in shard_of_the_data:
                opt.zero_grad(); loss_fn(ddp(x), y).backward(); opt.step()
                w.step(loss=loss.item())                      # every rank, every step

    Args:
        model: the model, DDP-wrapped or not (sites are named by the wrapped model's paths).
        store: the run directory rank 0 writes (ignored on the other ranks).
        per_rank: rank 0 also keeps each rank's rows (``w.recorder.rank_frame()``).
        group: the process group (default: the world).
        parameters, parameter_grads, histograms, bins, modules, exclude: as in ``watch()``.
        grad_scale, metrics: see :class:`DistributedRecorder`.
        metadata: facts stored with the run (the run's ``distributed`` facts are added).
        **options: other options of ``watch()`` (``every``, ``activations``, ``gradients`` ...).

    Returns:
        The rank's :class:`~workbench.Watch`; ``w.recorder`` is its :class:`DistributedRecorder`.
    """
    from workbench.instrument import watch

    if not isinstance(model, nn.Module):
        raise TypeError(f"watch_distributed() needs a torch.nn.Module, got {type(model).__name__}.")
    if "recorder" in options:
        raise TypeError("watch_distributed() makes its own DistributedRecorder; pass no recorder= "
                        "(use DistributedRecorder with watch() to compose your own).")
    if not isinstance(histograms, bool):
        raise TypeError(f"histograms must be True or False, got {histograms!r}.")
    inner = unwrap(model)
    recorder = DistributedRecorder(inner, group=group, per_rank=per_rank, parameters=parameters,
                                   parameter_grads=parameter_grads, modules=modules, exclude=exclude,
                                   bins=bins if histograms else None, grad_scale=grad_scale, metrics=metrics)
    facts = {"parameters": parameters, "parameter_grads": parameter_grads, **(metadata or {}),
             "distributed": {"world_size": recorder.world_size, "backend": str(dist.get_backend(group)),
                             "grad_scale": recorder.grad_scale, "metrics": metrics,
                             "wrapper": type(model).__name__ if inner is not model else None,
                             "histograms": "re-binned onto the global range where the ranks' ranges differ"}}
    return watch(inner, modules=modules, exclude=exclude, parameters=False, parameter_grads=False,
                 histograms=histograms, bins=bins, recorder=recorder, store=store if recorder.rank == 0 else None,
                 metadata=facts, **options)
