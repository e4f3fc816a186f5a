"""ILQL: AgileRL's interface, each loss term against hand-computed values, targets, checkpoints, decoding."""

import inspect
import pickle

import pytest
import torch
import torch.nn.functional as F

import workbench
from workbench.models import gpt, ilql
from workbench.models.ilql import GPT2_CONFIG, HYPERPARAMETERS, TINY_CONFIG, CheckpointError, ILQL, check_net_config
from workbench.models.toy_language import ToyLanguageDataset


@pytest.fixture(scope="module")
def dataset():
    return ToyLanguageDataset(size=256, seed=3)


def agent(dataset, **kwargs):
    config = {**TINY_CONFIG, "n_embd": 32, "n_head": 2, "dim_feedfwd": 64, **kwargs.pop("net", {})}
    torch.manual_seed(0)
    return ILQL(dataset, config, lr=1e-3, **kwargs)


def batch_of(dataset, n=8, seed=0):
    return dataset.sample(n, torch.Generator().manual_seed(seed))


def run(model, b, **kwargs):
    return model(b["tokens"], b["state_idxs"], b["action_idxs"], b["attn_mask"], **kwargs)


# --- interface -------------------------------------------------------------------------

def test_constructor_and_forward_have_agilerls_signatures():
    params = inspect.signature(ILQL).parameters
    expected = dict(net_config=None, index=0, batch_size=64, lr=1e-5, alpha=0.005, beta=0.0, gamma=0.99, tau=0.6,
                    mutation=None, transition_weight=0.0, clip_weight=None, value_max=None, value_min=None,
                    detach_v=False, detach_q=False, detach_pi=False, double_q=True, per_token=True,
                    exp_weights=True, dm_margin=0.0, cql_temp=1.0, weight_decay=0.0, device="cpu")
    assert list(params)[0] == "dataset"
    assert {k: params[k].default for k in expected} == expected
    assert list(inspect.signature(ILQL.forward).parameters)[1:] == [
        "tokens", "state_idxs", "action_idxs", "attn_mask", "prefix_embs", "prefix_attn_mask",
        "remove_prefix_position_embs", "qv_kwargs", "policy_kwargs", "target_kwargs", "skip_policy_on_train",
        "detach_full_policy"]
    for name, args in {"get_downstream_rs": ["rs", "gamma"],
                       "get_weights": ["tokens", "vs", "qs", "state_idxs", "action_idxs", "terminals"],
                       "awac_loss": ["tokens", "attn_mask", "logits", "w"],
                       "get_v_loss": ["vs", "target_qs", "terminals"],
                       "get_q_loss": ["vns", "qs", "rs", "gamma", "terminals"],
                       "get_cql_loss": ["qs", "action_tokens", "terminals"],
                       "get_dm_loss": ["qs", "data_qs", "terminals", "margin"]}.items():
        assert list(inspect.signature(getattr(ILQL, name)).parameters)[1:] == args, name
    assert check_net_config(GPT2_CONFIG) == GPT2_CONFIG  # the seed's GPT-2 default is valid


def test_hyperparameters_are_the_constructors_arguments_after_dataset_and_net_config(dataset):
    names = list(inspect.signature(ILQL).parameters)
    assert names[:2] == ["dataset", "net_config"] and HYPERPARAMETERS == tuple(names[2:])
    # each argument reaches its own attribute: every value differs from its default and from the others
    given = dict(index=3, batch_size=7, lr=2e-3, alpha=0.1, beta=0.5, gamma=0.8, tau=0.3, mutation="lr",
                 transition_weight=0.2, clip_weight=4.0, value_max=9.0, value_min=-9.0, detach_v=True, detach_q=True,
                 detach_pi=True, double_q=False, per_token=True, exp_weights=False, dm_margin=0.25, cql_temp=2.0,
                 weight_decay=0.01, device="cpu")
    assert list(given) == list(HYPERPARAMETERS)
    model = ILQL(dataset, {**TINY_CONFIG, "n_layer": 1, "n_embd": 16, "n_head": 2, "dim_feedfwd": 32}, **given)
    assert model.hyperparameters == given
    assert {k: getattr(model, k) for k in HYPERPARAMETERS} == given


