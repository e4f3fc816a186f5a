"""The record schema, written once: the kinds of tensor recorded and the columns of a row.

One row per tensor per call site per recorded step (DESIGN.md, "Record schema"):
:data:`KEY_COLUMNS` name the tensor, :data:`STAT_COLUMNS` are its statistics.
The recorder's frames, the run store's tables and the UI all read these.
"""

from __future__ import annotations

import pandas as pd

from workbench.instrument.stats import STAT_COLUMNS

__all__ = ["ACTIVATION", "GRAD_OUTPUT", "PARAM", "PARAM_GRAD", "KINDS", "KEY_COLUMNS", "STAT_COLUMNS",
           "ROW_COLUMNS", "INT_COLUMNS", "TEXT_COLUMNS", "anomalous"]

ACTIVATION = "activation"  #: a module's output (every tensor leaf of a structured output)
GRAD_OUTPUT = "grad_output"  #: the gradient w.r.t. a module's output
PARAM = "param"  #: a parameter's value, once per recorded step
PARAM_GRAD = "param_grad"  #: a parameter's gradient, as accumulated by the step's backward
KINDS = (ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD)

#: What names a row: the step, the call site (module path and call index), the kind, the tensor
#: leaf inside a structured output (``out``, ``out.0``, ``out.1.h``) and its shape.
KEY_COLUMNS = ("step", "module", "call", "kind", "tensor", "shape")
#: Columns of ``to_pandas()``.
ROW_COLUMNS = KEY_COLUMNS + STAT_COLUMNS
INT_COLUMNS = ("step", "call", "numel", "nan_count", "inf_count")
TEXT_COLUMNS = ("module", "kind", "tensor", "shape")


def anomalous(rows: pd.DataFrame) -> pd.Series:
    """Which rows hold a NaN or an Inf."""
    return (rows.nan_count > 0) | (rows.inf_count > 0)
