import types

import workbench


def test_all_matches_exports():
    # everything public that is not a submodule, plus the experiments namespace
    public = {n for n in dir(workbench)
              if not n.startswith("_") and not isinstance(getattr(workbench, n), types.ModuleType)}
    public.add("experiments")
    assert set(workbench.__all__) - {"__version__"} == public
    for name in workbench.__all__:
        assert hasattr(workbench, name)


def test_builtin_families_are_registered_on_import():
    assert set(workbench.list_models(family="activation")) == {"gelu", "prelu", "relu", "sigmoid", "tanh", "threshold"}
    assert "activation_mlp" in workbench.experiments.list_experiments()