def test_the_gpt_lives_in_its_own_module_and_ilql_still_exports_it():
    for name in gpt.__all__:
        if name in ilql.__all__:
            assert getattr(ilql, name) is getattr(gpt, name)
    assert {"GPT", "GPT2_CONFIG", "TINY_CONFIG", "check_net_config"} <= set(ilql.__all__)
    model = gpt.GPT(check_net_config(TINY_CONFIG), lm_head=True)
    assert sum(p.numel() for p in model.parameters()) == gpt.count_parameters(TINY_CONFIG, lm_head=True)


@pytest.mark.parametrize("change, message", [
    ({"n_embd": 30}, "divisible by n_head"),
    ({"activation": "swishy"}, "not a registered activation"),
    ({"arch": "lstm"}, "must be 'gpt'"),
    ({"n_layer": 9}, "min_layers..max_layers"),
    ({"n_layers": 2}, "did you mean 'n_layer'"),
    ({"dropout": 1.5}, r"dropout'\] must be in \[0, 1\)"),
    ({"layer_norm_eps": 0.0}, r"layer_norm_eps'\] must be > 0, got 0.0"),
    ({"n_layer": 0}, r"net_config: parameter 'n_layer' must lie in \[1, inf\], got 0"),
    ({"dropout": float("nan")}, r"net_config: parameter 'dropout' must be a finite number, got nan"),
])
def test_bad_net_config_is_a_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        check_net_config({**TINY_CONFIG, **change})
    with pytest.raises(ValueError, match=r"missing \['bias'\]"):
        check_net_config({k: v for k, v in TINY_CONFIG.items() if k != "bias"})


@pytest.mark.parametrize("change, message", [
    ({"n_head": True}, r"net_config: parameter 'n_head' expects int, got True \(bool\)"),
    ({"n_layer": 2.0}, r"net_config: parameter 'n_layer' expects int, got 2.0 \(float\)"),
    ({"bias": 1}, r"net_config: parameter 'bias' expects bool, got 1 \(int\)"),
    ({"dropout": "0.1"}, r"net_config: parameter 'dropout' expects float, got '0.1' \(str\)"),
])
def test_a_net_config_value_of_the_wrong_type_is_a_type_error(change, message):
    with pytest.raises(TypeError, match=message):
        check_net_config({**TINY_CONFIG, **change})


def test_activation_resolves_through_the_registry_case_insensitively(dataset):
    model = agent(dataset, net={"activation": "ReLU"})
    assert type(model.model.h[0].mlp[1]) is type(workbench.create_model("relu"))


def test_forward_outputs_and_targets(dataset):
    model = agent(dataset, value_min=-0.01, value_max=0.01)
    b = batch_of(dataset)
    with torch.no_grad():
        model.target_q[-1].bias.add_(0.5)  # the targets differ from the online heads and hit the clip
        out = run(model, b)
    B, T = b["tokens"].shape
    A, S = b["action_idxs"].shape[1], b["state_idxs"].shape[1]
    assert out["vs"].shape == (B, S) and out["target_vs"].shape == (B, S)
    q1, q2 = out["qs"]
    assert q1.shape == q2.shape == (B, A, 16) and out["logits"].shape == (B, T, 16)
    hidden, _ = model.target_model(b["tokens"], b["attn_mask"])
    h = hidden[torch.arange(B)[:, None], b["action_idxs"]]
    expected = torch.minimum(model.target_q(h), model.target_q2(h)).clamp(-0.01, 0.01)
    assert torch.allclose(out["target_qs"], expected)
    assert out["target_qs"].max() == pytest.approx(0.01)
    single = agent(dataset, double_q=False)
    assert isinstance(run(single, b)["qs"], torch.Tensor) and single.q2 is None


