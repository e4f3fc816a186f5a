"""Small built-in tasks that train a registered model one step at a time.

    exp = workbench.experiments.create("activation_mlp", seed=0, activation="gelu")  # device="cuda" on a GPU
    for _ in range(100):
        metrics = exp.step()          # {"step": 1, "loss": ..., "accuracy": ...}
    run = exp.start(500)              # a BackgroundRun: trains on a thread; pause(), resume(), stop()
    workbench.experiments.running()   # the background runs in progress, also those no variable names any more
    exp.save("train.pt")              # the whole training state; workbench.experiments.resume("train.pt") goes on

Importing this package registers the built-in experiments.
"""

from workbench.experiments.base import (
    BackgroundRun,
    Experiment,
    ExperimentSpec,
    create,
    evaluation,
    get_experiment_spec,
    list_experiments,
    register_experiment,
    resolve_device,
    resume,
    running,
    unregister_experiment,
)
from workbench.experiments import activation_mlp, efficientzero_dynamics, ilql, query_stream  # noqa: F401  (registers them)

__all__ = [
    "BackgroundRun",
    "Experiment",
    "ExperimentSpec",
    "create",
    "evaluation",
    "get_experiment_spec",
    "list_experiments",
    "register_experiment",
    "resolve_device",
    "resume",
    "running",
    "unregister_experiment",
]
