"""Checkpoints from elsewhere: LightZero's EfficientZero dynamics network and AgileRL-layout ILQL agents.

Read safely, check strictly, then build::

    from workbench import checkpoints
    ckpt = checkpoints.load_checkpoint("efficientzero.pth.tar")   # size-checked, weights_only=True
    model, name = checkpoints.build_model(ckpt)                  # a DynamicsNetwork with those weights, and
                                                                 # the registered name whose inputs fit it
    checkpoints.load_weights(experiment.model, ckpt)             # or into a model you built: strict

What is accepted:

- **LightZero, dynamics network**: its ``state_dict`` (keys ``conv.weight``, ``resblocks.0.conv1.0.weight``,
  ``lstm.weight_ih_l0``, ``fc_reward_head.0.weight`` ...); LightZero's saved dict with the model's
  state under ``"model"`` (DI-engine's ``{"model": ..., "target_model": ..., "optimizer": ...}``); or the
  state of a whole EfficientZero model, whose dynamics network's keys start ``dynamics_network.``
  (taken out, the rest left). A ``module.`` (DataParallel) or ``_orig_mod.`` (torch.compile) prefix is
  taken off.
- **AgileRL-layout ILQL**: the dict :meth:`workbench.models.ilql.ILQL.save_checkpoint` writes
  (``net_config``, ``hyperparameters``, ``network``, ``optimizer`` ...).
- **Any other** ``state_dict`` (a dict of tensors): loadable into a model of the same layout
  with :func:`load_weights`.

Safety: the file's size is checked against ``max_bytes`` before a byte is read, and it is read
with ``torch.load(weights_only=True)``: tensors and plain containers only, so a pickle carrying code
is refused without running it. Every mismatch of keys and shapes is reported as a readable diff
(:class:`StateDictDiff`) before any weight is copied.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.params import validate_overrides

__all__ = ["DEFAULT_MAX_BYTES", "CheckpointError", "Checkpoint", "StateDictDiff", "read_checkpoint",
           "load_checkpoint", "state_dict_diff", "dynamics_config", "build_model", "load_weights",
           "example_outputs", "experiment_settings", "hint", "TRAINING_FORMAT", "TRAINING_VERSION",
           "write_checkpoint", "read_training_checkpoint", "check_fits", "check_optimizer_state"]

#: The largest checkpoint file read by default (256 MiB; LightZero's Atari dynamics network is ~3 MB).
DEFAULT_MAX_BYTES = 256 * 2**20

LIGHTZERO = "lightzero_dynamics"
AGILERL_ILQL = "agilerl_ilql"
STATE_DICT = "state_dict"
_ILQL_FORMAT = "workbench.ILQL"  # (workbench.models.ilql's checkpoint marker)
#: the marker of a training checkpoint (``Experiment.save``): an experiment's whole training state
TRAINING_FORMAT = "workbench.training"
#: the newest training-checkpoint version this code writes and reads
TRAINING_VERSION = 1
_PREFIXES = ("module.", "_orig_mod.")
_DYNAMICS = "dynamics_network."
# keys every LightZero DynamicsNetwork state has, whatever its config
_DYNAMICS_KEYS = ("conv.weight", "conv1x1_reward.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: too large, not a torch file, damaged, unsafe, or of another layout."""


@dataclass
class StateDictDiff:
    """How a checkpoint's state differs from a model's: keys only one side has, and shapes that differ."""

    missing: list[str] = field(default_factory=list)  # the model has them, the checkpoint not
    unexpected: list[str] = field(default_factory=list)  # the checkpoint has them, the model not
    mismatched: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (key, checkpoint's, model's)
    not_tensors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.not_tensors)

    def text(self, limit: int = 8) -> str:
        """The diff, one kind of difference per paragraph, each listing up to ``limit`` keys."""
        def listed(keys: list[str]) -> str:
            more = f", ... ({len(keys) - limit} more)" if len(keys) > limit else ""
            return ", ".join(keys[:limit]) + more

        parts = []
        if self.missing:
            parts.append(f"missing ({len(self.missing)} key(s) the model has and the checkpoint lacks): "
                         f"{listed(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected ({len(self.unexpected)} key(s) the checkpoint has and the model lacks): "
                         f"{listed(self.unexpected)}")
        if self.mismatched:
            shown = [f"{k} checkpoint {tuple(g)} vs model {tuple(w)}" for k, g, w in self.mismatched]
            parts.append(f"mis-shaped ({len(self.mismatched)}): {listed(shown)}")
        if self.not_tensors:
            parts.append(f"not tensors ({len(self.not_tensors)}): {listed(self.not_tensors)}")
        return "\n".join(parts) if parts else "keys and shapes match"


