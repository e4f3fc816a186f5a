"""Inside the compiled graphs: the hooks dynamo traces into a compiled model, and the statistics
they compute there.

- :func:`make_hooks` gives the process-wide forward (pre-)hook that dynamo inlines into the
  model's graph at every module call. On a recorded step it reduces each tensor leaf of the
  module's output with :func:`graph_row` - on a GPU plain torch ops, which inductor fuses into the
  graph's kernels; on the CPU one call of :data:`cpu_row`, an op the graph keeps - and appends the
  row to the call's list: a side effect dynamo replays after the graph, so the rows are extra
  outputs of the graph.
- Output gradients: the hook puts a gradient hook on each output leaf that requires grad
  (:func:`hook_gradient`), which reduces the tensor's gradient into a row of a *probe*, a small
  tensor made for each compiled call. Dynamo traces the hook into the backward graph, which
  stays one compiled graph.
- :class:`GraphState` is what the hooks read (dynamo guards on it: a recorded and an unrecorded
  variant of each graph, switched between without recompiling) and where they write.

Where dynamo does not compile a module call (a graph break) the same hook runs eagerly, and
records the same rows. :mod:`~workbench.instrument.compiled_hooks` gives each compiled call its
list and probe, and turns them into the step's rows.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from workbench.instrument import _stats_kernels as kernels
from workbench.instrument import torch_internals as internals
from workbench.instrument.reduce import EMPTY
from workbench.instrument.reduce_cpu import callbacks, dense
from workbench.instrument.reduce_torch import as_float, device_histogram, sample_shift
from workbench.instrument.reduce_triton import KERNEL_BINS, KERNEL_DTYPES, import_kernels
from workbench.instrument.schema import ABS_SUM, SUM_SQ, SUMS
from workbench.instrument.sites import CallSites
from workbench.instrument.tree import map_tensors, tensor_leaves

__all__ = ["MADE", "SAMPLED", "GraphState", "add_row", "cpu_row", "graph_row", "hold_passes_of", "holds_passes",
           "hook_gradient", "make_hooks", "observe", "offset_in_base", "release_passes_of", "row_width",
           "view_elements"]


def row_width(bins: int) -> int:
    """Columns of a :func:`graph_row`: the SUMS, ``bins`` histogram counts, whether they were counted
    from a sample (1) or every value (0), and a 1 (a row was made)."""
    return len(SUMS) + bins + 2


#: Column of a row's "counted from a sample" flag (from the end), and of its "a row was made" 1.
SAMPLED, MADE = -2, -1


def _graph_sums(x: torch.Tensor) -> torch.Tensor:
    """The :data:`SUMS` of ``x`` as a float64 row, written for inductor to fuse into one pass over
    ``x``: every reduction reads the same flat tensor (a ``dot`` or a chain of in-place ops, as in
    :func:`~workbench.instrument.reduce_torch.device_sums`, would be passes of their own). The
    same definitions as ``device_sums``: ``nonzero`` counts NaNs too, a NaN makes the sums NaN."""
    flat = as_float(x).reshape(-1)
    if flat.numel() == 0:
        return torch.tensor(EMPTY, dtype=torch.float64, device=flat.device)
    shift = sample_shift(flat)
    centred = flat - shift
    magnitude = flat.abs()
    # counts as float sums of 0/1 selected by where: inductor vectorizes those (bool or int64 sums,
    # and nansum, it does not)
    one, zero = torch.ones_like(flat), torch.zeros_like(flat)
    parts = [centred.sum(), (centred * centred).sum(), magnitude.sum(), flat.amin(), flat.amax(),
             torch.where(flat != 0, one, zero).sum(), torch.where(flat != flat, one, zero).sum(),  # noqa: PLR0124 (NaN)
             torch.where(magnitude == float("inf"), one, zero).sum(), shift]
    return torch.stack([p.to(torch.float64) for p in parts])


def graph_row(x: torch.Tensor, bins: int, edges: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 row of ``x`` (:func:`row_width` columns): its SUMS, its histogram counts
    (``bins``, 0 for none; over ``edges``, 2 float64, where they are finite, else over its own
    [min, max]), whether they were sampled, a 1 (a row was made).

    On a GPU, torch ops that inductor fuses into the graph's kernels; run eagerly (a module call
    outside the graphs, the model's own output, its gradient), the eager watch's Triton kernels
    (:func:`_kernel_row`). On the CPU, the eager watch's one-pass kernels, through :data:`cpu_row`,
    an op the graph calls as it is: inductor's CPU loops over the torch ops are many times slower
    per value (a profile in docs/compile.md), and a module call run eagerly would take a torch
    kernel per statistic."""
    if x.device.type == "cpu":
        return cpu_row(x.detach(), bins, edges)
    if type(x) is torch.Tensor and not torch.compiler.is_compiling():  # (run eagerly: no graph to fuse into)
        row = _kernel_row(x, bins, edges)
        if row is not None:
            return row
    return _torch_row(x, bins, edges)


