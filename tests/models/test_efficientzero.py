"""DynamicsNetwork against LightZero's layout and a functional re-statement of its forward."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import workbench
from workbench.models.efficientzero import (
    DynamicsNetwork,
    inverse_value_transform,
    scalar_to_support,
    support_to_scalar,
    value_transform,
)

SMALL = dict(observation_shape=(3, 5, 5), action_encoding_dim=2, num_res_blocks=2, num_channels=6,
             reward_head_channels=3, fc_reward_layers=[7, 9], output_support_size=11,
             flatten_output_size_for_reward_head=3 * 5 * 5, lstm_hidden_size=8)


def _bn(prefix, n):
    return {f"{prefix}.weight": (n,), f"{prefix}.bias": (n,), f"{prefix}.running_mean": (n,),
            f"{prefix}.running_var": (n,), f"{prefix}.num_batches_tracked": ()}


def lightzero_keys(norm_type, c=4, a=2, blocks=2, head=3, hw=(5, 5), hidden=7, layers=2, support=11, lstm=8):
    """LightZero's DynamicsNetwork state_dict layout, written out by hand from its source."""
    keys = {"conv.weight": (c, c + a, 3, 3)}
    keys.update(_bn("norm_common", c) if norm_type == "BN" else
                {"norm_common.weight": (c, *hw), "norm_common.bias": (c, *hw)})
    for i in range(blocks):
        for conv in ("conv1", "conv2"):
            keys[f"resblocks.{i}.{conv}.0.weight"] = (c, c, 3, 3)
            keys.update(_bn(f"resblocks.{i}.{conv}.1", c))  # always BN inside ResBlock
    keys.update({"conv1x1_reward.weight": (head, c, 1, 1), "conv1x1_reward.bias": (head,)})
    keys.update(_bn("norm_reward", head) if norm_type == "BN" else
                {"norm_reward.weight": (head, *hw), "norm_reward.bias": (head, *hw)})
    flat = head * hw[0] * hw[1]
    keys.update({"lstm.weight_ih_l0": (4 * lstm, flat), "lstm.weight_hh_l0": (4 * lstm, lstm),
                 "lstm.bias_ih_l0": (4 * lstm,), "lstm.bias_hh_l0": (4 * lstm,)})
    keys.update(_bn("norm_value_prefix", lstm))
    size, index = lstm, 0
    for _ in range(layers):  # every hidden layer has fc_reward_layers[0] units
        keys[f"fc_reward_head.{index}.weight"] = (hidden, size)
        keys[f"fc_reward_head.{index}.bias"] = (hidden,)
        if norm_type == "BN":
            keys.update(_bn(f"fc_reward_head.{index + 1}", hidden))
        else:
            keys.update({f"fc_reward_head.{index + 1}.weight": (hidden,), f"fc_reward_head.{index + 1}.bias": (hidden,)})
        size, index = hidden, index + 3
    keys[f"fc_reward_head.{index}.weight"] = (support, hidden)
    keys[f"fc_reward_head.{index}.bias"] = (support,)
    return keys


@pytest.mark.parametrize("norm_type", ["BN", "LN"])
def test_state_dict_keys_and_shapes_are_lightzeros(norm_type):
    model = DynamicsNetwork(**SMALL, norm_type=norm_type)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == lightzero_keys(norm_type)
    assert list(got) == list(lightzero_keys(norm_type))  # same order too


def test_atari_preset_layout():
    model = workbench.create_model("efficientzero_dynamics_atari")
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == lightzero_keys("BN", c=64, a=6, blocks=1, head=16, hw=(6, 6), hidden=32, layers=1,
                                 support=601, lstm=512)
    assert model.latent_hw == (6, 6) and model.flatten_output_size_for_reward_head == 576


