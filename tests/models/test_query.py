"""QueryModule, SipHash and HashToInt: against SipHash's reference vectors, Python's hash(),
a plain dict, and torchrl's QueryModule on the same row streams."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import workbench
from workbench.models.query import HashToInt, QueryModule, SipHash, siphash

torchrl_data = pytest.importorskip("torchrl.data", reason="torchrl is a test dependency (pip install -e .[test])")

# --- an independent, byte-at-a-time SipHash-c-d (the paper's definition) -------------
M64 = (1 << 64) - 1


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & M64


def _round(v):
    v0, v1, v2, v3 = v
    v0 = (v0 + v1) & M64; v1 = _rotl(v1, 13); v1 ^= v0; v0 = _rotl(v0, 32)  # noqa: E702
    v2 = (v2 + v3) & M64; v3 = _rotl(v3, 16); v3 ^= v2  # noqa: E702
    v0 = (v0 + v3) & M64; v3 = _rotl(v3, 21); v3 ^= v0  # noqa: E702
    v2 = (v2 + v1) & M64; v1 = _rotl(v1, 17); v1 ^= v2; v2 = _rotl(v2, 32)  # noqa: E702
    return [v0, v1, v2, v3]


def reference_siphash(key: bytes, msg: bytes, c: int = 2, d: int = 4) -> int:
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    end = len(msg) - len(msg) % 8
    blocks = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, end, 8)]
    blocks.append(((len(msg) & 0xFF) << 56) | int.from_bytes(msg[end:], "little"))
    for m in blocks:
        v[3] ^= m
        for _ in range(c):
            v = _round(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(d):
        v = _round(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def test_reference_implementation_matches_the_papers_test_vectors():
    key = bytes(range(16))
    assert reference_siphash(key, b"") == 0x726FDB47DD0E0E31
    assert reference_siphash(key, bytes(range(15))) == 0xA129CA6149BE45E5


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 15, 16, 24, 31])
@pytest.mark.parametrize("rounds", [(2, 4), (1, 3)])
def test_vectorized_siphash_equals_the_reference_for_every_row(length, rounds):
    rng = np.random.default_rng(length)
    messages = rng.integers(0, 256, (17, length), dtype=np.uint8)
    key = bytes(range(16))
    ours = siphash(messages, key, rounds)
    assert ours.tolist() == [reference_siphash(key, row.tobytes(), *rounds) for row in messages]


def _run(code: str, hashseed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, check=True,
                          capture_output=True, text=True).stdout


ROWS = """
import torch
rows = [torch.arange(-6, 6).reshape(4, 3), torch.linspace(-2, 2, 15).reshape(5, 3),
        torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(4, 2), torch.tensor([[True, False], [False, False]]),
        torch.arange(20, dtype=torch.int16).reshape(4, 5), torch.linspace(0, 3, 21).half().reshape(3, 7)]
"""


def test_sip_hash_equals_torchrls_under_pythonhashseed_0_and_is_the_same_in_every_process():
    # torchrl's SipHash is Python's hash() of each row's bytes: SipHash-1-3 under a per-process key,
    # all zeros when PYTHONHASHSEED=0. Ours must equal it there, and not move with the seed.
    code = ROWS + """
from torchrl.data import SipHash as TorchRLSipHash
from workbench.models.query import SipHash
print([TorchRLSipHash()(r).tolist() for r in rows])
print([SipHash()(r).tolist() for r in rows])
"""
    theirs_0, ours_0 = _run(code, "0").splitlines()
    theirs_1, ours_1 = _run(code, "1").splitlines()
    _, ours_random = _run(code, "random").splitlines()
    assert ours_0 == theirs_0
    assert theirs_1 != theirs_0  # torchrl's hashes move with the process's hash seed ...
    assert ours_1 == ours_random == ours_0  # ... ours do not
    namespace = {}
    exec(ROWS, namespace)
    assert str([SipHash()(r).tolist() for r in namespace["rows"]]) == ours_0


def test_equal_numbers_hash_equal_and_the_bytes_are_the_rows():
    h = SipHash()
    x = torch.tensor([[0.0, 1.0], [-0.0, 1.0], [float("nan"), 2.0], [-float("nan"), 2.0], [0.5, 1.0]])
    out = h(x)
    assert out.dtype == torch.int64 and out.shape == (5,)
    assert out[0] == out[1] and out[2] == out[3]
    assert len(set(out.tolist())) == 3
    raw = SipHash(as_tensor=False)(torch.tensor([[1, 2]], dtype=torch.int32))
    assert raw == [np.array([1, 2], dtype="<i4").tobytes()]
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.float16, torch.bfloat16):
        y = torch.tensor([[1, 0], [1, 0], [0, 1]]).to(dtype)
        out = h(y)
        assert out[0] == out[1] != out[2], dtype
    assert h(torch.tensor([3, 4, 3]))[0] == h(torch.tensor([3, 4, 3]))[2]  # (B,) keys: one element per row
    keyed = SipHash(key=bytes(range(16)), rounds=(2, 4))(torch.tensor([[5]]))
    assert keyed.item() % (1 << 64) == reference_siphash(bytes(range(16)), np.array([5], "<i8").tobytes())


def test_sip_hash_rejects_what_it_cannot_hash():
    with pytest.raises(TypeError, match="complex64.*Convert it first"):
        SipHash()(torch.zeros(3, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="0-dimensional"):
        SipHash()(torch.tensor(3.0))
    with pytest.raises(ValueError, match="16 bytes"):
        SipHash(key=b"short")
    with pytest.raises(ValueError, match="rounds"):
        SipHash(rounds=(0, 3))


# --- HashToInt -------------------------------------------------------------------------

def dict_indices(stream, extend=True):
    """What torchrl's HashToInt computes, row by row with a dict."""
    table, out = {}, []
    for batch in stream:
        if extend:
            out.append([table.setdefault(h, len(table)) for h in batch.tolist()])
        else:
            out.append([table.get(h, len(table)) for h in batch.tolist()])
    return out


