import torch

import workbench
from workbench.experiments.query_stream import KeyStream


def test_query_stream_indexes_every_key_consistently():
    exp = workbench.experiments.create("query_stream", seed=0, key_space=5_000, batch_size=2_000)
    metrics = [exp.step() for _ in range(6)]
    assert all(m["index_errors"] == 0 for m in metrics)
    # map size = distinct keys seen, counted from the experiment's own key ids, not from the module
    assert metrics[-1]["map_size"] == (exp.index_of_key >= 0).sum().item()
    assert sum(m["new_keys"] for m in metrics) == metrics[-1]["map_size"]
    assert metrics[0]["hit_rate"] < metrics[-1]["hit_rate"]  # popular keys come back
    assert all(m["rows"] == 2_000 and m["rows_per_s"] > 0 for m in metrics)


def test_zipf_stream_draws_follow_the_power_law():
    stream = KeyStream(1_000, 1.0, 2, 4, torch.Generator().manual_seed(0))
    _, keys = stream.sample(200_000)
    counts = torch.bincount(keys, minlength=1_000)[stream.key_of_rank]  # by popularity rank
    harmonic = sum(1 / r for r in range(1, 1_001))
    expected = 200_000 / harmonic * torch.tensor([1.0, 1 / 2, 1 / 10])
    assert torch.allclose(counts[[0, 1, 9]].double(), expected.double(), rtol=0.05)


def test_watching_the_query_stream_records_index_statistics():
    exp = workbench.experiments.create("query_stream", seed=1, key_space=1_000, batch_size=500)
    rows = exp.run(3, modules="*")
    assert len(rows) == 3
    frame = exp.watcher.to_pandas()
    assert set(frame.kind) == {"activation"}  # no parameters, no gradients
    assert {"out._index", "out._hash"} <= set(frame.tensor)
    assert list(exp.watcher.metrics()["map_size"]) == [r["map_size"] for r in rows]


def test_evaluate_looks_keys_up_without_adding_them_or_shifting_the_stream():
    # (query_stream had no evaluate(): exp.evaluate(), which the docs show for every experiment, was
    # an AttributeError)
    exp = workbench.experiments.create("query_stream", seed=2, key_space=500, batch_size=200)
    twin = workbench.experiments.create("query_stream", seed=2, key_space=500, batch_size=200)
    empty = exp.evaluate()
    assert empty == {"hit_rate": 0.0, "index_errors": 0.0, "coverage": 0.0}
    exp.run(3, progress=False)
    twin.run(3, progress=False)
    size = len(exp.model.hash_to_int)
    result = exp.evaluate(rows=1000)
    assert len(exp.model.hash_to_int) == size  # looked up, not added
    assert 0 < result["hit_rate"] < 1 and result["index_errors"] == 0 and result["coverage"] == size / 500
    assert exp.evaluate(rows=1000) == result  # the same sample by default
    timeless = lambda m: {k: v for k, v in m.items() if k != "rows_per_s"}  # noqa: E731
    assert timeless(exp.step()) == timeless(twin.step())  # and training goes on as if it had not evaluated
    run = exp.start(5)
    run.pause()
    assert exp.evaluate()["index_errors"] == 0  # between two steps of a background run, as the others
    run.resume()
    run.join()


def test_evaluate_refuses_a_bad_row_count():
    exp = workbench.experiments.create("query_stream", seed=0, key_space=100, batch_size=10)
    for rows in (0, 2.5, True):
        try:
            exp.evaluate(rows=rows)
        except ValueError as error:
            assert f"rows must be an int >= 1 (keys to look up), or None for the config's batch_size (10), " \
                   f"got {rows!r}" in str(error)
        else:
            raise AssertionError(f"evaluate(rows={rows!r}) was accepted")
