import pytest
import torch
from torch import nn

from workbench.summary import describe_shape, summarize


class Shared(nn.Module):
    """One activation object used at two call sites and reachable at two paths."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 5)
        self.act = nn.ReLU()
        self.block = nn.Sequential(self.fc2, self.act)
        self.unused = nn.Linear(1, 1)

    def forward(self, x):
        return self.block(self.act(self.fc1(x)))


def test_rows_params_and_shapes():
    model = Shared()
    df = summarize(model, ((torch.randn(6, 3),), {}))
    rows = df.set_index("module")
    assert list(df["module"]) == ["", "fc1", "fc2", "act", "block", "block.0", "block.1", "unused"]
    # each parameter counted once at the root, although fc2 sits at two paths
    assert rows.loc["", "params"] == (3 * 4 + 4) + (4 * 5 + 5) + 2
    assert rows.loc["block", "params"] == 4 * 5 + 5
    assert rows.loc["fc1", "output"] == "(6, 4)"
    # the shared ReLU ran twice: once as `act` (from forward), once as `block.1` (from the Sequential);
    # each path lists only the call made through it
    assert rows.loc["act", "output"] == "(6, 4)" and rows.loc["block.1", "output"] == "(6, 5)"
    assert rows.loc["act", "calls"] == 1 and rows.loc["block.1", "calls"] == 1
    assert rows.loc["unused", "output"] == "not called"
    assert rows.loc["block.0", "depth"] == 2


def test_hooks_are_removed_even_when_forward_raises():
    model = Shared()
    try:
        summarize(model, ((torch.randn(2, 7),), {}))
    except RuntimeError:
        pass
    assert all(not m._forward_hooks for m in model.modules())


def test_without_inputs_output_column_is_empty():
    df = summarize(nn.Linear(2, 3))
    assert list(df["output"]) == [""] and df["params"].iloc[0] == 9


def test_describe_shape_of_structures():
    t = torch.zeros
    assert describe_shape(t(2, 3)) == "(2, 3)"
    assert describe_shape((t(2), (t(1, 2, 8), t(1, 2, 8)))) == "((2), ((1, 2, 8), (1, 2, 8)))"
    assert describe_shape({"v": t(2, 1), "n": 3}) == "{v: (2, 1), n: int}"


class CalledTwice(nn.Module):
    """One activation object called twice through the same path, and once through another."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.act = nn.ReLU()
        self.head = nn.Sequential(nn.Linear(4, 2), self.act)

    def forward(self, x):
        return self.head(self.act(self.act(self.fc(x))[:, :4]))


def test_per_call_rows_give_each_call_its_own_shape():
    df = summarize(CalledTwice(), ((torch.randn(5, 3),), {}), per_call=True)
    assert list(df.columns) == ["module", "call", "depth", "type", "params", "trainable", "calls", "output"]
    act = df[df.module == "act"]
    assert list(act.call) == [0, 1] and list(act.output) == ["(5, 4)", "(5, 4)"] and set(act.calls) == {2}
    assert df[df.module == "head.1"].output.tolist() == ["(5, 2)"]
    # the default form: one row per path, the calls through it counted
    rows = summarize(CalledTwice(), ((torch.randn(5, 3),), {})).set_index("module")
    assert rows.loc["act", "output"] == "(5, 4) ×2" and rows.loc["head.1", "output"] == "(5, 2)"


def test_per_call_must_be_a_bool():
    import pytest

    with pytest.raises(TypeError, match="per_call must be True or False, got 'yes'"):
        summarize(nn.Linear(2, 3), per_call="yes")


def test_inputs_are_a_tensor_tensors_or_args_and_kwargs_and_anything_else_is_refused_by_name():
    import pytest

    x = torch.randn(6, 3)
    pd_equal = summarize(Shared(), x).equals(summarize(Shared(), ((x,), {})))
    assert pd_equal and summarize(Shared(), x).set_index("module").loc["fc1", "output"] == "(6, 4)"
    assert summarize(Shared(), (x,)).equals(summarize(Shared(), x))  # (a tuple of tensors: the positional inputs)
    for bad, got in [((x, 2, x), "a tuple of 3"), ([1, 2], "a list of 2"), ("x", "a str")]:
        with pytest.raises(TypeError, match=rf"inputs must be a tensor \(summarize\(model, x\)\), .*got {got}\."):
            summarize(Shared(), bad)


def test_a_forward_that_fails_names_the_module_it_failed_in_and_the_shapes():
    # the error is torch's, as it was (its type kept), with a note that says where and with what inputs
    with pytest.raises(RuntimeError, match="cannot be multiplied") as raised:
        summarize(Shared(), torch.randn(2, 7))
    note = "".join(raised.value.__notes__)
    assert "failed in module 'fc1' (Linear), whose inputs had shapes (2, 7)" in note
    assert "the model was given inputs of shapes (2, 7)" in note
    with pytest.raises(TypeError, match="takes 2 positional arguments") as raised:
        summarize(nn.Linear(3, 2), (torch.randn(4, 3), torch.randn(2)))
    assert "failed in its own forward, given inputs of shapes (4, 3), (2)." in "".join(raised.value.__notes__)


def test_a_model_that_is_not_a_module_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got str 'mlp'"):
        summarize("mlp", torch.randn(2, 3))