def test_hash_to_int_matches_a_dict_in_first_seen_order_over_many_collisions():
    rng = np.random.default_rng(0)
    universe = rng.integers(-2**63, 2**63 - 1, 30_000, dtype=np.int64)
    universe[:3] = [0, -1, 2**63 - 1]
    stream = [torch.from_numpy(universe[rng.zipf(1.3, 5_000) % len(universe)]) for _ in range(8)]
    h2i = HashToInt()
    ours = [h2i(b, extend=True).tolist() for b in stream]
    assert ours == dict_indices(stream)
    assert len(h2i) == len({h for b in stream for h in b.tolist()})
    # a map grown past several table rebuilds still answers every hash it holds
    assert torch.equal(h2i(h2i.keys), torch.arange(len(h2i)))


def test_hash_to_int_without_extend_gives_unseen_hashes_the_size_and_keeps_the_map():
    h2i = HashToInt()
    h2i(torch.tensor([10, 20, 10]), extend=True)
    out = h2i(torch.tensor([[20, 30], [40, 10]]))  # extend defaults to False, as torchrl's
    assert out.tolist() == [[1, 2], [2, 0]] and out.shape == (2, 2)
    assert len(h2i) == 2
    assert h2i(torch.tensor([7], dtype=torch.int32), extend=True).dtype == torch.int32
    with pytest.raises(TypeError, match="integer tensor of hashes"):
        h2i(torch.tensor([1.0]))


def test_hash_to_int_state_dict_round_trip_and_bad_state():
    h2i = HashToInt()
    h2i(torch.tensor([5, -3, 5, 99]), extend=True)
    state = h2i.state_dict()
    assert state["keys"].tolist() == [5, -3, 99] and state["values"].tolist() == [0, 1, 2]
    fresh = HashToInt()
    fresh.load_state_dict(state)
    assert fresh(torch.tensor([99, 5, 7]), extend=True).tolist() == [2, 0, 3]
    with pytest.raises(RuntimeError, match="twice"):
        HashToInt().load_state_dict({"keys": torch.tensor([1, 1]), "values": torch.tensor([0, 1])})
    with pytest.raises(RuntimeError, match="indices 0..1"):
        HashToInt().load_state_dict({"keys": torch.tensor([1, 2]), "values": torch.tensor([0, 5])})
    with pytest.raises(RuntimeError, match="Missing key"):
        HashToInt().load_state_dict({"keys": torch.tensor([1])})


# --- QueryModule against torchrl -------------------------------------------------------

def row_stream(seed, batches=6, rows=300):
    """Batches of (obs, action) rows drawn from a small key space, so rows repeat within and across batches."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(40, 3, generator=g)
    out = []
    for _ in range(batches):
        ids = torch.randint(0, 40 * 5, (rows,), generator=g)
        out.append({"obs": table[ids // 5], "action": ids % 5, "other": torch.randn(rows)})
    return out


@pytest.mark.parametrize("in_keys", [["obs"], ["obs", "action"]])
def test_indices_equal_torchrls_on_the_same_row_streams(in_keys):
    ours, theirs = QueryModule(in_keys), torchrl_data.QueryModule(in_keys)
    for i, batch in enumerate(row_stream(1)):
        extend = i != 3  # one batch only looks up
        a = ours(TensorDict(dict(batch), batch_size=[300]), extend=extend)["_index"]
        b = theirs(TensorDict(dict(batch), batch_size=[300]), extend=extend)["_index"]
        assert a.dtype == torch.int64 and torch.equal(a, b), i
    assert len(ours.hash_to_int) == len(theirs.hash_to_int._index_to_index)


def test_torchrl_style_hash_modules_and_aggregator_give_torchrls_hashes():
    # per-key hashes then the aggregator, exactly torchrl's structure, under PYTHONHASHSEED=0
    code = """
