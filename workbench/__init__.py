"""workbench: an interactive experiment workbench for PyTorch modules.

Pick a module from the registry, build it, run it on a small built-in task and
look inside it::

    import workbench
    workbench.list_models(family="activation")
    model = workbench.create_model("prelu", num_parameters=4)
    exp = workbench.experiments.create("activation_mlp", activation="gelu")
    exp.step()
    with workbench.watch(model) as w:  # activations and gradients per call site
        ...
"""

from workbench.registry import (
    ModelSpec,
    ProbeResult,
    create_model,
    get_spec,
    list_families,
    list_models,
    probe,
    register_model,
    unregister_model,
)
from workbench.params import MemoryLimitError, ParamInfo, Range
from workbench.summary import summarize
from workbench.instrument import (CompiledWatch, Recorder, Run, RunError, Watch, compare_runs, list_runs, load_run,
                                  watch, watch_compiled)
from workbench import models  # noqa: F401  (registers the built-in families)
from workbench import experiments

from workbench._version import __version__

__all__ = [
    "CompiledWatch",
    "MemoryLimitError",
    "ModelSpec",
    "ParamInfo",
    "ProbeResult",
    "Range",
    "Recorder",
    "Run",
    "RunError",
    "Watch",
    "__version__",
    "compare_runs",
    "create_model",
    "experiments",
    "get_spec",
    "list_families",
    "list_models",
    "list_runs",
    "load_run",
    "probe",
    "register_model",
    "summarize",
    "unregister_model",
    "watch",
    "watch_compiled",
]