def _torch_row(x: torch.Tensor, bins: int, edges: torch.Tensor | None) -> torch.Tensor:
    sums = _graph_sums(x)
    parts = [sums]
    if bins:  # (every value: not sampled)
        parts.append(device_histogram(x.detach(), sums, bins, edges=edges).double())
    parts.append(torch.tensor([0.0, 1.0], dtype=torch.float64, device=sums.device))
    return torch.cat(parts)


_kernels_failed = False  # set once the Triton kernels failed to compile or launch: torch's ops from then on
_made_of: dict[torch.device, torch.Tensor] = {}  # the last two columns of a row of every value, on each device


def _kernel_row(x: torch.Tensor, bins: int, edges: torch.Tensor | None) -> torch.Tensor | None:
    """:func:`graph_row` of a GPU tensor outside the graphs by the eager watch's Triton kernels
    (:func:`~workbench.instrument._triton_kernels.batch_sums`: two or three launches, where the
    torch ops take some thirty), or None where they do not read it (the torch ops do). The same
    sums, and the same bins (test_cuda.py checks both against torch's kernels on the GPU)."""
    global _kernels_failed
    if (_kernels_failed or not x.is_cuda or x.dtype not in KERNEL_DTYPES or bins > KERNEL_BINS
            or x.layout is not torch.strided or x.is_neg() or x.numel() == 0):
        return None
    triton_kernels = import_kernels()
    if triton_kernels is None:
        return None
    x = x.detach().contiguous()  # (read in stream order: later in-place ops do not reach the row)
    try:
        with torch.cuda.device(x.device):
            sums, counts = triton_kernels.batch_sums([x], bins, None if edges is None else edges.reshape(1, 2))
    except Exception as exc:  # (a GPU or Triton build the kernels do not compile for)
        _kernels_failed = True
        warnings.warn(f"workbench.watch: the Triton kernels failed ({type(exc).__name__}: {exc}); the compiled "
                      "model's calls outside its graphs are reduced by torch's ops (slower, same results).",
                      RuntimeWarning, stacklevel=2)
        return None
    made = _made_of.get(x.device)
    if made is None:
        made = _made_of[x.device] = torch.tensor([0.0, 1.0], dtype=torch.float64, device=x.device)
    return torch.cat([sums[0], counts[0].double(), made] if bins else [sums[0], made])


_draws = itertools.count()  # the seeds of the sampled histograms: new each call, the same in every run
_OWN_RANGE = np.full(2, np.nan)  # the range a histogram kernel reads for "the tensor's own [min, max]"
_OWN_RANGE_ADDRESS = _OWN_RANGE.ctypes.data