def _norm(sd, prefix, x, norm_type, training):
    if norm_type == "LN" and f"{prefix}.running_mean" not in sd:
        return F.layer_norm(x, sd[f"{prefix}.weight"].shape, sd[f"{prefix}.weight"], sd[f"{prefix}.bias"])
    return F.batch_norm(x, sd[f"{prefix}.running_mean"].clone(), sd[f"{prefix}.running_var"].clone(),
                        sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], training=training, eps=1e-5)


def reference_forward(sd, x, hidden, norm_type, training, a=2, blocks=2, mlp_layers=2):
    """LightZero's forward restated with torch.nn.functional and the LSTM gate equations."""
    state = x[:, :-a]
    y = F.conv2d(x, sd["conv.weight"], padding=1)
    y = _norm(sd, "norm_common", y, norm_type, training) + state
    y = F.relu(y)
    for i in range(blocks):
        r = F.relu(_norm(sd, f"resblocks.{i}.conv1.1", F.conv2d(y, sd[f"resblocks.{i}.conv1.0.weight"], padding=1),
                         "BN", training))
        r = _norm(sd, f"resblocks.{i}.conv2.1", F.conv2d(r, sd[f"resblocks.{i}.conv2.0.weight"], padding=1),
                  "BN", training)
        y = F.relu(r + y)
    latent = y
    z = F.conv2d(latent, sd["conv1x1_reward.weight"], sd["conv1x1_reward.bias"])
    z = F.relu(_norm(sd, "norm_reward", z, norm_type, training)).reshape(len(x), -1)
    h, c = hidden[0][0], hidden[1][0]
    gates = z @ sd["lstm.weight_ih_l0"].T + sd["lstm.bias_ih_l0"] + h @ sd["lstm.weight_hh_l0"].T + sd["lstm.bias_hh_l0"]
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    v = F.relu(_norm(sd, "norm_value_prefix", h, "BN", training))
    index = 0
    for _ in range(mlp_layers):
        v = F.linear(v, sd[f"fc_reward_head.{index}.weight"], sd[f"fc_reward_head.{index}.bias"])
        v = F.relu(_norm(sd, f"fc_reward_head.{index + 1}", v, norm_type, training))
        index += 3
    v = F.linear(v, sd[f"fc_reward_head.{index}.weight"], sd[f"fc_reward_head.{index}.bias"])
    return latent, (h[None], c[None]), v


@pytest.mark.parametrize("norm_type", ["BN", "LN"])
@pytest.mark.parametrize("training", [True, False])
def test_outputs_match_reference_for_a_loaded_checkpoint(norm_type, training):
    # a "foreign" checkpoint: random values for every tensor, including BN statistics
    source = DynamicsNetwork(**SMALL, norm_type=norm_type, last_linear_layer_init_zero=False)
    g = torch.Generator().manual_seed(3)
    checkpoint = {k: (torch.rand(v.shape, generator=g) + 0.5 if "running_var" in k else
                      torch.randn(v.shape, generator=g) * 0.3) if v.is_floating_point() else v
                  for k, v in source.state_dict().items()}
    model = DynamicsNetwork(**SMALL, norm_type=norm_type)
    model.load_state_dict(checkpoint, strict=True)
    model.train(training)
    x = torch.randn(4, 6, 5, 5, generator=g)
    hidden = (torch.randn(1, 4, 8, generator=g), torch.randn(1, 4, 8, generator=g))
    latent, (h, c), value_prefix = model(x.clone(), hidden)
    ref_latent, (ref_h, ref_c), ref_v = reference_forward(checkpoint, x, hidden, norm_type, training)
    for got, want in [(latent, ref_latent), (h, ref_h), (c, ref_c), (value_prefix, ref_v)]:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert value_prefix.shape == (4, 11) and latent.shape == (4, 4, 5, 5)


def test_downsample_sets_latent_size_and_layer_norm_shape():
    model = DynamicsNetwork(observation_shape=(12, 96, 96), num_channels=10, action_encoding_dim=2,
                            reward_head_channels=2, flatten_output_size_for_reward_head=2 * 6 * 6,
                            lstm_hidden_size=8, output_support_size=5, downsample=True, norm_type="LN")
    assert model.latent_hw == (6, 6) and model.norm_common.normalized_shape == (8, 6, 6)
    out = model(torch.randn(3, 10, 6, 6), model.initial_hidden_state(3))
    assert out[2].shape == (3, 5)


