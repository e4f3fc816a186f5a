"""``watch`` under ``torch.distributed``: one view of a data-parallel run across its processes.

Each rank watches its own replica (its shard of the batch); at every recorded step
:class:`DistributedRecorder` exchanges the ranks' raw sums with one collective (an
``all_gather`` of a fixed-size tensor; whole payloads also go by ``gather_object`` at the steps
where a rank's rows change layout or it has errors to tell, see
:meth:`DistributedRecorder._exchange`) and rank 0 publishes a single record: the statistics of
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
import difflib
import gc
import inspect
import json
import math
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from workbench.instrument.distributed_rows import flatten, merge_rows, scale, tensor_sums, unflatten, watch_rows
from workbench.instrument.interrupts import interrupts_held
from workbench.instrument.recorder import Recorder, StepRecord, histogram_edges, rows_frame
from workbench.instrument.reduce import StepSums
from workbench.instrument.schema import MAX, MIN, SUMS, checked_bins
from workbench.instrument.sites import CallSites, ModuleSelector, unwrap, unwrap_parallel, wrappers

if TYPE_CHECKING:
    from workbench.instrument.watch import Watch

__all__ = ["DistributedRecorder", "destroy_process_group", "watch_distributed"]

_METRICS = ("mean", "rank0")

def _is_dtensor(x: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, DTensor)


class DistributedRecorder(Recorder):
    """A :class:`Recorder` for one rank of a data-parallel run; rank 0's holds the whole run.

    Give it to ``watch(model, recorder=..., parameters=False, parameter_grads=False)`` on every
    rank (:func:`watch_distributed` does all of this). At each recorded step, :meth:`publish`
    runs one ``all_gather`` on every rank (and a ``gather_object`` where a rank's layout changed
    or it has errors to tell); rank 0 merges the ranks' rows (see the module docstring)
    and publishes the merged record to its subscribers and its store. Steps that are not recorded
    are published by rank 0 alone (their metrics are rank 0's).

    Args:
        model: the module being watched (a DDP wrapper is unwrapped); its parameters and
            gradients are read at each recorded step. None: no parameter rows.
        group: the process group (default: the world).
        per_rank: rank 0 also keeps each rank's own rows (``ranks``, :meth:`rank_frame`).
        parameters: record parameter values (once, or from the shards of DTensor parameters).
        parameter_grads: record parameter gradients as ``.grad`` holds them at ``step()`` (the
            averaged gradient under DDP and FSDP: call ``step()`` before ``zero_grad()``).
        modules: which modules' parameters, as in ``watch()``.
        exclude: which modules' parameters to leave out, as in ``watch()``.
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
        if bins is not None:
            bins = checked_bins(bins, "None or a positive int")
        if metrics not in _METRICS:
            raise ValueError(f"metrics must be one of {_METRICS}, got {metrics!r}.")
        world = dist.get_world_size(group)
        if grad_scale is None:
            grad_scale = 1.0 / world
        if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)) or not (
                math.isfinite(grad_scale) and grad_scale > 0):
            raise ValueError(f"grad_scale must be a finite number > 0 (default 1 / world_size = {1 / world}), "
                             f"got {grad_scale!r}.")
        model = unwrap(model)[0] if model is not None else None  # (DDP, compiled, in any order)
        sites = CallSites(model, modules, exclude) if model is not None and (parameters or parameter_grads) else None
        super().__init__(max_rows)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = world
        self.per_rank = per_rank
        self.bins = bins
        self.grad_scale = float(grad_scale)
        self.metrics_rule = metrics
        self.exchanges = 0  # recorded steps exchanged: one all_gather each
        self.object_exchanges = 0  # of those, steps that also gathered whole payloads (layout changes, errors)
        self.failures: list[dict] = []  # this module's own failures on this rank
        self._dst = dist.get_global_rank(group, 0) if group is not None else 0
        self._broken: str | None = None  # the collective failed: the group cannot be relied on any more
        # the record published last and how far its publishing went: published again (a w.step() interrupted
        # as it published, called again) it is not exchanged again, nor merged, nor its merged record published twice
        self._last: StepRecord | None = None
        self._exchanged = False  # its exchange ran (every rank ran its collectives)
        self._gathered: list | None = None  # on rank 0: what it gathered, until merged
        self._merged: tuple[StepRecord, list | None] | None = None  # on rank 0: (merged record, each rank's own)
        self._exchanging = False  # inside the collectives of an exchange (left part-way, the group is out of step)
        self._held_errors: list[dict] = []  # errors of unrecorded steps, sent with the next recorded one
        self._warned_grads = False
        self._warned_watch_grads = False
        self._capacity = 64  # float64 values of rows a rank sends in the all_gather's tensor (grows as needed)
        self._sent_layout: tuple | None = None  # what this rank's rows are (keys, metric names, width), as sent
        self._layouts: dict[int, tuple] = {}  # on rank 0: each rank's layout as it last sent it
        self._device = (torch.device("cuda", torch.cuda.current_device())
                        if str(dist.get_backend(group)) == "nccl" else torch.device("cpu"))
        self.ranks: list[Recorder] = [Recorder(max_rows) for _ in range(world)] if per_rank and self.rank == 0 else []
        # parameters: unique tensors named by the first module path that owns them (as watch() names them)
        self._params: list[tuple[str, str, nn.Parameter]] = sites.parameters() if sites is not None else []
        self._step_sums: dict[int | None, StepSums] = {}  # the reducers of the parameters' rows, per bins
        self._parameters, self._parameter_grads = parameters, parameter_grads

    # ------------------------------------------------------------ publishing
    def publish(self, record: StepRecord) -> None:
        """Exchange a recorded step's rows with the other ranks (every rank) and publish the merged
        record (rank 0); publish an unrecorded step's record (rank 0) or keep its errors for the next
        exchange (the other ranks).

        A ``KeyboardInterrupt`` (a SIGINT in the main thread) that comes while a step is published is held until
        the step is exchanged and published, then raised: every rank runs the collectives of a step whole or not
        at all, so a rank interrupted there never leaves its peers waiting in a collective it walked out of. A
        second SIGINT while one is held is raised at once (the user insists): the ranks' collectives can no
        longer be matched then, and this rank records its own rows from there. A collective waiting in C++
        (gloo's, NCCL's) lets no handler run: SIGINTs that come as it waits are seen, as one, when it returns
        (at the latest at the group's timeout). A SIGINT handler of the user's own is called for each SIGINT
        (the first held so too); one that returns (that sets a flag) leaves the exchange whole. The record
        published last, published again (a ``w.step()`` interrupted as it published, called again), is neither
        exchanged again nor published twice."""
        if record is not self._last:
            self._last, self._gathered, self._merged, self._exchanged = record, None, None, False
        elif record.tensors is None:  # (published already: its errors are held once)
            if self.rank == 0:
                super().publish(record)
            return
        if record.tensors is None:  # not a recorded step: no collective (ranks may log differently)
            if self.rank == 0:
                super().publish(record)
            else:
                self._held_errors.extend(record.errors)
            return
        with interrupts_held(self._interrupted_twice):
            if not self._exchanged:
                try:
                    payload = self._payload(record)
                except Exception as exc:  # never skip the collective: send what failed instead
                    payload = {"step": record.step, "failed": self._failure(record.step, exc)}
                self._gathered, self._exchanged = self._exchange(payload, record.step), True
            if self.rank != 0:
                return
            if self._merged is None:
                try:
                    self._merged = self._merge(record, self._gathered)
                except Exception as exc:
                    error = self._failure(record.step, exc)
                    self._merged = (dataclasses.replace(record, errors=record.errors + (error,)), None)
                self._gathered = None  # (the payloads let go of: the merged record is kept)
            merged, own = self._merged
            super().publish(merged)  # (the same merged record, published again: kept and offered once)
            if own is not None:
                for recorder, rank_record in zip(self.ranks, own):
                    if rank_record is not None:
                        recorder.publish(rank_record)

    def _interrupted_twice(self) -> None:
        """A second SIGINT came while the first was held: where it stops this rank inside the exchange's
        collectives, the ranks can no longer match theirs, and this rank records its own rows from here."""
        if self._exchanging and self._broken is None:
            self._broken = (f"[rank {self.rank}] interrupted twice (KeyboardInterrupt) inside the exchange of a "
                            "step: its collectives were left part-way")
            _warn(f"workbench: {self._broken}; from here rank {self.rank} records its own rows only (its peers "
                  "wait for it in that collective until the group's timeout).")

    def _failure(self, step: int, exc: BaseException) -> dict:
        error = {"step": step, "module": "", "call": 0, "kind": "distributed", "rank": self.rank,
                 "error": f"[rank {self.rank}] {type(exc).__name__}: {exc}",
                 "traceback": "".join(traceback.format_exception(exc))}
        self.failures.append(error)
        return error

    def _payload(self, record: StepRecord) -> dict:
        """This rank's rows of the step: the watch's, then the parameters' it takes (rank 0's
        replicas; every rank's DTensor shards)."""
        errors = tuple(self._held_errors) + tuple(record.errors)
        self._held_errors = []
        record, dropped = watch_rows(record, self.rank)
        if dropped and not self._warned_watch_grads:
            self._warned_watch_grads = True
            errors += ({"step": record.step, "module": "", "call": 0, "kind": "param_grad", "rank": self.rank,
                        "error": f"[rank {self.rank}] the watch recorded parameters or their gradients itself; "
                                 "its rows are left out (its gradient hooks run before DDP's all-reduce ends and see "
                                 "this rank's local gradient): start the watch with parameters=False, "
                                 "parameter_grads=False (watch_distributed does), the recorder takes them itself "
                                 "(reported once)", "traceback": ""},)
        keys, tensors = [], []
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
        bins = record.histograms.shape[1] if record.histograms is not None else self.bins
        if bins not in self._step_sums:
            self._step_sums[bins] = StepSums(bins)
        sums, hist = tensor_sums(tensors, bins, self._step_sums[bins])
        watch_hist = record.histograms
        if bins and watch_hist is None:
            watch_hist = np.zeros((len(record.keys), bins), np.float32)
        edges = None
        if bins:  # the ranges the counts divide: the watch's (kept per row), the parameters' own [min, max]
            edges = np.concatenate([np.column_stack(histogram_edges(record)) if record.histograms is not None
                                    else np.full((len(record.keys), 2), np.nan), sums[:, [MIN, MAX]]])
        return {"step": record.step, "keys": tuple(record.keys) + tuple(keys), "n_watch": len(record.keys),
                "numel": np.concatenate([np.asarray(record.numel, np.int64),
                                         np.array([t.numel() for t in tensors], np.int64)]),
                "sums": np.concatenate([np.asarray(record.sums, np.float64).reshape(-1, len(SUMS)), sums]),
                "histograms": np.concatenate([watch_hist, hist]) if bins else None, "edges": edges,
                "metrics": dict(record.metrics), "errors": errors,
                "tensors": record.tensors if self.rank == 0 else None}

    def _exchange(self, payload: dict, step: int) -> list | None:
        """Every rank's payload, on rank 0 (None elsewhere): one ``all_gather`` of a fixed-size
        float64 tensor per recorded step, which carries each rank's rows as numbers while its row
        keys and metric names stay those it sent before; a rank whose layout changed (its first
        step, a failed site, new metrics), that has errors to report or rows beyond the tensor's
        capacity says so in its header, and then (every rank sees every header) all of them also
        run one ``gather_object`` with that rank's whole payload, and the capacity grows."""
        if self._broken is not None:
            return [payload] + [None] * (self.world_size - 1) if self.rank == 0 else None
        try:
            flat, layout = flatten(payload)
        except Exception as exc:  # (a metric that is not a number ...): the whole payload goes as an object
            flat, layout = np.zeros(0), None
            payload = {**payload, "errors": tuple(payload.get("errors", ())) + (self._failure(step, exc),)}
        self._exchanging = True
        try:
            objects = self.rank != 0 and (layout is None or layout != self._sent_layout
                                          or bool(payload.get("errors")) or flat.size > self._capacity)
            buffer = torch.zeros(3 + self._capacity, dtype=torch.float64)
            buffer[:3] = torch.tensor([flat.size if self.rank else 0, float(objects), step], dtype=torch.float64)
            if self.rank and not objects:
                buffer[3:3 + flat.size] = torch.from_numpy(flat)
            buffers = [torch.empty_like(buffer, device=self._device) for _ in range(self.world_size)]
            dist.all_gather(buffers, buffer.to(self._device), group=self.group)
            self.exchanges += 1
            buffers = [b.cpu().numpy() for b in buffers]
            flags = [bool(b[1]) for b in buffers]
            self._capacity = max(self._capacity, *(int(b[0]) for b in buffers))
            objects_out = None
            if any(flags):
                objects_out = [None] * self.world_size if self.rank == 0 else None
                dist.gather_object(payload if objects else None, objects_out, dst=self._dst, group=self.group)
                self.object_exchanges += 1
                if objects:
                    self._sent_layout = layout
        except Exception as exc:  # a peer gone: later steps are this rank's alone
            error = self._failure(step, exc)
            self._broken = error["error"]
            _warn(f"workbench: the distributed exchange failed at step {step} ({error['error']}); from here rank "
                  f"{self.rank} records its own rows only.")
            if self.rank == 0:
                return [{**payload, "errors": tuple(payload.get("errors", ())) + (error,)}] + \
                    [None] * (self.world_size - 1)
            return None
        finally:
            self._exchanging = False
        if self.rank != 0:
            return None
        gathered = [payload]
        for rank in range(1, self.world_size):
            if flags[rank]:
                sent = objects_out[rank]
                gathered.append(sent)
                if sent is not None and "keys" in sent:
                    self._layouts[rank] = flatten(sent)[1]
            else:
                gathered.append(unflatten(buffers[rank], self._layouts.get(rank)))
        return gathered

    def _merge(self, record: StepRecord, gathered: list) -> tuple[StepRecord, list | None]:
        parts, own, errors, metrics = [], [], [], []
        for rank, payload in enumerate(gathered):
            if payload is not None and payload.get("failed"):
                errors.append(payload["failed"])
            for error in (payload or {}).get("errors", ()):
                errors.append(error if error.get("rank") is not None else
                              {**error, "rank": rank, "error": f"[rank {rank}] {error['error']}"})
            if payload is None or "keys" not in payload:
                parts.append(None)
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
                sums[grads] = scale(sums[grads], self.grad_scale)
            edges = payload.get("edges")
            if edges is not None and grads and self.grad_scale != 1.0:
                edges = edges.copy()
                edges[grads] *= self.grad_scale
            parts.append((payload["keys"], payload["numel"], sums, payload["histograms"], edges))
            metrics.append(payload["metrics"])
            own.append(StepRecord(record.step, payload["keys"], payload["numel"], payload["sums"],
                                  payload["histograms"], dict(payload["metrics"]),
                                  tuple(e for e in errors if e.get("rank") == rank),
                                  np.arange(len(payload["keys"])), histogram_edges=payload.get("edges"))
                       if self.per_rank else None)
        keys, numel, sums, hist, where, ranges = merge_rows(parts)
        # which tensor each row is: rank 0's numbering for its watch's rows, new numbers for the others
        tensors = np.full(len(keys), -1, np.int64)
        first = gathered[0].get("tensors") if gathered[0] is not None else None
        if first is not None and where[0] is not None:
            n_watch = gathered[0]["n_watch"]
            tensors[where[0][:n_watch]] = first[:n_watch]
        fresh = np.flatnonzero(tensors < 0)
        tensors[fresh] = tensors.max(initial=-1) + 1 + np.arange(len(fresh))
        if self.metrics_rule == "rank0" or not metrics:
            merged_metrics = dict(record.metrics)
        else:
            merged_metrics = {}
            for name in dict.fromkeys(k for m in metrics for k in m):
                values = [float(m[name]) for m in metrics if name in m]
                merged_metrics[name] = sum(values) / len(values)
        merged = StepRecord(record.step, keys, numel, sums, hist, merged_metrics, tuple(errors), tensors,
                            histogram_edges=ranges, time=record.time)
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


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()`` after a garbage collection. A DDP model no
    longer referenced but not yet collected keeps its reducer, which keeps the gloo group; freed
    after the group is destroyed, its destructor joins the group's threads and hangs (or aborts the
    process at exit). Drop your references to the DDP model before calling this."""
    gc.collect()
    dist.destroy_process_group()


def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:  # (warnings as errors) never raised into the training step
        pass


#: Characters of a rank's error the other ranks are told at most (its message may be a whole traceback).
TOLD_CHARS = 2000


def _told(exc: BaseException) -> str:
    """What the other ranks are told of a rank's error: its type and message, cut to :data:`TOLD_CHARS`
    (its type alone where its message cannot be made: the rank must reach the gather whatever it raised)."""
    try:
        told = f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message could not be made)"
    return told if len(told) <= TOLD_CHARS else f"{told[:TOLD_CHARS]} ... ({len(told) - TOLD_CHARS:,} more characters)"


def _named(rank: int, group: Any) -> str:
    """Rank ``rank`` of ``group`` as the user's launcher names its process: by its global rank, with its rank in
    the group where the two differ (a subgroup's rank 0 may be the world's rank 2)."""
    world_rank = rank if group is None else dist.get_global_rank(group, rank)
    return f"rank {world_rank}" + (f" (rank {rank} of the group)" if world_rank != rank else "")


def _as_stored(value: Any) -> Any:
    """``value`` as a run's metadata keeps it: a JSON value as it is, any other made JSON with its parts'
    ``str`` (as the store writes it); one that cannot be (a list that holds itself) as it is."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        try:
            return json.loads(json.dumps(value, default=str))
        except (TypeError, ValueError):
            return value