@dataclass
class Checkpoint:
    """A checkpoint read by :func:`load_checkpoint`.

    Attributes:
        kind: ``"lightzero_dynamics"``, ``"agilerl_ilql"`` or ``"state_dict"``.
        layout: how the file held it, in words.
        state_dict: the weights (for ILQL, the agent's ``network`` state).
        path: the file.
        extra: for ILQL, its ``net_config`` and ``hyperparameters``; for a whole EfficientZero
            model, ``other_keys``: how many keys of its other networks were left; for a training
            checkpoint (``Experiment.save``), ``training``: its experiment, config, seed and step.
    """

    kind: str
    layout: str
    state_dict: dict[str, torch.Tensor]
    path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(t.numel() for t in self.state_dict.values() if isinstance(t, torch.Tensor))

    def describe(self) -> str:
        """One paragraph: what was found, how many tensors and numbers, and the tensors that hold a NaN or
        an Inf (a model started from them is NaN from its first step)."""
        what = {LIGHTZERO: "LightZero EfficientZero dynamics network", AGILERL_ILQL: "AgileRL-layout ILQL agent",
                STATE_DICT: "state_dict"}[self.kind]
        text = (f"{what} ({self.layout}): {len(self.state_dict)} tensors, {self.parameters:,} numbers, "
                f"read from {self.path.name}")
        bad = [name for name, t in self.state_dict.items()
               if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:
            named = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "")
            text += (f"; {len(bad)} of them hold NaN or Inf ({named}): a model started from these weights "
                     "computes NaN from its first step")
        return text


def _size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_checkpoint(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """What a checkpoint file holds, read with ``torch.load(weights_only=True)`` on the CPU.

    Raises:
        CheckpointError: no such file, larger than ``max_bytes`` (checked before reading), or not
            a torch file / damaged / truncated, or holding Python objects other than tensors and plain
            containers (such a file is refused unread: nothing in it runs).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int (the largest file to read), got {max_bytes!r}.")
    if not isinstance(path, (str, os.PathLike)):
        held = (" (a checkpoint held in memory, such as a state_dict: save it with torch.save(state_dict, path) "
                "and pass the path)" if isinstance(path, dict) else "")
        raise TypeError(f"a checkpoint is read from a file path (str or Path), or given as the Checkpoint "
                        f"checkpoints.load_checkpoint(path) returns; got {type(path).__name__}{held}.")
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"No checkpoint file at {str(path)!r}.") from None
    except OSError as exc:
        raise CheckpointError(f"Cannot read {str(path)!r}: {exc}.") from None
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is not a file; pass a checkpoint file (.pt, .pth, .tar).")
    name = repr(path.name)
    if size > max_bytes:
        raise CheckpointError(f"{name} is {_size_text(size)}, over the limit of {_size_text(max_bytes)} for a "
                              f"checkpoint; nothing was read. Pass max_bytes={size} (or more) to read it anyway.")
    if size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes); it is not a checkpoint.")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise CheckpointError(f"Cannot read {name}: {exc}.") from None
    # torch.save writes a zip archive; torch's legacy format and a bare pickle start with PROTO (0x80, 2..5)
    if head[:4] != b"PK\x03\x04" and not (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")):
        raise CheckpointError(f"{name} is not a torch checkpoint: it is neither torch.save's zip format nor a pickle "
                              f"(it starts with bytes {head.hex(' ')}). Save one with torch.save(model.state_dict(), "
                              "path).")
    try:
        with warnings.catch_warnings():  # (torch warns of pickle protocols it was not written with)
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        message = str(exc)
        if "Weights only load failed" in message or "weights_only" in message.lower():
            found = re.search(r"GLOBAL ([\w.]+)", message)
            opcode = re.search(r"Unsupported operand (\S+)", message)
            what = (f"a pickled Python object of class {found[1]} (e.g. a whole model saved with "
                    "torch.save(model, path)), not only tensors and plain containers" if found else
                    f"pickle instructions a weights-only load does not accept (operand {opcode[1]})" if opcode else
                    "something other than tensors and plain containers")
            raise CheckpointError(
                f"{name} holds {what}; it was refused unread (torch.load(weights_only=True)) and nothing in it "
                "ran. Save the weights alone with torch.save(model.state_dict(), path).") from None
        detail = message.strip().split(". ")[0][:200] if message.strip() else type(exc).__name__
        raise CheckpointError(f"{name} is not a readable torch checkpoint: it is damaged or truncated "
                              f"({type(exc).__name__}: {detail}). Save it again with torch.save(...).") from None


def _strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the wrappers' prefixes every key shares, each taken off once, in either order
    (``module._orig_mod.``: DDP of a compiled model; ``_orig_mod.module.``: a compiled DDP model). Once: a
    wrapped model's own child may be named ``module``."""
    left = list(_PREFIXES)
    while True:
        prefix = next((p for p in left if state and all(isinstance(k, str) and k.startswith(p) for k in state)), None)
        if prefix is None:
            return state
        left.remove(prefix)
        state = {k[len(prefix):]: v for k, v in state.items()}


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(k, str) for k in value) \
        and all(isinstance(v, torch.Tensor) for v in value.values())