def test_newer_lightzero_argument_names():
    model = DynamicsNetwork(**{k: v for k, v in SMALL.items()
                               if k not in ("fc_reward_layers", "flatten_output_size_for_reward_head")},
                            reward_head_hidden_channels=[7, 9], flatten_input_size_for_reward_head=75)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == lightzero_keys("BN")
    with pytest.raises(ValueError, match="name the same setting"):
        DynamicsNetwork(**SMALL, reward_head_hidden_channels=[5])
    with pytest.raises(ValueError, match="name the same setting"):
        DynamicsNetwork(**SMALL, flatten_input_size_for_reward_head=12)


def test_activation_is_fresh_per_network_and_shared_within():
    a, b = DynamicsNetwork(**SMALL), DynamicsNetwork(**SMALL)
    assert a.activation is not b.activation
    assert isinstance(a.activation, nn.ReLU) and a.activation.inplace
    assert a.resblocks[0].act is a.activation and a.resblocks[1].conv1[2] is a.activation
    assert a.fc_reward_head[2] is a.activation
    custom = nn.Tanh()
    assert DynamicsNetwork(**SMALL, activation=custom).fc_reward_head[5] is custom


def test_last_layer_zero_init():
    model = DynamicsNetwork(**SMALL)
    assert model.fc_reward_head[-1].weight.abs().sum() == 0 and model.fc_reward_head[-1].bias.abs().sum() == 0
    assert DynamicsNetwork(**SMALL, last_linear_layer_init_zero=False).fc_reward_head[-1].weight.abs().sum() > 0


def test_weight_means_by_hand():
    model = DynamicsNetwork(**SMALL)
    sd = dict(model.named_parameters())
    dyn = [sd["conv.weight"]] + [v for k, v in sd.items() if k.startswith("resblocks.")]
    flat = torch.cat([t.detach().flatten() for t in dyn])
    assert model.get_dynamic_mean() == pytest.approx(flat.abs().mean().item(), rel=1e-6)
    reward = [sd["conv1x1_reward.weight"]] + [v for k, v in sd.items() if k.startswith("fc_reward_head.")]
    weights, mean = model.get_reward_mean()
    expected = torch.cat([t.detach().flatten() for t in reward])
    assert weights.shape == expected.shape and torch.equal(torch.from_numpy(weights), expected)
    assert mean == pytest.approx(expected.abs().mean().item(), rel=1e-6)


