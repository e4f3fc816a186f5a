"""Instrumentation: ``watch(model)`` records activations and gradients of any ``nn.Module``.

The pipeline, one file a stage (a newcomer's map):

1. :mod:`~workbench.instrument.sites` names each module call: module path and call index
   (pure bookkeeping on the module tree).
2. :mod:`~workbench.instrument.hooks` is where hooks are attached and fire: forward hooks, output
   gradient hooks, parameter gradient hooks, parameter reads; each hands a tensor and its row key
   to the step's sums. Every private torch API they rely on is in
   :mod:`~workbench.instrument.torch_internals`.
3. :mod:`~workbench.instrument.reduce` is where a statistic is computed: each tensor becomes a row
   of raw sums, by a reducer chosen per tensor - compiled CPU kernels (:mod:`~workbench.instrument.reduce_cpu`),
   Triton on CUDA (:mod:`~workbench.instrument.reduce_triton`) or torch's kernels
   (:mod:`~workbench.instrument.reduce_torch`).
4. :mod:`~workbench.instrument.watch` (the ``Watch`` facade) ends each step: one host transfer of
   the sums, one :class:`StepRecord` published to the :mod:`~workbench.instrument.recorder`.
   A compiled model is watched by :mod:`~workbench.instrument.compiled` (``CompiledWatch``, the
   same facade): its hooks are traced into the compiled graphs
   (:mod:`~workbench.instrument.compiled_graph`), which compute the statistics there, and
   :mod:`~workbench.instrument.compiled_hooks` collects them per step.
5. Sinks subscribe to the recorder: :mod:`~workbench.instrument.store` is where a row is written
   (SQLite), composed by :func:`watch` (:mod:`~workbench.instrument.compose`), and
   :mod:`~workbench.instrument.runs` reads stored runs back (:mod:`~workbench.instrument.tensorboard`
   exports one); the UI's views read the same stream. :mod:`~workbench.instrument.schema` names the
   kinds, the sums and the columns once.

Beside the stages: :mod:`~workbench.instrument.tree` walks structured outputs into named tensor
leaves, :mod:`~workbench.instrument.interventions` holds the patches and ablations the forward hook
applies, and :mod:`~workbench.instrument.distributed` (with
:mod:`~workbench.instrument.distributed_rows`) merges the ranks' sums of a data-parallel run;
:mod:`~workbench.instrument.interrupts` holds a kernel interrupt until a step is published (there) or counted
and recorded (by an experiment).
"""

from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update
from workbench.instrument.schema import KINDS, ROW_COLUMNS, STAT_COLUMNS
from workbench.instrument.runs import Run, compare_runs, list_runs, load_run
from workbench.instrument.store import RunError, RunStore
from workbench.instrument.interventions import Intervention
from workbench.instrument.watch import Watch
from workbench.instrument.compose import watch
from workbench.instrument.compiled import CompiledWatch, watch_compiled

__all__ = ["KINDS", "ROW_COLUMNS", "STAT_COLUMNS", "CompiledWatch", "Intervention", "Recorder", "Run", "RunError",
           "RunStore", "StepRecord", "Subscription", "Update", "Watch", "compare_runs", "list_runs", "load_run",
           "watch", "watch_compiled"]