def _refuse_meta(state: Mapping[str, torch.Tensor], name: str) -> None:
    """A state whose tensors have no values (meta tensors, saved from a model built on the meta device) is
    refused: only their shapes were saved."""
    empty = [key for key, tensor in state.items() if tensor.device.type == "meta"]
    if empty:
        listed = ", ".join(empty[:4]) + (" ..." if len(empty) > 4 else "")
        raise CheckpointError(f"{name} holds {len(empty)} tensors without values ({listed}): meta tensors, saved "
                              "from a model on the meta device, keep shapes only. Save the weights of a model "
                              "whose parameters hold values (after to_empty() and loading or initializing them).")


def _refuse_not_dense(state: Mapping[str, torch.Tensor], name: str) -> None:
    """A state whose tensors have no values is refused (:func:`_refuse_meta`); so is one with sparse tensors,
    which a model's dense weights cannot take as they are."""
    _refuse_meta(state, name)
    sparse = [f"{key} ({tensor.layout})" for key, tensor in state.items() if tensor.layout != torch.strided]
    if sparse:
        listed = ", ".join(sparse[:4]) + (" ..." if len(sparse) > 4 else "")
        raise CheckpointError(f"{name} holds {len(sparse)} sparse tensors ({listed}); weights are read dense. "
                              "Save them dense: {key: t.to_dense() for key, t in state.items()}.")


