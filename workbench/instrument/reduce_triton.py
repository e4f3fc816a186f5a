"""The Triton reducer: CUDA tensors batched and read where they lie by two Triton kernels
(:mod:`workbench.instrument._triton_kernels`), their sums left on the device until the step's
rows are read. On a GPU a small step is bound by the host, and each torch op is a launch: two
launches per batch replace torch's few dozen."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Collection
from types import ModuleType

import torch

from workbench.instrument.reduce import EMPTY, DeviceSums, Reducer
from workbench.instrument.reduce_torch import STAGE_BYTES

__all__ = ["TritonReducer"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # read as they are


def _import_kernels() -> ModuleType | None:
    """The Triton kernels' module, or None where Triton cannot be imported (it comes with PyTorch's
    CUDA builds)."""
    try:
        from workbench.instrument import _triton_kernels
    except ImportError:
        return None
    return _triton_kernels


class TritonReducer(Reducer):
    """Takes plain tensors of the dtypes the kernels read, on ``devices`` (device types), when the
    step keeps no histograms (torch's kernels bin them). A batch that fails to compile or launch
    sends its tensors, and every later one, to ``fallback``, with a warning.

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
        self._batched: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, int]]] = {}
        self._batched_bytes = 0
        self._reduced: list[DeviceSums] = []

    def takes(self, x: torch.Tensor) -> bool:
        # the usual tensor on a GPU: this runs for every one, in the fewest calls
        # (``x.device.type`` alone costs as much as the rest)
        return (self._usable and not self.host.bins and x.dtype in _DTYPES and x.layout is torch.strided
                and not x.is_nested and not x.is_neg() and ("cuda" if x.is_cuda else x.device.type) in self.devices
                and self._loaded())

    def _loaded(self) -> bool:
        if self._kernels is None:
            self._kernels = _import_kernels()
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
        for (device, _), entries in batched.items():
            if self._usable:
                try:
                    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                        sums = self._kernels.batch_sums([x for x, _ in entries])
                    self._reduced.append(DeviceSums([row for _, row in entries], sums))
                    continue
                except Exception as exc:  # (a GPU or Triton build the kernels do not compile for)
                    self._give_up(exc)
            for x, row in entries:  # to torch's kernels (x is a copy, or kept by reference, as before)
                self.fallback.add(x, row, defer=True)

    def _give_up(self, exc: Exception) -> None:
        self._usable = False
        warnings.warn(f"workbench.watch: the Triton kernels failed ({type(exc).__name__}: {exc}); statistics on "
                      "the GPU fall back to torch's kernels (slower, same results).", RuntimeWarning, stacklevel=4)

    def collect(self) -> list[DeviceSums]:
        self.flush()
        reduced, self._reduced = self._reduced, []
        return reduced

    def reset(self) -> None:
        self._batched.clear()
        self._reduced.clear()
        self._batched_bytes = 0
