"""The Triton reducer: CUDA tensors batched and read where they lie by two Triton kernels
(:mod:`workbench.instrument._triton_kernels`), three with histograms, their sums and counts left
on the device until the step's rows are read. On a GPU a small step is bound by the host, and
each torch op is a launch: two or three launches per batch replace torch's few dozen.

Until its histograms have been checked on a device and dtype, each batch of them (up to a
stage's size) is also binned by torch's kernels, and the counts compared when the step's rows are
read (one wait for the device, at the first step): the kernel bins with the same float
arithmetic, so they agree value for value. Where they do not (a GPU or Triton release that
compiles the kernel's arithmetic otherwise), the step's checked batches take torch's counts, and
torch's kernels bin every later batch, with a warning. The interpreter that runs the kernels in
the tests does not compile them; this check is what vouches for each GPU they run on."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Collection
from types import ModuleType

import numpy as np
import torch

from workbench.instrument.reduce import EMPTY, DeviceSums, Reducer
from workbench.instrument.reduce_torch import STAGE_BYTES, as_float, chunk_sums

__all__ = ["TritonReducer"]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # read as they are
#: Histograms of up to this many bins are counted by the kernel (in a power of two of counters, one
#: past the last bin: 1024, a block of shared memory); more bins go to torch's kernels.
KERNEL_BINS = 1023


def import_kernels() -> ModuleType | None:
    """The Triton kernels' module, or None where Triton cannot be imported (it comes with PyTorch's
    CUDA builds)."""
    try:
        from workbench.instrument import _triton_kernels
    except ImportError:
        return None
    return _triton_kernels


class TritonReducer(Reducer):
    """Takes plain tensors of the dtypes the kernels read, on ``devices`` (device types), with
    histograms of up to :data:`KERNEL_BINS` bins. A batch that fails to compile or launch sends its
    tensors, and every later one, to ``fallback``, with a warning; histograms that differ from
    torch's kernels' (the module doc) send the tensors of every later step with histograms there.

    Args:
        fallback: the reducer that takes over after a failure (a TorchReducer).
        devices: the device types whose tensors it takes (the tests add ``"cpu"``, with Triton's
            interpreter).
        kernels: the kernels' module (default: imported on first use; the tests pass the
            interpreted one).
    """

    def __init__(self, fallback: Reducer, devices: Collection[str] = ("cuda",),
                 kernels: ModuleType | None = None) -> None:
        self.fallback, self.devices = fallback, frozenset(devices)
        self._kernels = kernels
        self._usable = True  # False once Triton cannot be imported or a batch failed
        self._bins_usable = True  # False once the kernel's histograms differed from torch's
        self._verified: set[tuple[torch.device, torch.dtype]] = set()  # whose histograms matched torch's
        self._checks: list[tuple[tuple, DeviceSums, torch.Tensor]] = []  # (batch, the kernel's rows, torch's counts)
        self._batched: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, int]]] = {}
        self._batched_bytes = 0
        self._reduced: list[DeviceSums] = []

    def parts(self) -> tuple[Reducer, ...]:
        return (self, *self.fallback.parts())

    def takes(self, x: torch.Tensor) -> bool:
        # the usual tensor on a GPU: this runs for every one, in the fewest calls
        # (``x.device.type`` alone costs as much as the rest)
        return (self._usable and (not self.host.bins or self._bins_usable and self.host.bins <= KERNEL_BINS)
                and x.dtype in KERNEL_DTYPES
                and x.layout is torch.strided
                and not x.is_nested and not x.is_neg() and ("cuda" if x.is_cuda else x.device.type) in self.devices
                and self._loaded())

    def _loaded(self) -> bool:
        if self._kernels is None:
            self._kernels = import_kernels()
            self._usable = self._kernels is not None
        return self._usable

    def add(self, x: torch.Tensor, row: int, defer: bool) -> None:
        if not x.is_contiguous():
            x = x.detach().contiguous()  # (a copy)
        elif not defer:
            x = x.detach().clone()  # what later in-place ops do to x must not reach the sums
        self._batch(x, row)

    def add_many(self, entries: list[tuple[torch.Tensor, int]]) -> None:
        for x, row in entries:
            if x.is_contiguous():
                self._batch(x, row)  # by reference, as add(x, defer=True) keeps it
            else:
                self.add(x, row, defer=True)

    def _batch(self, x: torch.Tensor, row: int) -> None:
        n = x.numel()
        if not n:
            self.host.sums[row] = EMPTY
            return
        self._batched.setdefault((x.device, x.dtype), []).append((x, row))
        self._batched_bytes += n * x.element_size()
        if self._batched_bytes >= STAGE_BYTES:
            self.flush()

    def flush(self) -> None:
        """Launch the kernels on the batched tensors (they may change once the launch is queued)."""
        batched, self._batched, self._batched_bytes = self._batched, {}, 0
        bins = self.host.bins or 0
        for batch, entries in batched.items():
            device = batch[0]
            if self._usable:
                tensors, rows = [x for x, _ in entries], [row for _, row in entries]
                edges = self.host.edges[rows] if bins else None
                try:
                    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                        sums, counts = self._kernels.batch_sums(tensors, bins, edges)
                except Exception as exc:  # (a GPU or Triton build the kernels do not compile for)
                    self._give_up(exc)
                else:
                    reduced = DeviceSums(rows, sums, counts)
                    self._reduced.append(reduced)
                    if counts is not None and batch not in self._verified:
                        self._check(batch, reduced, tensors, bins, edges)
                    continue
            for x, row in entries:  # to torch's kernels (x is a copy, or kept by reference, as before)
                self.fallback.add(x, row, defer=True)

    def _give_up(self, exc: Exception) -> None:
        self._usable = False
        warnings.warn(f"workbench.watch: the Triton kernels failed ({type(exc).__name__}: {exc}); statistics on "
                      "the GPU fall back to torch's kernels (slower, same results).", RuntimeWarning, stacklevel=4)

    def _check(self, batch: tuple, reduced: DeviceSums, tensors: list[torch.Tensor], bins: int, edges) -> None:
        """Keep torch's counts of the batch, to compare with the kernel's in :meth:`collect`. Not of a
        batch larger than a stage (one large tensor): torch's kernels take several times its memory
        (a batch of the same dtype and device is checked instead; the smaller tensors of a step,
        biases and norms among them, make such batches)."""
        lengths = np.array([x.numel() for x in tensors], np.int64)
        if int(lengths.sum()) * tensors[0].element_size() > STAGE_BYTES:
            return
        try:
            want = chunk_sums(torch.cat([as_float(x).reshape(-1) for x in tensors]), lengths, bins, edges)[3]
        except torch.cuda.OutOfMemoryError:  # no check this time: a later batch is checked
            return
        self._checks.append((batch, reduced, want))

    def collect(self) -> list[DeviceSums]:
        self.flush()
        checks, self._checks = self._checks, []
        differ = [(batch, int((reduced.counts != want).sum()), want.numel())  # (waits for the device)
                  for batch, reduced, want in checks if not torch.equal(reduced.counts, want)]
        if differ:  # every batch checked this step takes torch's counts; torch's kernels bin from now on
            self._bins_usable = False
            for _, reduced, want in checks:
                reduced.counts = want
            where = ", ".join(f"{device} {str(dtype).removeprefix('torch.')}: {bad} of {total} bins"
                              for (device, dtype), bad, total in differ)
            warnings.warn(f"workbench.watch: the Triton histogram kernel's counts differ from torch's kernels' "
                          f"({where}); torch's counts replace them in this step, and torch's kernels bin every "
                          "histogram from now on (slower, same results).", RuntimeWarning, stacklevel=4)
        else:
            self._verified.update(batch for batch, _, _ in checks)
        reduced, self._reduced = self._reduced, []
        return reduced

    def reset(self) -> None:
        self._batched.clear()
        self._reduced.clear()
        self._checks.clear()  # (a step dropped before its rows were read: the next one is checked)
        self._batched_bytes = 0