def test_causal_and_padding_masks(dataset):
    model = agent(dataset)
    b = batch_of(dataset, 4)
    tokens = b["tokens"].clone()
    hidden, _ = model.model(tokens, b["attn_mask"])
    later = tokens.clone()
    later[:, -1] = 5  # a future token cannot change earlier positions
    hidden2, _ = model.model(later, b["attn_mask"])
    assert torch.allclose(hidden[:, :-1], hidden2[:, :-1], atol=1e-6)
    mask = b["attn_mask"].clone()
    mask[:, 5:] = 0  # positions 5.. are padding: what they hold does not matter to positions < 5
    noisy = tokens.clone()
    noisy[:, 5:] = 7
    a, _ = model.model(tokens, mask)
    c, _ = model.model(noisy, mask)
    assert torch.allclose(a[:, :5], c[:, :5], atol=1e-6)


def test_prefix_embeddings_shift_positions_unless_removed(dataset):
    model = agent(dataset)
    b = batch_of(dataset, 2)
    prefix = torch.randn(2, 3, 32)
    with_prefix, _ = model.model(b["tokens"], prefix_embs=prefix)
    plain, _ = model.model(b["tokens"])
    assert with_prefix.shape == plain.shape and not torch.allclose(with_prefix, plain)
    masked, _ = model.model(b["tokens"], prefix_embs=prefix, prefix_attn_mask=torch.zeros(2, 3),
                            remove_prefix_position_embs=True)
    assert torch.allclose(masked, plain, atol=1e-5)  # a fully masked prefix without positions changes nothing


def test_policy_switches_and_detach_flags(dataset):
    model = agent(dataset)
    b = batch_of(dataset)
    model.train()
    assert run(model, b, skip_policy_on_train=True)["logits"] is None
    assert not run(model, b, detach_full_policy=True)["logits"].requires_grad
    detached = agent(dataset, detach_v=True)
    out = run(detached, b)
    out["vs"].sum().backward()
    assert all(p.grad is None for p in detached.model.parameters())  # V trains only its head
    assert detached.v[0].weight.grad is not None


def test_bad_batches_are_clear_errors(dataset):
    model = agent(dataset)
    b = batch_of(dataset, 4)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 16\)"):
        model(b["tokens"] + 100, b["state_idxs"], b["action_idxs"])
    with pytest.raises(ValueError, match="state_idxs must index positions 0..7"):
        model(b["tokens"], b["state_idxs"] + 50, b["action_idxs"])
    with pytest.raises(ValueError, match="batch sizes differ"):
        model(b["tokens"], b["state_idxs"][:2], b["action_idxs"])
    with pytest.raises(ValueError, match=r"tokens must be a \(B, N\) int64 tensor"):
        model(b["tokens"].float(), b["state_idxs"], b["action_idxs"])
    with pytest.raises(KeyError, match="missing \\['rewards'\\]"):
        model.get_loss({k: v for k, v in b.items() if k != "rewards"})
    with pytest.raises(ValueError, match="block_size"):
        model.model(torch.zeros(1, 65, dtype=torch.long))


# --- loss terms against hand-computed values -------------------------------------------

def test_downstream_rewards_by_hand(dataset):
    rs = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]])
    out = agent(dataset).get_downstream_rs(rs, 0.5)
    assert torch.allclose(out, torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0], [1.0, 2.0, 4.0]]))