def _cpu_row(x: torch.Tensor, bins: int, edges: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`graph_row` of a CPU tensor by the compiled kernels (:mod:`~workbench.instrument._stats_kernels`),
    as the eager watch reduces it (its histogram from a sample where it is large, each call drawing
    anew); a tensor they do not read as it is (another dtype or layout) by the torch ops. The
    kernel of the op :data:`cpu_row`."""
    n = x.numel()
    if x.dtype not in (torch.float32, torch.float64) or x.layout is not torch.strided or x.is_neg() or n == 0:
        return _torch_row(x, bins, edges)
    if not dense(x):
        x = x.contiguous()  # (a copy)
    fast, exact, histogram, _, _ = callbacks(x.dtype)  # (on raw addresses: no dispatch on array types)
    row = np.zeros(row_width(bins))
    data, out = x.data_ptr(), row.ctypes.data
    fast(data, n, out)
    if not (math.isfinite(row[SUM_SQ]) and math.isfinite(row[ABS_SUM])):  # (checked outside fast-math)
        exact(data, n, out)
    if bins:
        counts = np.zeros(bins, np.float32)
        if edges is not None and (edges.dtype != torch.float64 or not edges.is_contiguous()):
            edges = edges.double().contiguous()  # (the kernel reads 2 float64 at its address)
        binned_over = _OWN_RANGE_ADDRESS if edges is None else edges.data_ptr()
        histogram(data, n, out, bins, counts.ctypes.data, binned_over, next(_draws))
        row[len(SUMS):SAMPLED] = counts
        row[SAMPLED] = n >= kernels.SAMPLE_FROM
    row[MADE] = 1.0
    return torch.from_numpy(row)


# An op that dynamo and inductor keep in the graph as one opaque call, defined with torch.library's
# plain registration rather than ``torch.library.custom_op``, whose autograd and aliasing checks
# around each call cost more than the kernels on a small tensor (bench/compiled_op.py). It has no
# autograd formula: its input is always detached. Inductor's cache of compiled graphs keys them on
# the op's name but not on its output shape: a change to a row's columns (row_width) renames the
# op, or graphs compiled before would mismatch. Tagged ``flexible_layout``: it takes a tensor in the
# layout inductor chose (channels-last for convolutions), where an op's default (``needs_exact_strides``)
# has inductor copy it into the eager layout first, and the convolutions can then lose theirs (the
# dynamics network's figures in docs/compile.md, "Inductor's layouts").
_LIBRARY = torch.library.Library("workbench", "DEF")
# (torch before 2.5 has no such tag, and no layout constraint on an op's inputs to lift)
_LAYOUT_TAGS = (torch.Tag.flexible_layout,) if hasattr(torch.Tag, "flexible_layout") else ()
_LIBRARY.define("cpu_row(Tensor x, int bins, Tensor? edges=None) -> Tensor", tags=_LAYOUT_TAGS)
_LIBRARY.impl("cpu_row", _cpu_row, "CPU")


@torch.library.register_fake("workbench::cpu_row", lib=_LIBRARY)
def _cpu_row_shape(x: torch.Tensor, bins: int, edges: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty(row_width(bins), dtype=torch.float64)


#: ``cpu_row(x, bins, edges=None)``: :func:`graph_row` of a detached CPU tensor, an op the graph calls as it is
#: (its kernel: :func:`_cpu_row`).
cpu_row = torch.ops.workbench.cpu_row.default


# ``add_row(probe, row, index, grad, bins, edges)``: ``probe[index] += row`` (``row``: the graph's row of ``grad``),
# written where the graph calls it, in the backward. The probe is an input of the forward graph that the backward
# writes; a write torch sees (``add_``, or a schema that says the op mutates it) bumps its version counter, and
# every other compiled backward that kept the probe (each graph of a call with graph breaks, the same graph in a
# second backward pass through one forward) then refuses it as "modified by an inplace operation". So the schema
# says it mutates nothing, the kernel writes through ``.data`` (a version counter of its own), and the op is
# registered as having a side effect: no dead-code elimination takes out an op without outputs. Nothing else reads
# the probe before the step ends. Tagged ``cudagraph_unsafe``: a CUDA graph would replay the write into the probe
# it was captured with.
# Several backward passes through one forward (``retain_graph=True``, then another): the eager watch records the
# row of the passes' total gradient. A pass that keeps the graph (read when the op runs: the backward graph is
# compiled once for every kind of pass) holds its gradient, the running total, for a probe the watch registered
# (:func:`hold_passes_of`); the next pass adds its own to it and sets the probe's row to the total's (reduced
# eagerly, by graph_row, with ``bins`` and ``edges``); one that frees the graph lets the total go. Where nothing is
# held (one pass, the common case) the row the graph made is added as it is, and a second row added onto it (a
# pass after one that freed the graph: no total to take) counts 2 in its MADE column, left out by the step.
_LIBRARY.define("add_gradient_row(Tensor probe, Tensor row, int index, Tensor grad, int bins, Tensor? edges) -> ()",
                tags=(torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ())

# the data address of each probe registered by the watch (hold_passes_of) -> its row index -> the running total of
# the gradients of the backward passes through its forward that kept the graph
_held: dict[int, dict[int, torch.Tensor]] = {}


def hold_passes_of(probe: torch.Tensor) -> None:
    """Have the backward passes that keep the graph hold the running total of ``probe``'s gradients (:data:`add_row`),
    until :func:`release_passes_of`: for the probes of a step in progress alone (an address is not reused while its
    probe is registered: the watch keeps it)."""
    _held[probe.data_ptr()] = {}


def holds_passes(probe: torch.Tensor) -> bool:
    """Whether a backward pass through ``probe``'s forward that kept the graph left gradients held for the next."""
    return bool(_held.get(probe.data_ptr()))


def release_passes_of(probe: torch.Tensor) -> None:
    """Let go of the gradients held for ``probe`` (its step ended): a later pass through its forward adds its row."""
    _held.pop(probe.data_ptr(), None)


def _add_gradient_row(probe: torch.Tensor, row: torch.Tensor, index: int, grad: torch.Tensor, bins: int,
                      edges: torch.Tensor | None) -> None:
    totals = _held.get(probe.data_ptr())
    keeps = totals is not None and internals.keeps_graph()
    total = totals.pop(index, None) if totals is not None else None
    if total is None:
        probe.data[index] += row
        if keeps:
            totals[index] = grad.detach().clone()
        return
    total += grad
    made = graph_row(total, bins, edges)
    # (a row the graph left out, all zeros: a view's row where it shares no storage with its base, stays out)
    probe.data[index] = torch.where(row[MADE] > 0, made, torch.zeros_like(made))
    if keeps:
        totals[index] = total


_LIBRARY.impl("add_gradient_row", _add_gradient_row, "CompositeExplicitAutograd")


@torch.library.register_fake("workbench::add_gradient_row", lib=_LIBRARY)
def _add_gradient_row_shape(probe: torch.Tensor, row: torch.Tensor, index: int, grad: torch.Tensor, bins: int,
                            edges: torch.Tensor | None) -> None:
    return None


#: ``add_row(probe, row, index, grad, bins, edges)``: adds ``row`` (of ``grad``) to row ``index`` of ``probe``, or
#: sets it to the row of the passes' total gradient (see above), unseen by autograd's version counters; kept in the
#: graph where nothing uses its (absent) output.
add_row = torch.fx.node.has_side_effect(torch.ops.workbench.add_gradient_row.default)


# ``offset_in_base(view, base)``: a 0-dim int64 tensor on the view's device, where ``view`` starts in ``base``'s
# storage (in elements from the base's start), taken when the graph runs; -1 where they do not share a storage (a
# backend that made the view a copy). Dynamo traces no ``storage_offset()`` (a graph break), and an offset kept from
# the trace would go stale with dynamic shapes (``h[1:]`` of a ``(B, T, D)`` tensor starts ``T * D`` in, ``h[-2:]``
# at the start of a batch of 2 alone): the graph reads it as a tensor, adding no guard and no graph.
_LIBRARY.define("offset_in_base(Tensor view, Tensor base) -> Tensor")


def _offset_in_base(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    shared = view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    offset = view.storage_offset() - base.storage_offset() if shared else -1
    return torch.full((), offset, dtype=torch.int64, device=view.device)


_LIBRARY.impl("offset_in_base", _offset_in_base, "CompositeExplicitAutograd")


@torch.library.register_fake("workbench::offset_in_base", lib=_LIBRARY)
def _offset_in_base_shape(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    return view.new_empty((), dtype=torch.int64)


offset_in_base = torch.ops.workbench.offset_in_base.default


def view_elements(base_grad: torch.Tensor, base_size: Any, base_stride: Any, size: Any, stride: Any,
                  offset: torch.Tensor) -> torch.Tensor:
    """The elements of ``base_grad`` (the gradient w.r.t. a base of sizes ``base_size`` and strides
    ``base_stride``) that a view of that base with sizes ``size``, strides ``stride`` and storage offset
    ``offset`` (a 0-dim int64 tensor, from the base's start: :data:`offset_in_base`) reads, in the view's sizes:
    the gradient laid out as the base lies in memory, the stretch of it the view spans gathered from the offset
    on (an index of that stretch: the offset is a tensor, not a size a slice could take), and read with the
    view's sizes and strides. Sizes and strides may be symbolic (dynamic shapes): nothing guards them (no
    broadcast, which would guard a size against 1)."""
    def spanned(sizes: Any, strides: Any) -> Any:  # (elements of memory from the first to the last, at least 1)
        return torch.sym_max(1 + sum((n - 1) * s for n, s in zip(sizes, strides)), 1)

    memory = base_grad.new_empty(spanned(base_size, base_stride))
    memory.as_strided(base_size, base_stride).copy_(base_grad)
    # (-1, no shared storage: any stretch, the row is then all zeros, see hook_gradient; the clamp keeps a view of
    # no elements, whose stretch is 1, inside the memory)
    start = offset.clamp(min=0)
    index = (torch.arange(spanned(size, stride), device=offset.device) + start).clamp(max=memory.numel() - 1)
    return memory[index].as_strided(size, stride)


def hook_gradient(tensor: torch.Tensor, probe: torch.Tensor, row: int, bins: int,
                  edges: torch.Tensor | None, view: torch.Tensor | None = None) -> None:
    """Add the :func:`graph_row` of ``tensor``'s gradient (binned over ``edges``, see :func:`graph_row`)
    to row ``row`` of ``probe`` in the backward, by a hook on the tensor itself: it gets the
    tensor's total gradient, of its uses inside the module that returned it too, as the eager
    watch's hook does. Traced, the hook is part of the backward graph (dynamo's ``register_hook``
    of an intermediate tensor, no graph break) and its write into ``probe`` (an input of the
    forward graph, written in the backward by :data:`add_row`) leaves it; run eagerly, it is a
    pre-hook on the autograd node that made the tensor (a leaf's clone's), as the eager watch's
    ``GradientHook``. The row's last column counts the backward passes that reached it (several keeping the
    graph: one, of their total, see :data:`add_row`).

    With ``view`` (a view whose base is ``tensor``: :func:`~workbench.instrument.torch_internals.view_base`), the
    row is of the view's elements of the base's gradient (:func:`view_elements`, at the view's storage offset in
    the base taken when the graph runs: :data:`offset_in_base`): what a hook on a view that an in-place op
    changed later never gets, as the eager watch's ``GradientHook`` takes it from the view's base. A view of all
    the base's elements at every size (a ``reshape``, a ``transpose``, a ``Flatten``) has their statistics: the
    base's gradient is reduced as it is, without a copy. Where the view and its base share no storage when the
    graph runs (a backend that copied the view), the row is all zeros, no row."""
    geometry = offset = None
    # (sizes and strides, and a 0-dim offset: no tensor of the forward kept alive; a view that has all of its
    # base's elements only at some sizes of a dynamic shape is gathered, as one of part of them)
    if view is not None and not internals.all_of_its_base(view, tensor):
        geometry = (tensor.size(), tensor.stride(), view.size(), view.stride())
        offset = offset_in_base(view.detach(), tensor.detach())

    def into_probe(grad: torch.Tensor | None) -> None:
        if grad is None:  # (run eagerly: a node's output that got no gradient passes None)
            return
        if geometry is not None:
            grad = view_elements(grad, *geometry, offset)
        made = graph_row(grad, bins, edges)
        if offset is not None:  # (a row of zeros: its MADE column 0, no row)
            made = torch.where(offset >= 0, made, torch.zeros_like(made))
        add_row(probe, made, row, grad, bins, edges)

    # (traced: a tensor hook, the one dynamo traces into the backward graph; reading grad_fn there breaks the graph)
    node = None if torch.compiler.is_compiling() else tensor.grad_fn
    if node is None:
        tensor.register_hook(into_probe)
        return
    # run eagerly (the model's own output, a call in a graph break): a pre-hook on the node that made the tensor,
    # as the eager watch's GradientHook, which fires where a backward runs that node: a torch.autograd.grad that
    # takes the tensor itself as an input stops before it, and is no pass through it there either
    output = tensor.output_nr
    node.register_prehook(lambda grads: into_probe(grads[output]))


class GraphState:
    """What the traced hooks read (dynamo guards on it) and write (replayed after each graph).

    Call sites are named as :class:`~workbench.instrument.sites.CallSites` names them, from tables
    made once here: a module with one path by that path; where a module is shared, the modules
    with children keep a stack of the paths being run, and a shared module is named by its caller's
    path. The model itself is recorded around the compiled call, not in it (dynamo starts at its
    forward)."""

    def __init__(self, sites: CallSites, bins: int) -> None:
        self.index(sites)
        self.bins = bins
        self.activation_sites: frozenset[str] = frozenset()
        self.grad_sites: frozenset[str] = frozenset()
        self.recording = False  # a recorded step, not paused
        # path -> (fn, call index or None: every call), while not paused
        self.patches: dict[str, tuple[tuple[Callable, int | None], ...]] = {}
        # the paths with a patch of one call -> the count their calls are counted up to in ``calls``
        # (reset each step): one past the highest call index patched there, and at least 2 (a
        # recomputation needs to tell one call from several); the calls past it share that count,
        # and no patch applies to them. Dynamo specializes a graph on the count at its start: such
        # a patch costs a graph variant per count a compiled call of the model starts from
        self.counted: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.unknown_calls: set[str] = set()  # paths recomputed whose call index was not known (see observe)
        #: patches that raised (path, fn, call, the exception, the output they got): the model ran on
        #: unpatched; the hooks take them out, as the eager watch does
        self.failed: list[tuple[str, Callable, int | None, Exception, Any]] = []
        # per compiled call (set around it): the stack, the rows, the probe and its rows taken, the
        # activation rows taken; with histograms, the fixed ranges of its activation rows and of its
        # probe's rows (see CompiledHooks: (rows, 2) float64, NaN: the tensor's own range)
        self.stack: list[str | None] = []
        self.out: list | None = None
        self.probe: torch.Tensor | None = None
        self.probed: list[int] = []
        self.activation_rows: list[int] = []
        self.edges: torch.Tensor | None = None
        self.probe_edges: torch.Tensor | None = None

    def index(self, sites: CallSites) -> None:
        """Make the tables that name the calls, from ``sites`` as it is indexed now (at the start,
        and again after the model changed under the watch: new objects, on which dynamo's guards
        fail, so the graphs that read the old ones recompile)."""
        root = id(sites.model)
        self.root_path = sites.aliases[root][0]
        self.containers = frozenset(sites.containers - {root})
        self.shared = frozenset(key for key, paths in sites.aliases.items() if len(paths) > 1) - self.containers
        self.paths = {key: paths[0] for key, paths in sites.aliases.items() if key != root and len(paths) == 1}
        parents = [None] + [p for key in sites.containers for p in sites.aliases[key]]
        self.resolve = {(parent, key): sites.resolve(parent, sites.modules[key])
                        for key in (self.shared | self.containers) for parent in parents}


def make_hooks(state: GraphState) -> tuple[Callable, Callable]:
    """The process-wide forward pre-hook and hook that dynamo traces into the model's graphs (to be
    registered with ``traced=True``: :func:`~workbench.instrument.torch_internals.register_module_hooks`)."""

    # Outside a watched call (a direct call of the uncompiled model, a checkpointed segment
    # recomputed in the backward) the hooks apply the patches alone, as the eager watch does: a
    # recomputation must compute what the forward did
    def pre_hook(module: nn.Module, args: Any) -> None:
        st = state
        if st.out is None and not st.patches:
            return
        key = id(module)
        if key in st.containers:  # (only where a module is shared)
            path = st.paths.get(key)
            if path is None:
                path = st.resolve.get((st.stack[-1] if st.stack else None, key))
            st.stack.append(path)

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        st = state
        if st.out is None and not st.patches:  # outside a watched call
            return None
        key = id(module)
        if key in st.containers:
            if not st.stack:
                return None
            path = st.stack.pop()
        else:
            path = st.paths.get(key)
            if path is None and key in st.shared:  # named by its caller's path
                path = st.resolve.get((st.stack[-1] if st.stack else None, key))
        if path is None:  # not of this model (or its root, recorded around the call)
            return None
        return observe(st, path, module, output, torch.compiler.is_compiling())

    return pre_hook, hook


def observe(st: GraphState, path: str, module: nn.Module, output: Any, in_graph: bool | None) -> Any:
    """Patch and record one module call (traced, or run eagerly); returns the output to use, or None
    for the output as it is. Appends ``(path, leaf names, shapes, rows or None, probe rows, base
    rows, in_graph, floating)`` to ``st.out``; a probe row of -1 is no gradient wanted, -2 no room in
    the probe; a leaf's base row (-1: none) is that of the view's elements of its base's gradient
    (:func:`hook_gradient`), its row where its own row got no gradient; ``floating`` says of each leaf
    whether it is a floating-point tensor."""
    patches = st.patches.get(path)
    if patches is not None:
        call = None
        last = st.counted.get(path)
        if last is not None and st.out is None and internals.in_backward():
            # a recomputation in the backward (activation checkpointing): which call it recomputes
            # is known where the forward called the site once; else a patch of one call does not
            # apply (the step reports it, and takes the patch out, as the eager watch does)
            call = 0 if st.calls.get(path) == 1 else None
            if call is None:
                st.unknown_calls.add(path)
        elif last is not None:  # (a call inside a watched call, or a direct one: counted alike)
            call = st.calls.get(path, 0)
            st.calls[path] = min(call + 1, last)
        for fn, at in patches:
            if at is None or at == call:
                try:  # (dynamo traces the handler, or runs the frame eagerly where it cannot)
                    patched = fn(output)
                    if patched is not None:  # (None: fn edited the output in place, which stays the output)
                        output = patched
                except Exception as exc:
                    if st.out is None and internals.in_backward():
                        raise  # (a recomputation: checkpointing stops one by raising, through the patch)
                    st.failed.append((path, fn, call, exc, output))
    if not st.recording or st.out is None:
        return output if patches is not None else None
    leaves = [("out", output)] if isinstance(output, torch.Tensor) else list(tensor_leaves(output))
    record = path in st.activation_sites
    grads = path in st.grad_sites and module.training and torch.is_grad_enabled()
    names, shapes, rows, probed, from_base, bases = [], [], [], [], [], []
    replaced = patches is not None
    floating = []
    for name, tensor in leaves:
        names.append(name)
        shapes.append(tuple(tensor.shape))
        floating.append(tensor.is_floating_point())
        if record:
            k = len(st.activation_rows)
            st.activation_rows.append(k)
            edges = st.edges[k] if st.edges is not None and k < st.edges.shape[0] else None
            rows.append(graph_row(tensor, st.bins, edges))
        row = base_row = -1
        base = None
        if grads and tensor.requires_grad and tensor.is_floating_point():
            row = _probe_row(st)
            # a view of a base autograd made: a second row, of the view's elements of the base's gradient, for the
            # step where an in-place op on the view leaves the view's own hook unfired
            base = internals.view_base(tensor) if row >= 0 else None
            if base is not None:
                base_row = _probe_row(st)
        probed.append(row)
        from_base.append(base_row)
        bases.append(base)
    if any(r >= 0 for r in probed):
        # a leaf (a parameter or an input, returned) is cloned and its clone hooked (a hook on the
        # leaf itself would stay on it, and dynamo would put it on outside the graph): its gradient
        # is that of the uses after the module returned it
        # (popped in the order tensor_leaves gave them; dynamo traces no next())
        pending = list(zip(probed, from_base, bases))
        probe, bins, probe_edges = st.probe, st.bins, st.probe_edges

        def hooked(tensor: torch.Tensor) -> torch.Tensor:
            row, base_row, base = pending.pop(0)
            if row < 0:
                return tensor
            if base_row >= 0:
                base_edges = probe_edges[base_row] if probe_edges is not None else None
                hook_gradient(base, probe, base_row, bins, base_edges, view=tensor)
            if tensor.is_leaf:
                tensor = tensor.clone()
            hook_gradient(tensor, probe, row, bins, probe_edges[row] if probe_edges is not None else None)
            return tensor

        if any(tensor.is_leaf for (_, tensor), row in zip(leaves, probed) if row >= 0):
            replaced = True
            output = hooked(output) if isinstance(output, torch.Tensor) else map_tensors(output, hooked)
        else:  # (the output as it is: no container rebuilt)
            for _, tensor in leaves:
                hooked(tensor)
    st.out.append((path, tuple(names), tuple(shapes), torch.stack(rows) if rows else None, tuple(probed),
                   tuple(from_base), in_graph, tuple(floating)))
    return output if replaced else None


def _probe_row(st: GraphState) -> int:
    """The next free row of the call's probe, or -2 where it is full (its capacity grows for the next call)."""
    if st.probe is not None and len(st.probed) < st.probe.shape[0]:
        row = len(st.probed)
        st.probed.append(row)
        return row
    return -2