import torch
from tensordict import TensorDict
from torchrl.data import QueryModule as TQ, SipHash as TS
from workbench.models.query import QueryModule, SipHash
td = lambda: TensorDict({"a": torch.tensor([[1.0], [1.0], [2.0]]), "b": torch.tensor([[3], [3], [3]])}, [3])
print(TQ(["a", "b"], hash_module=TS())(td())["_hash"].tolist())
print(QueryModule(["a", "b"], hash_module=SipHash())(td())["_hash"].tolist())
"""
    theirs, ours = _run(code, "0").splitlines()
    assert ours == theirs


def test_the_seed_documents_example():
    query_module = QueryModule(in_keys=["key1", "key2"], index_key="index", hash_module=SipHash())
    query = TensorDict({"key1": torch.Tensor([[1], [1], [1], [2]]), "key2": torch.Tensor([[3], [3], [2], [3]]),
                        "other": torch.randn(4)}, batch_size=(4,))
    res = query_module(query)
    assert res["index"][0] == res["index"][1]
    assert res["index"][1] != res["index"][2] and res["index"][2] != res["index"][3]


def test_plain_dicts_nested_keys_clone_and_write_hash():
    q = QueryModule([("obs", "pixels"), "action"], index_key=("out", "index"), clone=True)
    data = {"obs": {"pixels": torch.tensor([[1, 2], [1, 2], [3, 4]])}, "action": torch.tensor([0, 0, 0])}
    out = q(data)
    assert out["out"]["index"].tolist() == [0, 0, 1] and out["_hash"].shape == (3,)
    assert "out" not in data and "_hash" not in data  # clone=True left the input alone
    same = q(data, clone=False, write_hash=False)
    assert same is data and data["out"]["index"].tolist() == [0, 0, 1] and "_hash" not in data
    td = TensorDict({"obs": {"pixels": torch.tensor([[3, 4]])}, "action": torch.tensor([0])}, batch_size=[1])
    assert q(td)[("out", "index")].tolist() == [1]
    # different shapes or dtypes of the same numbers are different rows
    a = QueryModule(["x", "y"])
    i = a({"x": torch.tensor([[1, 2]]), "y": torch.tensor([[3]])})["_index"]
    j = a({"x": torch.tensor([[1]]), "y": torch.tensor([[2, 3]])})["_index"]
    k = a({"x": torch.tensor([[1.0, 2.0]]), "y": torch.tensor([[3]])})["_index"]
    assert len({i.item(), j.item(), k.item()}) == 3


def test_bad_input_is_a_clear_error_and_leaves_the_map_alone():
    q = QueryModule(["obs", "action"])
    q({"obs": torch.zeros(2, 3), "action": torch.tensor([0, 1])})
    before = q.state_dict()
    with pytest.raises(KeyError, match="'action' is missing.*'obs'"):
        q({"obs": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="different numbers of rows.*'obs': 2, 'action': 3"):
        q({"obs": torch.ones(2, 3), "action": torch.tensor([0, 1, 2])})
    with pytest.raises(TypeError, match="'action' has dtype torch.complex64"):
        q({"obs": torch.ones(2, 3), "action": torch.ones(2, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="TensorDict or a dict"):
        q(torch.ones(2, 3))
    assert all(torch.equal(before[k], v) for k, v in q.state_dict().items())
    with pytest.raises(ValueError, match="cannot be empty"):
        QueryModule([])
    with pytest.raises(ValueError, match="2 hash modules for 3 in_keys"):
        QueryModule(["a", "b", "c"], hash_module=[SipHash(), SipHash()])
    with pytest.raises(TypeError, match="must be callable"):
        QueryModule(["a", "b"], hash_module=[SipHash(), 3])
    with pytest.warns(UserWarning, match="only one in_key"):
        QueryModule(["a"], aggregator=SipHash())


@pytest.mark.parametrize("arguments, says", [
    (dict(index_key=""), "index_key '' is an empty name. Name the key, e.g. index_key='_index'."),
    (dict(hash_key=""), "hash_key '' is an empty name. Name the key, e.g. hash_key='_hash'."),
    (dict(in_keys=["observation", ""]), "in_key '' is an empty name"),
    (dict(index_key=("out", "")), "index_key ('out', '') has an empty name in it"),
    (dict(index_key="_hash"), "index_key '_hash' and hash_key '_hash' are the same key: the hash would overwrite "
                              "the index. Give them separate keys, e.g. index_key='_index', hash_key='_hash'"),
    (dict(index_key="h", hash_key="h"), "index_key 'h' and hash_key 'h' are the same key"),
    (dict(index_key="out", hash_key=("out", "hash")), "index_key 'out' and hash_key ('out', 'hash') are nested one "
                                                      "in the other"),
    (dict(index_key="observation"), "index_key 'observation' is also an in_key: writing the index would overwrite "
                                    "that input. Choose an output key apart from the in_keys, e.g. index_key='_index'"),
    (dict(hash_key="action"), "hash_key 'action' is also an in_key: writing the hash would overwrite that input"),
    (dict(hash_key=("action",)), "hash_key ('action',) is also an in_key"),  # (the same key in a TensorDict)
    (dict(in_keys=[("obs", "pixels")], index_key="obs"), "index_key 'obs' holds in_key ('obs', 'pixels')"),
    (dict(index_key=("observation", "i")), "index_key ('observation', 'i') lies inside in_key 'observation'"),
    (dict(in_keys=["_index"]), "index_key '_index' is also an in_key: writing the index would overwrite that input. "
                               "Choose an output key apart from the in_keys, e.g. index_key='_index_out'"),
])
def test_keys_that_would_lose_an_output_or_overwrite_an_input_are_refused(arguments, says):
    arguments = dict(in_keys=["observation", "action"]) | arguments
    with pytest.raises(ValueError) as info:
        QueryModule(**arguments)
    assert says in str(info.value)


def test_separate_output_keys_beside_nested_inputs_still_build_and_keep_every_key():
    q = QueryModule([("obs", "pixels"), "action"], index_key=("obs", "index"), hash_key="obs_hash")
    data = {"obs": {"pixels": torch.tensor([[1, 2], [1, 2]])}, "action": torch.tensor([0, 0])}
    out = q(data)
    assert out["obs"]["index"].tolist() == [0, 0] and out["obs"]["pixels"].tolist() == [[1, 2], [1, 2]]
    assert out["obs_hash"].shape == (2,) and out["action"].tolist() == [0, 0]


def test_state_dict_round_trips_into_a_fresh_process(tmp_path):
    q = QueryModule(["obs", "action"])
    batches = row_stream(2, batches=3)
    seen = [q(dict(b))["_index"] for b in batches]
    torch.save(q.state_dict(), tmp_path / "map.pt")
    torch.save(batches, tmp_path / "batches.pt")
    code = f"""