def test_weights_by_hand(dataset):
    tokens = torch.zeros(1, 6, dtype=torch.long)
    action_idxs = torch.tensor([[2, 3, 0]])  # the third action is padding
    terminals = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    vs, qs = torch.tensor([[0.5, 1.0, 9.0]]), torch.tensor([[1.0, 0.0, 9.0]])
    model = agent(dataset, beta=2.0, transition_weight=0.1)
    w = model.get_weights(tokens, vs, qs, None, action_idxs, terminals)
    e = torch.exp(torch.tensor([2 * 0.5, 2 * -1.0]))
    assert torch.allclose(w, torch.tensor([[0.1, 0.1, e[0], e[1], 0.1, 0.1]]))
    binary = agent(dataset, beta=0.8, exp_weights=False, clip_weight=0.5)
    w = binary.get_weights(tokens, vs, qs, None, action_idxs, terminals)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 0.5, 0.2, 0.0, 0.0]]))  # 0.8 clipped to 0.5; 1 - 0.8


def test_value_q_cql_dm_and_awac_losses_by_hand(dataset):
    model = agent(dataset, tau=0.7)
    terminals = torch.tensor([[0.0, 0.0, 1.0]])  # two real actions
    vs = torch.tensor([[0.0, 0.0]])
    target = torch.tensor([[1.0, -2.0]])
    assert model.get_v_loss(vs, target, terminals).item() == pytest.approx((0.7 * 1 + 0.3 * 4) / 2)
    vns = torch.tensor([[2.0, 5.0]])
    rs = torch.tensor([[1.0, 3.0]])
    q1, q2 = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]])
    # targets: 1 + 0.5 * 2 = 2 (next state live); 3 + 0 (next state terminal)
    expected = ((2 - 0) ** 2 + (3 - 1) ** 2) / 2 + ((2 - 1) ** 2 + (3 - 1) ** 2) / 2
    assert model.get_q_loss(vns, (q1, q2), rs, 0.5, terminals).item() == pytest.approx(expected)
    full = torch.randn(1, 2, 16)
    actions = torch.tensor([[3, 7]])
    model.cql_temp = 2.0
    ce = F.cross_entropy(full[0] / 2.0, actions[0])
    assert model.get_cql_loss(full, actions, terminals).item() == pytest.approx(ce.item(), rel=1e-5)
    qs = torch.tensor([[[0.0, 2.0, 1.0], [1.0, 1.0, 1.0]]])
    data = torch.tensor([[1.0, 1.0]])
    # row 0: max(q - 1 + 0.5, 0)^2 = [0, 2.25, 0.25]; row 1: [0.25] * 3
    assert model.get_dm_loss(qs, data, terminals, 0.5).item() == pytest.approx((2.5 + 0.75) / 2)
    logits = torch.randn(1, 4, 16)
    tokens = torch.tensor([[1, 5, 6, 2]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = torch.tensor([[2.0, 0.0, 1.0, 9.0]])
    ce = F.cross_entropy(logits[0, :-1], tokens[0, 1:], reduction="none")
    assert model.awac_loss(tokens, mask, logits, w).item() == pytest.approx(((ce * w[0, :-1] * mask[0, 1:]).sum()
                                                                             / 2).item(), rel=1e-5)


def test_get_loss_terms_and_learning_step_with_polyak_targets(dataset):
    model = agent(dataset, alpha=0.25)
    b = batch_of(dataset, 16)
    loss, terms = model.get_loss(b)
    assert set(terms) == {"token_loss", "v_loss", "q_loss", "cql_loss", "dm_loss", "mean_q", "mean_v",
                          "mean_advantage"}
    weighted = terms["token_loss"] + terms["v_loss"] + terms["q_loss"] + 0.01 * terms["cql_loss"]
    assert loss.item() == pytest.approx(weighted.item(), rel=1e-6)
    target_before = [p.clone() for p in model.target_q.parameters()]
    metrics = model.learn(b)
    assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for t, before, p in zip(model.target_q.parameters(), target_before, model.q.parameters()):
        assert torch.allclose(t, 0.75 * before + 0.25 * p)
    assert all(not p.requires_grad for p in model.target_model.parameters())
    model.hardUpdate()
    assert all(torch.equal(a, b) for a, b in zip(model.model.parameters(), model.target_model.parameters()))


def test_clone_is_identical_and_independent(dataset):
    model = agent(dataset)
    b = batch_of(dataset)
    model.learn(b)
    twin = model.clone(index=7)
    assert twin.index == 7 and model.index == 0
    assert torch.equal(run(model, b)["vs"], run(twin, b)["vs"])
    assert model.optimizer.state_dict()["state"].keys() == twin.optimizer.state_dict()["state"].keys()
    twin.learn(b)
    assert not torch.equal(run(model, b)["vs"], run(twin, b)["vs"])


# --- checkpoints ---------------------------------------------------------------------------

def test_checkpoint_round_trip_restores_weights_optimizer_and_hyperparameters(dataset, tmp_path):
    model = agent(dataset, gamma=0.9, clip_weight=3.0)
    b = batch_of(dataset)
    model.learn(b)
    path = tmp_path / "agent.pt"
    model.save_checkpoint(path)
    fresh = agent(dataset, net={"n_embd": 16, "n_head": 2})  # other sizes and hyperparameters
    fresh.load_checkpoint(path)
    assert fresh.gamma == 0.9 and fresh.clip_weight == 3.0 and fresh.net_config == model.net_config
    for k, v in model.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k]), k
    # the restored optimizer continues exactly as the original would
    a, c = model.learn(b), fresh.learn(b)
    assert a == pytest.approx(c)
    assert list(tmp_path.iterdir()) == [path]  # no temporary files left behind