def load_checkpoint(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> Checkpoint:
    """Read a checkpoint (see :func:`read_checkpoint`) and find its layout (see the module's docstring).

    Raises:
        CheckpointError: as :func:`read_checkpoint`; or the file holds no state_dict in a layout this
            reads (the message says what it found and what is accepted).
    """
    obj = read_checkpoint(path, max_bytes)
    path = Path(path)
    name = repr(path.name)
    if isinstance(obj, dict) and obj.get("format") == _ILQL_FORMAT:
        network = obj.get("network")
        if not _is_state_dict(network) or not isinstance(obj.get("net_config"), dict):
            raise CheckpointError(f"{name} is marked an ILQL checkpoint but its 'network' is not a dict of tensors "
                                  "or it has no 'net_config': it is damaged or incomplete.")
        _refuse_not_dense(network, name)
        return Checkpoint(AGILERL_ILQL, "ILQL.save_checkpoint's dict", dict(network), path,
                          {"net_config": obj["net_config"], "hyperparameters": obj.get("hyperparameters", {})})
    layout, state = "a state_dict", obj
    extra: dict[str, Any] = {}
    if isinstance(obj, dict) and obj.get("format") == TRAINING_FORMAT:  # (its weights, as a weights-only load takes)
        extra["training"] = {k: obj.get(k) for k in ("experiment", "config", "seed", "step")}
        layout = f"a training checkpoint of experiment {obj.get('experiment')!r} at step {obj.get('step')}"
        state = obj.get("model")
    elif isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        layout, state = "a dict with the model under 'model'", obj["model"]
    elif isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        layout, state = "a dict with the model under 'state_dict'", obj["state_dict"]
    if not _is_state_dict(state):
        found = (f"a dict with keys {list(obj)[:8]}" if isinstance(obj, dict) else type(obj).__name__)
        raise CheckpointError(
            f"{name} holds {found}, not model weights. Accepted: a state_dict (a dict of tensors), a dict with "
            "the state_dict under 'model' (as LightZero saves) or 'state_dict', or an ILQL checkpoint from "
            "ILQL.save_checkpoint().")
    state = _strip_prefixes(dict(state))
    _refuse_not_dense(state, name)
    dynamics = {k[len(_DYNAMICS):]: v for k, v in state.items() if k.startswith(_DYNAMICS)}
    if dynamics:
        extra = {**extra, "other_keys": len(state) - len(dynamics)}
        return Checkpoint(LIGHTZERO, f"{layout} of a whole EfficientZero model; its {len(dynamics)} "
                          f"dynamics_network.* keys taken out ({extra['other_keys']} others left)", dynamics, path,
                          extra)
    if all(k in state for k in _DYNAMICS_KEYS):
        return Checkpoint(LIGHTZERO, layout, state, path, extra)
    return Checkpoint(STATE_DICT, layout, state, path, extra)


def state_dict_diff(expected: Mapping[str, Any], given: Mapping[str, Any]) -> StateDictDiff:
    """Compare ``given`` (a checkpoint's state) with ``expected`` (a model's ``state_dict()``, or key ->
    shape): keys missing, keys unexpected, shapes that differ, values that are not tensors."""
    def shape(value: Any) -> tuple:
        return tuple(value.shape) if isinstance(value, torch.Tensor) else tuple(value)

    diff = StateDictDiff()
    diff.missing = [k for k in expected if k not in given]
    diff.unexpected = [k for k in given if k not in expected]
    for key, want in expected.items():
        if key not in given:
            continue
        got = given[key]
        if not isinstance(got, torch.Tensor):
            diff.not_tensors.append(key)
        elif tuple(got.shape) != shape(want):
            diff.mismatched.append((key, tuple(got.shape), shape(want)))
    return diff


def dynamics_config(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The ``DynamicsNetwork`` arguments a LightZero dynamics state was made with, read off its shapes.

    The latent's height and width are not in the weights but in the LSTM's input size
    (``reward_head_channels x H x W``); with BatchNorm they are taken square (with LayerNorm the norms'
    shapes give them).

    Raises:
        CheckpointError: a key it needs is missing, or the shapes contradict each other.
    """
    def need(key: str, dims: int) -> tuple[int, ...]:
        value = state.get(key)
        if not isinstance(value, torch.Tensor) or value.dim() != dims:
            got = "missing" if value is None else f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
                else type(value).__name__
            raise CheckpointError(f"not a LightZero DynamicsNetwork state: {key!r} should be a {dims}-d tensor, "
                                  f"is {got}.")
        return tuple(value.shape)

    latent, channels = need("conv.weight", 4)[:2]
    head = need("conv1x1_reward.weight", 4)[0]
    lstm_in = need("lstm.weight_ih_l0", 2)[1]
    lstm_hidden = need("lstm.weight_hh_l0", 2)[1]
    blocks = len({m[1] for k in state if (m := re.match(r"resblocks\.(\d+)\.", k))})
    heads = sorted({int(m[1]) for k, v in state.items()  # the Linear layers (2-d weights; norms' are 1-d)
                    if (m := re.match(r"fc_reward_head\.(\d+)\.weight$", k)) and getattr(v, "ndim", 0) == 2})
    if not heads:
        raise CheckpointError("not a LightZero DynamicsNetwork state: it has no fc_reward_head.*.weight keys.")
    support = need(f"fc_reward_head.{heads[-1]}.weight", 2)[0]
    hidden = need("fc_reward_head.0.weight", 2)[0] if len(heads) > 1 else None
    norm_type = "BN" if "norm_common.running_mean" in state else "LN"
    if norm_type == "LN":
        hw = need("norm_common.weight", 3)[1:]
    else:
        side = math.isqrt(lstm_in // head) if lstm_in % head == 0 else 0
        if side * side * head != lstm_in:
            raise CheckpointError(f"not a LightZero DynamicsNetwork state: the LSTM's input size {lstm_in} is not "
                                  f"reward_head_channels ({head}) x H x W with a square latent.")
        hw = (side, side)
    return dict(observation_shape=[latent, *hw], action_encoding_dim=channels - latent, num_res_blocks=blocks,
                num_channels=channels, reward_head_channels=head,
                fc_reward_layers=[hidden if hidden is not None else 32] * max(1, len(heads) - 1),
                output_support_size=support, flatten_output_size_for_reward_head=lstm_in,
                lstm_hidden_size=lstm_hidden, norm_type=norm_type)


def _dynamics_hint(state: Mapping[str, torch.Tensor]) -> str:
    """The efficientzero_dynamics experiment's settings that fit a LightZero state (for a message)."""
    try:
        c = dynamics_config(state)
    except CheckpointError:
        return ""
    settings = {"latent_channels": c["observation_shape"][0], "actions": c["action_encoding_dim"],
                "spatial": c["observation_shape"][1], "num_res_blocks": c["num_res_blocks"],
                "lstm_hidden_size": c["lstm_hidden_size"], "support_size": c["output_support_size"],
                "fc_reward_layers": c["fc_reward_layers"]}
    text = ", ".join(f"{k}={v}" for k, v in settings.items())
    refused = _experiment_refusal("efficientzero_dynamics", settings)
    note = (f" (beyond what the experiment builds, so it can be inspected but not trained there: "
            f"{refused.rstrip('.')})"
            if refused else "") if c["reward_head_channels"] == 8 and c["norm_type"] == "BN" else (
        f" (its reward head has {c['reward_head_channels']} channels and {c['norm_type']} norms; the experiment's has "
        "8 and BN, so it can be inspected but not trained there)")
    return f"The checkpoint's network has {text}{note}."


def experiment_settings(checkpoint: Checkpoint) -> tuple[str | None, dict[str, Any]]:
    """The built-in experiment whose model a checkpoint fits, and the config values it needs
    (``(None, {})`` when none fits: a plain state_dict, or a dynamics network whose reward head the
    experiment does not build)."""
    if checkpoint.kind == LIGHTZERO:
        try:
            c = dynamics_config(checkpoint.state_dict)
        except CheckpointError:
            return None, {}
        if c["reward_head_channels"] != 8 or c["norm_type"] != "BN" or c["observation_shape"][1] != \
                c["observation_shape"][2]:
            return None, {}
        settings = {
            "latent_channels": c["observation_shape"][0], "actions": c["action_encoding_dim"],
            "spatial": c["observation_shape"][1], "num_res_blocks": c["num_res_blocks"],
            "lstm_hidden_size": c["lstm_hidden_size"], "support_size": c["output_support_size"],
            "fc_reward_layers": c["fc_reward_layers"]}
        return ("efficientzero_dynamics", settings) if _experiment_takes("efficientzero_dynamics", settings) \
            else (None, {})
    if checkpoint.kind == AGILERL_ILQL:
        c = checkpoint.extra.get("net_config") or {}
        if not all(k in c for k in ("n_layer", "n_embd", "n_head")) or _ilql_differences(checkpoint):
            return None, {}
        return "ilql", {"n_layer": c["n_layer"], "n_embd": c["n_embd"], "n_head": c["n_head"]}
    return None, {}


def _experiment_takes(name: str, settings: dict[str, Any]) -> bool:
    """Whether the experiment's config accepts these settings (its ranges: 16 residual blocks at most,
    an odd support ...): a checkpoint beyond them fits no experiment the form could start."""
    return not _experiment_refusal(name, settings)


def _experiment_refusal(name: str, settings: dict[str, Any]) -> str:
    """Why the experiment's config refuses these settings ('' when it takes them)."""
    from workbench.experiments import get_experiment_spec

    spec = get_experiment_spec(name)
    try:
        spec.cls.estimate_memory(spec.cls.Config(**validate_overrides(spec.params, settings, f"Experiment {name!r}")))
    except (TypeError, ValueError) as exc:
        return str(exc)
    return ""


def _ilql_differences(checkpoint: Checkpoint) -> list[str]:
    """What of an ILQL checkpoint's network the ``ilql`` experiment cannot build: it sets n_layer, n_embd
    and n_head, and builds the rest as the registered model's defaults (a block_size of 64, GELU, the
    toy task's vocabulary, twin Q heads). A different activation has the same keys and shapes: it
    would load and compute another function."""
    from workbench.models.ilql import _registry_config
    from workbench.models.toy_language import ToyLanguageDataset
    from workbench.registry import get_spec

    c = checkpoint.extra.get("net_config") or {}
    d = get_spec("ilql").defaults()
    try:
        built = _registry_config(c["n_layer"], c["n_embd"], c["n_head"], d["block_size"], d["dropout"],
                                 d["activation"], ToyLanguageDataset.VOCAB_SIZE)
    except (KeyError, TypeError):
        return ["its net_config"]
    same = {"activation": lambda a, b: str(a).lower() == str(b).lower()}
    differ = [f"{key}={c[key]!r} (the experiment's: {built[key]!r})"
              for key in ("arch", "vocab_size", "block_size", "dim_feedfwd", "activation", "bias", "layer_norm_eps")
              if key in c and not same.get(key, lambda a, b: a == b)(c[key], built[key])]
    double_q = (checkpoint.extra.get("hyperparameters") or {}).get("double_q", True)
    if double_q is not d["double_q"]:
        differ.append(f"double_q={double_q!r} (the experiment's: {d['double_q']!r})")
    return differ


def _ilql_hint(checkpoint: Checkpoint) -> str:
    c = checkpoint.extra.get("net_config") or {}
    keys = [k for k in ("n_layer", "n_embd", "n_head", "block_size") if k in c]
    text = f"The checkpoint's net_config has {', '.join(f'{k}={c[k]}' for k in keys)}." if keys else ""
    differ = _ilql_differences(checkpoint) if keys else []
    if differ:
        text += (f" The ilql experiment cannot build it ({'; '.join(differ)}): build it with "
                 "checkpoints.build_model(checkpoint), or workbench.create_model('ilql', ...) with those settings.")
    return text


def hint(checkpoint: Checkpoint) -> str:
    """What settings a model needs to take ``checkpoint`` ('' when it cannot tell)."""
    if checkpoint.kind == LIGHTZERO:
        return _dynamics_hint(checkpoint.state_dict)
    if checkpoint.kind == AGILERL_ILQL:
        return _ilql_hint(checkpoint)
    return ""


def load_weights(model: nn.Module, checkpoint: Checkpoint | str | os.PathLike,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> StateDictDiff:
    """Copy a checkpoint's weights into ``model``, strictly: every key of the model and no other, each of
    the model's shape (dtypes are cast as ``load_state_dict`` does, but not complex values into real ones,
    floating-point into integers, nor integers outside the range of the model's integer or bool dtype: they
    would lose part of them; a module's ``resizable_state``, such
    as a QueryModule's key -> index map, at any length). Nothing is copied unless all match.

    Returns:
        The (empty) diff.

    Raises:
        CheckpointError: the diff, readable, with the settings the checkpoint's network has where
            they can be read off it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"load_weights needs a torch.nn.Module, got {type(model).__name__}.")
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint, max_bytes)
    expected = model.state_dict()
    diff, resizable = check_fits(model, checkpoint.state_dict, f"{checkpoint.path.name!r} ({checkpoint.describe()})",
                                 hint(checkpoint))
    # (a map's contents are checked as it loads: what loaded before it is put back if it is refused)
    before = {k: v.clone() for k, v in expected.items()} if resizable else None
    try:
        model.load_state_dict(checkpoint.state_dict, strict=True)
    except RuntimeError as exc:  # (a dtype that cannot be cast, a map whose contents are not one)
        if before is not None:
            model.load_state_dict(before, strict=True)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = " ".join(lines[1:] if len(lines) > 1 else lines)[:300]  # (not torch's "Error(s) in loading ...")
        raise CheckpointError(f"{checkpoint.path.name!r} does not load into {type(model).__name__}: "
                              f"{reason}") from None
    return diff


def check_fits(model: nn.Module, state: Mapping[str, Any], what: str, advice: str = "") -> tuple[StateDictDiff, set]:
    """That ``state`` loads into ``model`` strictly (see :func:`load_weights`), checked before anything is copied.

    Args:
        model: the model.
        state: the weights to load.
        what: names them in the message.
        advice: what to do, added to the message.

    Returns:
        The (empty) diff, and the keys of the model's ``resizable_state`` (a map's, which fits at any length).

    Raises:
        CheckpointError: the keys, shapes or dtypes that do not fit, readable.
    """
    expected = model.state_dict()
    diff = state_dict_diff(expected, state)
    # a module's state whose length is its contents' (a QueryModule's key -> index map) fits at any length
    resizable = {f"{path}.{key}" if path else key for path, module in model.named_modules()
                 for key in getattr(module, "resizable_state", ())}
    diff.mismatched = [entry for entry in diff.mismatched if entry[0] not in resizable]
    if not diff.ok:
        raise CheckpointError(f"{what} does not fit {type(model).__name__}:\n{diff.text()}\n{advice}".rstrip())
    lossy = [f"{k} ({v.dtype} into {expected[k].dtype}{_out_of_range(v, expected[k].dtype)})"
             for k, v in state.items()
             if k in expected and isinstance(v, torch.Tensor) and isinstance(expected[k], torch.Tensor)
             and ((v.is_complex() and not expected[k].is_complex())
                  or (v.is_floating_point() and not (expected[k].is_floating_point() or expected[k].is_complex()))
                  or _out_of_range(v, expected[k].dtype))]
    if lossy:  # (load_state_dict would cast them: the imaginary parts or the fractions gone, with a warning at most)
        raise CheckpointError(f"{what} holds values {type(model).__name__} cannot take without "
                              f"losing part of them: {', '.join(lossy[:4])}{' ...' if len(lossy) > 4 else ''}. "
                              "Nothing was copied. Save the weights in the model's own dtypes.")
    return diff, resizable


def _out_of_range(values: torch.Tensor, dtype: torch.dtype) -> str:
    """Where integer (or bool) ``values`` cast into an integer or bool ``dtype`` would wrap or saturate (300 into
    uint8 reads 44, 2 into bool True): their range, in words; "" where the cast keeps every value."""
    if (values.is_floating_point() or values.is_complex() or values.device.type == "meta" or values.numel() == 0
            or dtype.is_floating_point or dtype.is_complex or values.dtype == dtype):
        return ""
    low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    least, most = int(values.min()), int(values.max())
    return f": values {least} to {most}, outside {low} to {high}" if least < low or most > high else ""


def build_model(checkpoint: Checkpoint) -> tuple[nn.Module, str]:
    """The model a LightZero dynamics or ILQL checkpoint describes, built with its weights; returns it and
    the registered model name whose example inputs and objective fit it.

    Raises:
        CheckpointError: a plain state_dict of another architecture (it names no model to build:
            load it into one with :func:`load_weights`), or shapes that contradict each other.
    """
    from workbench.models.efficientzero import DynamicsNetwork
    from workbench.registry import create_model

    if checkpoint.kind == LIGHTZERO:
        config = dynamics_config(checkpoint.state_dict)
        try:
            with torch.device("meta"):
                DynamicsNetwork(**config)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{checkpoint.path.name!r}: its shapes make no DynamicsNetwork ({exc}).") from None
        model = DynamicsNetwork(**config, last_linear_layer_init_zero=False)
        load_weights(model, checkpoint)
        return model.eval(), "efficientzero_dynamics"
    if checkpoint.kind == AGILERL_ILQL:
        c = checkpoint.extra["net_config"]
        hyper = checkpoint.extra.get("hyperparameters") or {}
        try:
            model = create_model("ilql", n_layer=c["n_layer"], n_embd=c["n_embd"], n_head=c["n_head"],
                                 block_size=c["block_size"], dropout=float(c["dropout"]),
                                 activation=str(c["activation"]).lower(),
                                 double_q=bool(hyper.get("double_q", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{checkpoint.path.name!r}: its net_config builds no ILQL agent here "
                                  f"({type(exc).__name__}: {exc}).") from None
        load_weights(model, checkpoint)
        return model.eval(), "ilql"
    raise CheckpointError(f"{checkpoint.path.name!r} is a plain state_dict ({len(checkpoint.state_dict)} tensors, "
                          f"first keys {list(checkpoint.state_dict)[:4]}): not a LightZero dynamics network nor an "
                          "ILQL checkpoint, so it names no model to build. Load it into a model of its "
                          "layout with checkpoints.load_weights(model, path).")


def example_outputs(model: nn.Module, spec_name: str, batch_size: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """``(inputs, outputs)`` of ``model`` on its registered example inputs (no gradients)."""
    from workbench.registry import checked_example_inputs, get_spec

    spec = get_spec(spec_name)
    generator = torch.Generator().manual_seed(seed)
    args, kwargs = checked_example_inputs(spec, spec.example_inputs(model, batch_size, generator))
    with torch.no_grad():
        return (args, kwargs), model(*args, **kwargs)


def write_checkpoint(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` into ``path``, whole or not at all: written beside it, flushed to the disk and moved
    into place in one rename, so a crash leaves the old file or the new one, never half of one.

    Args:
        obj: what to save (tensors and plain containers, for ``torch.load(weights_only=True)`` to read).
        path: the file; its directory is made if needed.

    Returns:
        The path written.

    Raises:
        OSError: the directory cannot be made or written (the message names the path; the file there, if
            any, is as it was).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"Cannot write the checkpoint {str(path)!r}: it is a directory. Pass a file path "
                                "such as runs/mlp.pt.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # (else the message named the temporary file, not the checkpoint)
        raise type(exc)(f"Cannot write the checkpoint {str(path)!r}: {exc.strerror or exc}. Pick a directory "
                        "you can write to; nothing was written.") from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):  # (a full disk ...)
            kept = "The file there is as it was." if path.exists() else "Nothing was written."
            raise type(exc)(f"Cannot write the checkpoint {str(path)!r}: {exc.strerror or exc}. {kept}") from None
        raise
    return path


#: what a training checkpoint holds besides its marker and version, and the type of each
_TRAINING_FIELDS = {"experiment": str, "config": dict, "seed": int, "step": int, "model": dict,
                    "optimizer": (dict, type(None)), "generator": torch.Tensor, "extra": dict}


def read_training_checkpoint(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """A training checkpoint written by ``Experiment.save``, read safely (see :func:`read_checkpoint`) and its
    fields checked: ``experiment``, ``config``, ``seed``, ``step``, ``model`` (the model's ``state_dict``),
    ``optimizer`` (its ``state_dict``, None for an experiment without one), ``generator`` (the experiment's
    generator state) and ``extra`` (what else the experiment keeps, such as a map of the keys it saw).

    Args:
        path: the file ``Experiment.save`` wrote.
        max_bytes: the largest file read.

    Returns:
        The checkpoint's dict: ``format``, ``version`` and the fields above.

    Raises:
        CheckpointError: naming the path: not a file, too large, damaged or truncated, weights only (say
            how to load those), of a newer version, a field missing or of the wrong type, tensors without
            values (meta tensors) in the model's or the optimizer's state, or sparse ones in the model's, as
            :func:`load_checkpoint` refuses them in weights (the optimizer's may be sparse: SGD's momentum of
            sparse gradients is).
    """
    where = repr(str(path))
    fix = "Resume from a file written by experiment.save(path) (or the command line's --save)."
    try:
        obj = read_checkpoint(path, max_bytes)
    except CheckpointError as exc:
        reason = re.sub(r" Save [^.]*torch\.save\(.*$", "", str(exc))  # (the fix for weights; here, the one below)
        raise CheckpointError(f"Cannot resume from {where}: {reason} {fix}") from None
    if not isinstance(obj, dict) or obj.get("format") != TRAINING_FORMAT:
        if _is_state_dict(obj) or (isinstance(obj, dict) and ("model" in obj or "state_dict" in obj
                                                               or obj.get("format") == _ILQL_FORMAT)):
            raise CheckpointError(
                f"{where} holds model weights only, not a training checkpoint: it has no optimizer state, random "
                "generator or step count to resume from. Load the weights into a new experiment with "
                "checkpoints.load_weights(experiment.model, path) (the optimizer and the step count then start "
                f"fresh), or {fix[0].lower()}{fix[1:]}")
        found = f"a dict with keys {list(obj)[:8]}" if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{where} is not a training checkpoint: it holds {found}, without the "
                              f"{TRAINING_FORMAT!r} marker. {fix}")
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{where} has a version {version!r}, not an int >= 1: it is damaged. {fix}")
    if version > TRAINING_VERSION:
        raise CheckpointError(f"{where} is a training checkpoint of version {version}; this workbench reads up to "
                              f"version {TRAINING_VERSION}. Upgrade workbench to resume it.")
    for key, kind in _TRAINING_FIELDS.items():
        value = obj.get(key)
        if key not in obj or isinstance(value, bool) or not isinstance(value, kind):
            got = "missing" if key not in obj else f"a {type(value).__name__}"
            raise CheckpointError(f"{where} is a damaged training checkpoint: its {key!r} is {got}. {fix}")
    if obj["step"] < 0 or obj["generator"].dtype != torch.uint8 or obj["generator"].dim() != 1:
        raise CheckpointError(f"{where} is a damaged training checkpoint: step {obj['step']} or a generator state "
                              f"of {obj['generator'].dtype} {tuple(obj['generator'].shape)} (a 1-d uint8 tensor "
                              f"expected). {fix}")
    # (as the weights' readers refuse them: a meta tensor has no values to resume from, a sparse one in the model
    # no dense layout to load into its weights; refused here, before anything is built, with their keys. A sparse
    # tensor of the optimizer's state is its own: SGD's momentum of a parameter with sparse gradients, such as
    # nn.Embedding(sparse=True)'s, is one, and resumes as saved)
    optimizer = obj["optimizer"] or {}
    states = optimizer.get("state") if isinstance(optimizer.get("state"), dict) else {}
    weights = {**{f"model.{key}": value for key, value in obj["model"].items()}, "generator": obj["generator"]}
    moments = {f"optimizer.state.{index}.{name}": value for index, entry in states.items()
               if isinstance(entry, dict) for name, value in entry.items()}
    try:
        _refuse_meta({key: value for key, value in {**weights, **moments}.items() if isinstance(value, torch.Tensor)},
                     "it")
        _refuse_not_dense({key: value for key, value in weights.items() if isinstance(value, torch.Tensor)}, "it")
    except CheckpointError as exc:
        raise CheckpointError(f"Cannot resume from {where}: {exc} {fix}") from None
    return obj


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, what: str, advice: str = "") -> None:
    """That ``state`` is a ``state_dict`` of an optimizer like ``optimizer``: as many parameter groups, each over
    as many parameters, and each parameter's tensors (Adam's moments ...) of its shape; checked before
    ``optimizer.load_state_dict`` changes anything.

    Args:
        optimizer: the optimizer to load into.
        state: what is to load.
        what: names the state's source in the messages.
        advice: what to do, added to the messages.

    Raises:
        CheckpointError: what differs.
    """
    if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
            or not isinstance(state.get("param_groups"), list) \
            or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in state["param_groups"]):
        raise CheckpointError(f"{what}: the optimizer's state is not an optimizer's state_dict() (a dict with "
                              "'state' and 'param_groups'); it is damaged.")
    groups = [len(g["params"]) for g in optimizer.param_groups]
    given = [len(g["params"]) for g in state["param_groups"]]
    if groups != given:
        raise CheckpointError(f"{what}: the optimizer's state has parameter groups of {given} parameters; this "
                              f"experiment's {type(optimizer).__name__} has groups of {groups}. {advice}".rstrip())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in state["param_groups"] for i in g["params"]]
    for index, entry in state["state"].items():
        if index not in ids or not isinstance(entry, dict):
            raise CheckpointError(f"{what}: the optimizer's state has an entry {index!r} for no parameter. "
                                  f"{advice}".rstrip())
        param = params[ids.index(index)]
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(f"{what}: the optimizer's {name!r} of parameter {ids.index(index)} has shape "
                                      f"{tuple(value.shape)}; the parameter has {tuple(param.shape)}. "
                                      f"{advice}".rstrip())