def test_backward_through_inplace_activation_and_residual():
    model = DynamicsNetwork(**SMALL)
    x = torch.randn(3, 6, 5, 5, requires_grad=True)
    latent, (h, c), v = model(x * 1, model.initial_hidden_state(3))
    (latent.sum() + v.sum() + h.sum()).backward()
    assert x.grad is not None and model.conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(norm_type="GN"), ValueError, r"'norm_type' must be one of \['BN', 'LN'\], got 'GN'"),
    (dict(num_channels=2), ValueError, r"num_channels \(2\) must exceed action_encoding_dim \(2\)"),
    (dict(observation_shape=5), TypeError, r"'observation_shape' expects Sequence\[int\], got 5"),
    (dict(observation_shape=[4, 5]), ValueError, r"observation_shape must be a sequence of three positive ints"),
    (dict(fc_reward_layers=[]), ValueError, "fc_reward_layers must be a non-empty list"),
    (dict(fc_reward_layers=[0]), ValueError, "fc_reward_layers must be a non-empty list of positive ints"),
    # the signature's Annotated ranges and types hold for a direct construction too, not only create_model's
    (dict(num_res_blocks=65), ValueError, r"'num_res_blocks' must lie in \[0, 64\], got 65"),
    (dict(lstm_hidden_size=0), ValueError, r"'lstm_hidden_size' must lie in \[1, inf\], got 0"),
    (dict(action_encoding_dim=True), TypeError, r"'action_encoding_dim' expects int, got True"),
    (dict(downsample="yes"), TypeError, r"'downsample' expects bool, got 'yes'"),
    (dict(flatten_input_size_for_reward_head=0), ValueError,
     r"'flatten_input_size_for_reward_head' must lie in \[1, inf\], got 0"),
])
def test_bad_config_errors(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        DynamicsNetwork(**{**SMALL, **kwargs})


def test_bad_input_errors():
    model = DynamicsNetwork(**SMALL)
    hidden = model.initial_hidden_state(2)
    with pytest.raises(ValueError, match=r"expects 6 input channels \(4 latent \+ 2 action planes\), got 5"):
        model(torch.randn(2, 5, 5, 5), hidden)
    with pytest.raises(ValueError, match=r"of shape \(B, 6, H, W\), got \(2, 6, 5\)"):
        model(torch.randn(2, 6, 5), hidden)
    with pytest.raises(ValueError, match=r"3 x 4 x 4 = 48.*flatten_output_size_for_reward_head=48"):
        model(torch.randn(2, 6, 4, 4), hidden)
    with pytest.raises(ValueError, match=r"each of shape \(1, 2, 8\), got \[\(1, 3, 8\), \(1, 3, 8\)\]"):
        model(torch.randn(2, 6, 5, 5), model.initial_hidden_state(3))
    with pytest.raises(TypeError, match="floating-point"):
        model(torch.zeros(2, 6, 5, 5, dtype=torch.long), hidden)


def test_encode_actions_one_hot_planes():
    model = DynamicsNetwork(**SMALL)
    latent = torch.randn(3, 4, 5, 5)
    x = model.encode_actions(latent, torch.tensor([0, 1, 1]))
    assert torch.equal(x[:, :4], latent)
    assert x[0, 4].eq(1).all() and x[0, 5].eq(0).all() and x[2, 5].eq(1).all()
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 2\)"):
        model.encode_actions(latent, torch.tensor([0, 2, 1]))


# --- support transforms --------------------------------------------------------

def test_value_transform_closed_form_and_inverse():
    x = torch.tensor([-15.0, -3.0, 0.0, 3.0, 8.0], dtype=torch.float64)
    expected = [-(4 - 1) - 0.015, -(2 - 1) - 0.003, 0.0, 1.003, (3 - 1) + 0.008]
    torch.testing.assert_close(value_transform(x), torch.tensor(expected, dtype=torch.float64))
    wide = torch.linspace(-1000, 1000, 2001, dtype=torch.float64)
    torch.testing.assert_close(inverse_value_transform(value_transform(wide)), wide, rtol=1e-9, atol=1e-9)


def test_two_hot_by_hand():
    probs = scalar_to_support(torch.tensor([1.25, -2.0, 7.0]), 7, transform=False)  # atoms -3..3
    torch.testing.assert_close(probs[0], torch.tensor([0, 0, 0, 0, 0.75, 0.25, 0]))
    torch.testing.assert_close(probs[1], torch.tensor([0, 1.0, 0, 0, 0, 0, 0]))
    torch.testing.assert_close(probs[2], torch.tensor([0, 0, 0, 0, 0, 0, 1.0]))  # clamped to the top atom


def test_support_round_trip_across_the_range():
    size = 601
    top = inverse_value_transform(torch.tensor(300.0, dtype=torch.float64)).item()
    x = torch.linspace(-top, top, 5001, dtype=torch.float64)
    probs = scalar_to_support(x, size)
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(x))
    assert (probs > 0).sum(-1).max() <= 2
    torch.testing.assert_close(support_to_scalar(probs.log()), x, rtol=1e-6, atol=1e-6)


def test_support_size_must_be_odd():
    with pytest.raises(ValueError, match="odd int >= 3"):
        scalar_to_support(torch.zeros(2), 600)