def test_a_crash_while_saving_leaves_the_old_checkpoint(dataset, tmp_path, monkeypatch):
    model = agent(dataset)
    path = tmp_path / "agent.pt"
    model.save_checkpoint(path)
    good = path.read_bytes()

    def half_written(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(KeyboardInterrupt):
        model.save_checkpoint(path)
    assert path.read_bytes() == good and list(tmp_path.iterdir()) == [path]


class _Exploit:
    def __reduce__(self):
        return (open, ("/tmp/workbench_pwned_by_checkpoint", "w"))


def test_corrupt_foreign_and_malicious_files_are_refused(dataset, tmp_path):
    model = agent(dataset)
    path = tmp_path / "agent.pt"
    model.save_checkpoint(path)
    data = path.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"not a readable torch checkpoint: it is damaged or truncated"):
        model.load_checkpoint(tmp_path / "truncated.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not an ILQL checkpoint"):
        model.load_checkpoint(tmp_path / "foreign.pt")
    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"format": "workbench.ILQL", "x": _Exploit()}))
    with pytest.raises(CheckpointError):
        model.load_checkpoint(tmp_path / "evil.pt")
    assert not __import__("os").path.exists("/tmp/workbench_pwned_by_checkpoint")
    with pytest.raises(FileNotFoundError):
        model.load_checkpoint(tmp_path / "missing.pt")
    assert torch.equal(model.state_dict()["v.0.weight"], agent(dataset).state_dict()["v.0.weight"])  # untouched


# --- decoding --------------------------------------------------------------------------------

def test_perturbed_decoding_follows_the_advantage(dataset):
    model = agent(dataset)
    prompts = dataset.prompts(6, torch.Generator().manual_seed(0))
    with torch.no_grad():  # make Q prefer token 9 everywhere, by a wide margin
        model.target_q[-1].bias.zero_()[9] = 50.0
        model.target_q2[-1].bias.zero_()[9] = 50.0
    out = model.generate(prompts, 3, beta=10.0, generator=torch.Generator().manual_seed(0))
    assert out.shape == (6, 6) and torch.equal(out[:, :3], prompts)
    assert (out[:, 3:] == 9).all()
    plain = model.generate(prompts, 3, beta=0.0, generator=torch.Generator().manual_seed(0))
    assert not (plain[:, 3:] == 9).all()  # without the advantage the untrained policy wanders
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompts, 3, temperature=0.0)


