"""Call-site naming (workbench.instrument.sites) by hand: enter/leave called as the hooks would,
no torch hook installed. The paths expected are written out from the module trees below."""

from __future__ import annotations

import re

import pytest
from torch import nn

from workbench.instrument.sites import CallSites, selector


class Shared(nn.Module):
    """One activation object under two parents: ``a.act`` and ``b.act`` (and ``act`` itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()
        self.a = nn.Sequential(nn.Linear(2, 2))
        self.b = nn.Sequential(nn.Linear(2, 2))
        self.a.add_module("act", self.act)
        self.b.add_module("act", self.act)


def call(sites: CallSites, module: nn.Module, *children) -> str | None:
    """What the hooks do around ``module``'s call: enter, the children's calls, leave."""
    sites.enter(module)
    for child in children:
        child()
    return sites.leave(module)


def test_each_module_of_an_unshared_tree_is_named_by_its_one_path():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Tanh(), nn.Linear(3, 1)))
    sites = CallSites(model)
    assert not sites.needs_stack
    assert sites.paths == ["", "0", "1", "1.0", "1.1"]
    assert sites.leave(model[1][0]) == "1.0"
    assert sites.leave(model) == ""
    assert sites.leave(nn.ReLU()) is None  # a module of another model


def test_a_shared_module_is_named_by_the_alias_under_its_caller():
    model = Shared()
    sites = CallSites(model)
    assert sites.needs_stack
    assert sites.aliases[id(model.act)] == ["act", "a.act", "b.act"]
    seen = []
    record = lambda m: lambda: seen.append(sites.leave(m))  # noqa: E731 (a leaf's forward hook)
    path = call(sites, model,
                lambda: seen.append(call(sites, model.a, record(model.a[0]), record(model.act))),
                lambda: seen.append(call(sites, model.b, record(model.b[0]), record(model.act))),
                record(model.act))
    assert seen == ["a.0", "a.act", "a", "b.0", "b.act", "b", "act"]
    assert path == ""


def test_a_forward_that_raised_leaves_no_stale_entry_behind():
    model = Shared()
    sites = CallSites(model)
    sites.enter(model)
    sites.enter(model.a)  # a.forward raises: no leave for a, nor for the model
    assert sites.leave(model.act) == "a.act"  # (what a call inside a would be named)
    sites.new_step()
    assert sites.leave(model.act) == "act"  # called by no container of this step
    sites.enter(model)
    sites.enter(model.a)  # raised again; the model is then called anew within the step
    assert call(sites, model, lambda: sites.leave(model.act)) == ""
    assert sites.leave(model.act) == "act"


def test_calls_are_counted_per_path_within_a_step():
    sites = CallSites(nn.Linear(2, 2))
    assert [sites.count("") for _ in range(3)] == [0, 1, 2]
    assert sites.count("other") == 0
    sites.new_step()
    assert sites.count("") == 0


def test_selection_globs_lists_predicates_and_exclude():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Tanh(), nn.Linear(3, 1)))
    assert CallSites(model, "1.*").selected == {"1.0", "1.1"}
    assert CallSites(model, ["0", "1"]).selected == {"0", "1"}
    assert CallSites(model, lambda p: p.endswith("1")).selected == {"1", "1.1"}
    assert CallSites(model, "*", exclude="1*").selected == {"", "0"}
    assert selector(None, "exclude")("anything") is False
    with pytest.raises(TypeError, match=r"modules must be a glob string.*got 3"):
        CallSites(model, 3)
    with pytest.raises(ValueError, match=r"modules: the glob 'decoder.\*' matches no module of Sequential; its "
                                         r"module paths are: '' \(the model itself\), 0, 1, 1.0, 1.1"):
        CallSites(model, "decoder.*")
    with pytest.raises(ValueError, match=r"modules: the glob '1.O' matches no module .*did you mean .*'1.0'"):
        CallSites(model, ["0", "1.O"])  # (one typo among globs that match)
    with pytest.raises(ValueError, match=r"exclude: the glob 'nope' matches no module"):
        CallSites(model, "*", exclude="nope")


@pytest.mark.parametrize("what, pattern, wrong", [
    ("modules", "[bad", r"the '\[' at position 0 opens a set of characters that no '\]' closes; write '\[\[\]'"),
    ("modules", "1.[0-1", r"the '\[' at position 2 opens a set"),
    ("exclude", "[!]", r"the '\[' at position 0 opens a set"),
    ("modules", "1.[1-0]", r"the range '1-0' runs backwards and matches nothing; write it low to high, '0-1'"),
])
def test_a_malformed_glob_is_named_as_malformed_not_as_matching_nothing(what, pattern, wrong):
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Tanh(), nn.Linear(3, 1)))
    with pytest.raises(ValueError, match=rf"{what}: the glob {re.escape(repr(pattern))} is malformed: {wrong}"):
        CallSites(model, **{what: pattern})
    assert CallSites(model, "1.[01]").selected == {"1.0", "1.1"}  # (well-formed sets still select)
    assert CallSites(model, "[]1].*").selected == {"1.0", "1.1"}  # (a ']' first in a set is a member)


def test_parameters_are_listed_once_under_their_first_selected_owner():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.Tanh(), lin)  # one Linear called twice: its parameters once
    listed = [(path, name) for path, name, _ in CallSites(model).parameters()]
    assert listed == [("0", "weight"), ("0", "bias")]
    assert CallSites(model, "1").parameters() == []


def test_an_unknown_path_names_the_closest_ones():
    sites = CallSites(nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Tanh(), nn.Linear(3, 1))))
    sites.check_path("1.0")
    with pytest.raises(ValueError, match=r"No module at path '1\.2'\. Did you mean '1\.1' or '1\.0' or '1'\?"):
        sites.check_path("1.2")