import torch
from workbench.models.query import QueryModule
q = QueryModule(["obs", "action"])
q.load_state_dict(torch.load({str(tmp_path / "map.pt")!r}, weights_only=True))
batches = torch.load({str(tmp_path / "batches.pt")!r}, weights_only=True)
print([q(b, extend=False)["_index"].tolist() for b in batches])
"""
    assert _run(code, "random").strip() == str([s.tolist() for s in seen])


def test_registered_as_storage_without_parameters():
    spec = workbench.get_spec("query_module")
    assert spec.family == "storage" and not spec.differentiable
    model = workbench.create_model("query_module")
    assert list(model.parameters()) == []
    with workbench.watch(model) as w:
        (data,), _ = spec.example_inputs(model, 6, torch.Generator().manual_seed(0))
        model(data)
        w.step()
    frame = w.to_pandas()
    assert not w.errors
    index_rows = frame[(frame.module == "") & (frame.tensor == "out._index")]
    assert len(index_rows) == 1 and index_rows["max"].iloc[0] == len(model.hash_to_int) - 1


@pytest.mark.parametrize("in_keys", [["obs"], ["obs", "action"]])
def test_a_batch_of_no_rows_gives_no_indices_as_torchrls_does(in_keys):
    ours, theirs = QueryModule(in_keys), torchrl_data.QueryModule(in_keys)
    empty = {"obs": torch.zeros(0, 3), "action": torch.zeros(0, dtype=torch.long)}
    for module in (ours, theirs):
        module(TensorDict({"obs": torch.tensor([[1.0, 2, 3]]), "action": torch.tensor([4])}, batch_size=[1]))
    a = ours(TensorDict(dict(empty), batch_size=[0]))
    b = theirs(TensorDict(dict(empty), batch_size=[0]))
    assert a["_index"].shape == b["_index"].shape == (0,) and a["_index"].dtype == b["_index"].dtype == torch.int64
    assert a["_hash"].shape == (0,) and len(ours.hash_to_int) == 1  # the map is unchanged
    assert SipHash()(torch.zeros(0, 2, dtype=torch.bfloat16)).shape == (0,)