def test_rows_stop_at_eos_and_are_padded(dataset):
    model = agent(dataset)
    with torch.no_grad():
        model.target_q[-1].bias.zero_()[3] = 50.0  # <eos> first
        model.target_q2[-1].bias.zero_()[3] = 50.0
    out = model.generate(dataset.prompts(2), 4, beta=10.0)
    assert out.shape == (2, 4) and (out[:, 3] == 3).all()  # everyone stopped: no more steps


@pytest.mark.parametrize("activation", workbench.list_models(family="activation"))
def test_the_registry_entry_builds_with_every_registered_activation(activation):
    model = workbench.create_model("ilql", activation=activation, n_embd=16, n_head=2, dataset_size=16)
    b = model.dataset.sample(2)
    loss, _ = model.get_loss(b)
    assert torch.isfinite(loss)
    assert type(model.actor.h[0].mlp[1]) is type(workbench.create_model(activation))


def test_clone_and_checkpoint_carry_hyperparameters_changed_after_construction(dataset, tmp_path):
    model = agent(dataset)
    model.gamma, model.beta = 0.5, 1.5  # as a mutation would
    twin = model.clone()
    assert (twin.gamma, twin.beta) == (0.5, 1.5)
    model.save_checkpoint(tmp_path / "a.pt")
    fresh = agent(dataset)
    fresh.load_checkpoint(tmp_path / "a.pt")
    assert (fresh.gamma, fresh.beta) == (0.5, 1.5)
    assert set(model.hyperparameters) == set(inspect.signature(ILQL).parameters) - {"dataset", "net_config"}


def test_load_checkpoint_onto_another_device_and_the_memory_estimate(dataset, tmp_path):
    from workbench.models.ilql import _make_networks, estimate_memory
    from workbench.registry import parameter_bytes

    model = agent(dataset, device="cpu")
    model.learn(batch_of(dataset))
    model.save_checkpoint(tmp_path / "a.pt")
    state = torch.load(tmp_path / "a.pt", weights_only=True)
    state["hyperparameters"]["device"] = "cuda:7"  # saved on a GPU this machine lacks
    torch.save(state, tmp_path / "gpu.pt")
    fresh = agent(dataset)
    with pytest.raises(CheckpointError, match="device='cpu'"):
        fresh.load_checkpoint(tmp_path / "gpu.pt")
    fresh.load_checkpoint(tmp_path / "gpu.pt", device="cpu")
    assert fresh.device == "cpu" and all(torch.equal(v, model.state_dict()[k]) for k, v in fresh.state_dict().items())
    # the estimate counts every network's parameters exactly, for both head layouts and both biases
    for config in (fresh.net_config, {**fresh.net_config, "bias": False, "activation": "PReLU"}):
        for double_q in (True, False):
            with torch.device("meta"):
                nets = _make_networks(config, double_q)
            total = sum(parameter_bytes(m) for m in nets.values() if m is not None)
            trainable = sum(p.numel() * p.element_size() for name in ("model", "actor", "v", "q", "q2")
                            if nets[name] is not None for p in nets[name].parameters())
            assert estimate_memory(config, double_q) == {"networks": total, "optimizer": 2 * trainable}


def test_a_failed_load_leaves_everything_and_the_optimizer_order_survives_a_load(dataset, tmp_path):
    single = agent(dataset, double_q=False)
    single.learn(batch_of(dataset))
    single.save_checkpoint(tmp_path / "single.pt")
    double = agent(dataset)  # q2 registered: the load must register the networks in the saved order
    double.load_checkpoint(tmp_path / "single.pt")
    assert double.double_q is False and double.q2 is None
    assert [n for n, _ in double.named_children()] == ["model", "actor", "v", "q", "target_model", "target_q"]
    a, b = single.learn(batch_of(dataset, seed=1)), double.learn(batch_of(dataset, seed=1))
    assert a == pytest.approx(b)