def watch_distributed(model: nn.Module, store: str | Path | None = None, per_rank: bool = False, group: Any = None,
                      parameters: bool = True, parameter_grads: bool = True, histograms: bool = True,
                      bins: int = 32, modules: ModuleSelector = "*", exclude: ModuleSelector = None,
                      grad_scale: float | None = None, metrics: str = "mean", metadata: dict[str, Any] | None = None,
                      **options: Any) -> Watch:
    """``watch()`` one rank of a data-parallel run; rank 0's watch holds the whole run.

    Call it on every rank, with the same options, after ``init_process_group`` (and after
    wrapping the model in DDP or sharding it with ``fully_shard``)::

        ddp = DistributedDataParallel(model)
        with watch_distributed(ddp, store="runs/ddp") as w:   # written by rank 0 only
            for x, y in shard_of_the_data:
                opt.zero_grad(); loss = loss_fn(ddp(x), y); loss.backward(); opt.step()
                w.step(loss=loss.item())                      # every rank, every step

    Args:
        model: the model, DDP-wrapped or not, compiled or not, in either order (``torch.compile(ddp)``,
            ``DistributedDataParallel(torch.compile(model))``): sites are named by the wrapped model's paths.
        store: the run directory rank 0 writes (ignored on the other ranks).
        per_rank: rank 0 also keeps each rank's rows (``w.recorder.rank_frame()``).
        group: the process group (default: the world).
        parameters: as in ``watch()``.
        parameter_grads: as in ``watch()``.
        histograms: as in ``watch()``.
        bins: as in ``watch()``.
        modules: as in ``watch()``.
        exclude: as in ``watch()``.
        grad_scale: factor on the ``grad_output`` rows before they merge (see :class:`DistributedRecorder`).
        metrics: ``"mean"`` or ``"rank0"`` (see :class:`DistributedRecorder`).
        metadata: facts stored with the run (the run's ``distributed`` facts are added).
        **options: other options of ``watch()`` (``every``, ``activations``, ``gradients`` ...).

    Returns:
        The rank's watch; ``w.recorder`` is its :class:`DistributedRecorder`.
    """
    from workbench.instrument import watch
    from workbench.instrument.compose import check_metadata, check_uncontradicted

    if not isinstance(model, nn.Module):
        raise TypeError(f"watch_distributed() needs a torch.nn.Module, got {type(model).__name__}.")
    check_metadata(metadata)
    # the recorder records the parameters and their gradients, not the rank's watch (whose own options say
    # False): metadata is held to what the run stores of them (below), not to the watch's
    recorded = {"parameters": parameters, "parameter_grads": parameter_grads}
    check_uncontradicted(metadata, recorded)
    if "recorder" in options:
        raise TypeError("watch_distributed() makes its own DistributedRecorder; pass no recorder= "
                        "(use DistributedRecorder with watch() to compose your own).")
    accepted = set(inspect.signature(watch).parameters) - {"model", "recorder"}
    for name in options:
        if name not in accepted:
            known = sorted(accepted | set(inspect.signature(watch_distributed).parameters) - {"model", "options"})
            close = difflib.get_close_matches(name, known, n=1)
            raise TypeError(f"watch_distributed() got an unexpected keyword argument {name!r}"
                            f"{f' (did you mean {close[0]!r}?)' if close else ''}; its options are "
                            f"{', '.join(known)}.")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed process group (dist.new_group(ranks)) or None for "
                        f"the world, got {group!r}.")
    if not isinstance(histograms, bool):
        raise TypeError(f"histograms must be True or False, got {histograms!r}.")
    inner = unwrap_parallel(model)
    recorder = DistributedRecorder(inner, group=group, per_rank=per_rank, parameters=parameters,
                                   parameter_grads=parameter_grads, modules=modules, exclude=exclude,
                                   bins=bins if histograms else None, grad_scale=grad_scale, metrics=metrics)
    # (values that are not JSON as the store keeps them: check_metadata warned of them once, above, and the
    # rank's watch is not to warn of them again, from this line)
    facts = {**{key: _as_stored(value) for key, value in (metadata or {}).items() if key not in recorded},
             "distributed": {"world_size": recorder.world_size, "backend": str(dist.get_backend(group)),
                             "grad_scale": recorder.grad_scale, "metrics": metrics,
                             "wrapper": next((type(m).__name__ for m in wrappers(model)
                                              if isinstance(m, (nn.parallel.DistributedDataParallel,
                                                                nn.DataParallel))), None),
                             "histograms": "re-binned onto the global range where the ranks' ranges differ"}}

    def rank_watch(store: str | Path | None) -> Watch:
        return watch(inner, modules=modules, exclude=exclude, parameters=False, parameter_grads=False,
                     histograms=histograms, bins=bins, recorder=recorder, store=store, metadata=facts, **options)

    # Every rank starts its watch, then every rank learns how each one did (one all_gather of the
    # outcomes): where any rank could not (a store rank 0 cannot open, a KeyboardInterrupt as hooks
    # go in), every rank closes its watch and raises, saying which rank and why, rather than leaving
    # the others to wait for it at their first recorded step (until the launcher or the group's
    # timeout ends them). A gather that raises (a peer gone) closes the rank's watch too: no hook is
    # left in, no store held.
    w, refused = None, None
    try:
        w = rank_watch(store if recorder.rank == 0 else None)
    except BaseException as exc:
        refused = exc
    said: list[str | None] = [None] * recorder.world_size
    try:
        dist.all_gather_object(said, None if refused is None else _told(refused), group=group)
    except BaseException as exc:
        if w is not None:
            w.__exit__(type(exc), exc, exc.__traceback__)
        if refused is not None:
            raise refused  # (the rank's own error, the gather's as its context)
        raise
    if refused is not None:
        raise refused
    failed = {rank: told for rank, told in enumerate(said) if told is not None}
    if failed:
        told = "; ".join(f"{_named(rank, group)} could not start its watch ({told})" for rank, told in failed.items())
        error = RuntimeError(f"watch_distributed: {told}, so no rank watches.")
        w.close("failed", str(error))
        raise error
    if w.store is not None:  # (the recorder records them, not the rank's watch, whose own options say False)
        w.store.set_meta(**recorded)
    return w
