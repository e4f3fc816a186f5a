"""The compiled watch against the eager watch on a zoo of small models, each with a pattern that
moves tensors between modules in its own way: residual blocks, a module called twice, tuple and dict
outputs, in-place activations, BatchNorm updating its buffers in the forward, LayerNorm, Embedding,
Dropout in eval mode, an output the module also uses itself.

For each: the compiled watch's rows equal the eager watch's (sites, call indices, kinds, statistics
to float tolerance), and the watched compiled model's losses, parameters and buffers after two SGD
steps are bitwise the unwatched compiled model's, in as many graphs. Compiled with ``aot_eager``
(dynamo and AOTAutograd, where the watch's hooks are traced; inductor's C++ build would take minutes
on two cores), and one model with inductor.
"""

import pytest
import torch
from torch import nn

import workbench
from tests.instrument.test_compiled import KEY, compare, fresh_dynamo, graphs


class Residual(nn.Module):
    """Two residual blocks: each returns ``x + f(x)``, its child's output used inside it."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class SharedTwice(nn.Module):
    """One Linear and one activation object called twice a forward (call indices 0 and 1)."""

    def __init__(self):
        super().__init__()
        self.inner, self.act = nn.Linear(6, 6), nn.GELU()
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.act(self.inner(self.act(self.inner(x)))))


class Heads(nn.Module):
    """A module returning a tuple and one returning a dict holding a tuple."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x):
        return {"sum": self.a(x) + self.b(x), "pair": (self.a(x).sin(), self.b(x))}


class TupleAndDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.split = Split()
        self.heads = Heads()

    def forward(self, x):
        left, right = self.split(x)
        out = self.heads(left * right)
        return out["sum"].sum(-1) + out["pair"][0].mean(-1) * out["pair"][1].mean(-1)


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 12)

    def forward(self, x):
        return tuple(self.lin(x).chunk(2, dim=-1))


class InPlace(nn.Module):
    """In-place activations: ReLU(inplace=True) and LeakyReLU(inplace=True) return the object their
    input module returned, changed."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(inplace=True), nn.Linear(8, 8),
                                 nn.LeakyReLU(0.1, inplace=True), nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


class Norms(nn.Module):
    """BatchNorm1d in training mode (its running statistics updated in the forward) and LayerNorm."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.ln, self.head = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.LayerNorm(8), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.ln(torch.relu(self.bn(self.lin(x)))))


class Tokens(nn.Module):
    """Embedding of integer tokens, and a Dropout in eval mode (which returns its input as it is)."""

    def __init__(self):
        super().__init__()
        self.embed, self.drop, self.head = nn.Embedding(10, 6), nn.Dropout(0.5), nn.Linear(6, 2)
        self.drop.eval()  # (the model trains: the Dropout alone is in eval mode)

    def forward(self, tokens):
        return self.head(self.drop(self.embed(tokens)).mean(1))


class UsesItsOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        h = self.body(x)
        return h, self.head(h)


class OutputUsedTwice(nn.Module):
    """A block whose output its own head uses before the block returns it, read again by the caller."""

    def __init__(self):
        super().__init__()
        self.block = UsesItsOutput()

    def forward(self, x):
        h, y = self.block(x)
        return y + h.mean(-1, keepdim=True)


def floats():
    return torch.randn(8, 6)


def tokens():
    return torch.randint(0, 10, (8, 5))


ZOO = [(Residual, floats), (SharedTwice, floats), (TupleAndDict, floats), (InPlace, floats), (Norms, floats),
       (Tokens, tokens), (OutputUsedTwice, floats)]


def train(model, run, inputs, w=None, steps=2):
    """Losses of ``steps`` SGD steps of ``run`` (``model`` compiled, or not) on ``inputs``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in inputs[:steps]:
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if w is not None:
            w.step()
        losses.append(loss.detach())
    return losses


def check_against_eager(make, make_input, backend):
    torch.manual_seed(1)
    inputs = [make_input() for _ in range(2)]
    torch.manual_seed(0)
    eager = make()
    with workbench.watch(eager, histograms=False) as w:
        train(eager, eager, inputs, w)
    reference = w.to_pandas()

    fresh_dynamo()
    torch.manual_seed(0)
    bare = make()
    bare_losses = train(bare, torch.compile(bare, backend=backend), inputs)
    bare_graphs = graphs()

    fresh_dynamo()
    torch.manual_seed(0)
    watched = make()
    compiled = torch.compile(watched, backend=backend)
    with workbench.watch(compiled, histograms=False) as wc:
        assert isinstance(wc, workbench.CompiledWatch) and wc.fallback is None
        watched_losses = train(watched, compiled, inputs, wc)
    assert wc.errors == []
    assert graphs() == bare_graphs
    assert all(torch.equal(a, b) for a, b in zip(watched_losses, bare_losses))
    for (name, p), q in zip(bare.state_dict().items(), watched.state_dict().values()):
        assert torch.equal(p, q), name  # parameters and buffers (BatchNorm's running statistics)
    merged = compare(reference, wc.to_pandas())
    assert (merged._merge == "both").all(), merged[merged._merge != "both"][KEY + ["_merge"]]
    return reference


@pytest.mark.parametrize("make, make_input", ZOO, ids=[make.__name__ for make, _ in ZOO])
def test_compiled_rows_equal_the_eager_watch_s_and_outputs_the_unwatched_compiled_model_s(make, make_input):
    rows = check_against_eager(make, make_input, "aot_eager")
    assert {"activation", "grad_output", "param", "param_grad"} <= set(rows.kind)


def test_with_inductor_too():
    # (the model with in-place activations: inductor's own kernels, fused around the row op)
    check_against_eager(InPlace, floats, "inductor")
