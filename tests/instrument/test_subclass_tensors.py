"""Tensor subclasses (FSDP2's DTensor shards, wrapper subclasses) are reduced by torch's kernels,
never read raw by the compiled CPU kernels, whose ``data_ptr()`` reads would be wrong or crash."""


import numpy as np
import pytest
import torch
from torch import nn

import workbench
from workbench.instrument.reduce import StepSums
from workbench.instrument.reduce_cpu import CompiledCpuReducer
from workbench.instrument.schema import finish


class Tagged(torch.Tensor):
    """A tensor subclass of the simplest kind."""


def test_the_cpu_kernels_take_plain_tensors_and_parameters_but_no_subclass():
    cpu = CompiledCpuReducer()
    assert cpu.takes(torch.randn(3)) and cpu.takes(nn.Parameter(torch.randn(3)))
    assert not cpu.takes(torch.randn(3).as_subclass(Tagged))


def test_a_subclass_tensor_gets_the_statistics_of_its_values():
    x = torch.randn(1000)
    step = StepSums(8)
    step.add(x.as_subclass(Tagged))
    step.add_many([x.as_subclass(Tagged)])
    sums, counts = step.rows()
    stats = finish(np.array([1000, 1000]), sums)
    assert stats["mean"] == pytest.approx([x.double().mean().item()] * 2, abs=1e-6)
    assert stats["std"] == pytest.approx([x.double().std().item()] * 2, rel=1e-5)
    assert counts.sum(axis=1).tolist() == [1000, 1000]


def test_a_plain_watch_records_a_fully_sharded_model(one_rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.GELU(), nn.Linear(16, 3))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
    assert all(isinstance(p, DTensor) for p in model.parameters())
    w = workbench.watch(model, histograms=True, bins=8)
    x = torch.randn(8, 4)
    model(x).square().mean().backward()
    w.step()
    rows = w.to_pandas()
    w.close()
    assert not w.errors, w.errors[0]["traceback"] if w.errors else ""
    weight = rows[(rows.kind == "param") & (rows.module == "0") & (rows.tensor == "weight")].iloc[0]
    values = model[0].weight.to_local().detach().double()
    assert (weight["numel"], weight["mean"]) == (64, pytest.approx(values.mean().item()))
    assert set(rows.kind) == {"activation", "grad_output", "param", "param_grad"}
