"""Instrumentation: hooks -> on-device statistics -> the Recorder's stream (-> the run store).

``watch(model)`` attaches to any ``nn.Module``; see :mod:`workbench.instrument.hooks`.
"""

from workbench.instrument.recorder import Recorder, StepRecord, Subscription, Update
from workbench.instrument.schema import KINDS, ROW_COLUMNS, STAT_COLUMNS
from workbench.instrument.store import Run, RunError, RunStore, compare_runs, list_runs, load_run
from workbench.instrument.hooks import Intervention, Watch, watch

__all__ = ["KINDS", "ROW_COLUMNS", "STAT_COLUMNS", "Intervention", "Recorder", "Run", "RunError", "RunStore", "StepRecord",
           "Subscription", "Update", "Watch", "compare_runs", "list_runs", "load_run", "watch"]
