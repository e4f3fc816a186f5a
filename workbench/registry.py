"""The model registry: ``register_model``, ``list_models``, ``create_model``, ``get_spec``.

Like timm's and torchvision's: small builder functions (or module classes)
are decorated with ``@register_model``. Besides building, each spec knows how
to make example inputs for a batch size and a scalar objective to
back-propagate, so any registered model can be probed with one call
(:func:`probe`). Parameter metadata comes from the builder's signature
(:mod:`workbench.params`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.params import (UNCOUNTABLE, Choices, ParamInfo, check_memory, check_seed, check_value, params_of,
                              validate_overrides)
from workbench.params import memory_limit as resolve_memory_limit

__all__ = [
    "ModelSpec",
    "ProbeResult",
    "register_model",
    "unregister_model",
    "list_models",
    "list_families",
    "create_model",
    "get_spec",
    "probe",
]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
ExampleInputs = Callable[[nn.Module, int, "torch.Generator | None"], Inputs]
Objective = Callable[[nn.Module, Inputs, Any], torch.Tensor]
MemoryEstimate = Callable[..., "int | None"]

#: Held while workbench draws from torch's global generators: a model's build (parameter initialisation),
#: an experiment's setup and steps (:mod:`workbench.experiments.base`). They are process-wide, so what
#: runs on several threads (the app's sessions, a notebook's background runs) takes turns there, and an
#: experiment's numbers are those its seed gives alone. Reentrant: an experiment's setup builds its model.
GLOBAL_RNG = threading.RLock()

# While a model is being built (or estimated), the models its builder creates are part of it:
# their memory is in the outer estimate, so they are not estimated again.
_building = threading.local()


@contextlib.contextmanager
def memory_accounted():
    """Within this block (in this thread), :func:`create_model` checks no memory estimate: the caller
    has estimated what is built here and checked it against its limit (an experiment, an outer model)."""
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        yield
    finally:
        _building.depth -= 1


def memory_is_accounted() -> bool:
    """Whether a :func:`memory_accounted` block (or a model's build) encloses this call in this thread."""
    return getattr(_building, "depth", 0) > 0




def parameter_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (on any device, ``meta`` included)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the workbench knows about one registered model.

    Attributes:
        name: registry name, e.g. ``"gelu"``.
        family: group name, e.g. ``"activation"``.
        summary: one line shown in listings.
        builder: the decorated function or class; ``builder(**kwargs)`` builds.
        params: parameter metadata derived from the builder's signature.
        example_inputs: ``example_inputs(model, batch_size, generator=None)``
            returns ``(args, kwargs)`` for one forward call.
        objective: ``objective(model, inputs, outputs)`` returns a scalar to
            back-propagate, or ``None`` when the outputs are not differentiable.
        extras: family-specific attributes (an activation's ``formula`` and
            ``derivative``); also reachable as attributes of the spec.
        memory: ``memory(**kwargs)`` estimates the bytes of the parameters and
            buffers a build with these arguments allocates (None: unknown);
            ``None`` here: the model is built on the ``meta`` device to count
            them (no memory allocated); ``False``: no estimate, no check.
    """

    name: str
    family: str
    summary: str
    builder: Callable[..., nn.Module]
    params: tuple[ParamInfo, ...]
    example_inputs: ExampleInputs
    objective: Objective | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    memory: MemoryEstimate | bool | None = None

    def __getattr__(self, item: str) -> Any:
        # Only reached for names that are not fields: family extras.
        extras = object.__getattribute__(self, "extras")
        if item in extras:
            return extras[item]
        raise AttributeError(f"ModelSpec {self.name!r} has no attribute {item!r}")

    @property
    def differentiable(self) -> bool:
        """Whether the spec has an objective to back-propagate."""
        return self.objective is not None

    def defaults(self) -> dict[str, Any]:
        """The keyword arguments ``build()`` uses when given no overrides.

        Returns:
            Parameter name to default value (required parameters left out).
        """
        return {p.name: p.default for p in self.params if not p.required}

    def _arguments(self, overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The checked overrides and the builder's full keyword arguments."""
        checked = validate_overrides(self.params, overrides, f"Model {self.name!r}")
        missing = [p.name for p in self.params if p.required and p.name not in checked]
        if missing:
            raise TypeError(f"Model {self.name!r} needs a value for {', '.join(map(repr, missing))}.")
        return checked, {**self.defaults(), **checked}

    def estimate_memory(self, **overrides: Any) -> int | None:
        """Bytes of the parameters and buffers that ``build(**overrides)`` would allocate, or None if unknown.

        From the spec's own ``memory`` estimate, or else by building the model on
        the ``meta`` device (shapes only, nothing allocated) and counting.

        Args:
            **overrides: builder parameters, checked as `build` checks them.

        Returns:
            The bytes, or None when the spec has no estimate.

        Raises:
            ValueError: a value outside its choices or range.
            TypeError: an unknown parameter or a value of the wrong type.
        """
        _, arguments = self._arguments(overrides)
        return self._estimate(arguments)

    def _estimate(self, arguments: Mapping[str, Any]) -> int | None:
        if self.memory is False:
            return None
        with memory_accounted():
            if callable(self.memory):
                return self.memory(**arguments)
            try:
                with torch.device("meta"):
                    return parameter_bytes(self.builder(**arguments))
            except RuntimeError as exc:
                if "overflow" in str(exc):  # torch's "size calculation overflowed": beyond 2**63 bytes
                    return UNCOUNTABLE
                return None  # a builder that cannot run on meta (it reads values): no estimate
            except Exception:
                return None

    def build(self, *, memory_limit: Any = None, **overrides: Any) -> nn.Module:
        """Build the model; same as ``create_model(self.name, **overrides)``.

        Args:
            memory_limit: see `create_model`.
            **overrides: builder parameters.

        Returns:
            The built module.

        Raises:
            ValueError: a value outside its choices or range.
            TypeError: an unknown parameter, a missing required one or a value of the wrong type.
            workbench.params.MemoryLimitError: the estimate exceeds the limit.
        """
        checked, arguments = self._arguments(overrides)
        if not memory_is_accounted():  # a model built inside another's builder is in its estimate
            if resolve_memory_limit(memory_limit)[0] is not None:  # a bad limit is refused here too
                config = ", ".join(f"{k}={v!r}" for k, v in checked.items())
                check_memory(self._estimate(arguments), f"Model {self.name!r} ({config or 'defaults'})",
                             memory_limit)
        with memory_accounted(), GLOBAL_RNG:  # (its initialisation draws from the global generator)
            model = self.builder(**arguments)
        if not isinstance(model, nn.Module):
            raise TypeError(f"Model {self.name!r}: its builder {getattr(self.builder, '__qualname__', self.builder)!r} "
                            f"returned {type(model).__name__} ({str(model)[:60]!r}), not a torch.nn.Module. "
                            "A registered builder must return the module it builds.")
        return model


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(
    name: str | None = None,
    *,
    family: str,
    example_inputs: ExampleInputs,
    objective: Objective | None = None,
    summary: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    memory: MemoryEstimate | bool | None = None,
    **extras: Any,
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Register a builder function or ``nn.Module`` class.

    Args:
        name: registry name; the builder's ``__name__`` lower-cased if omitted.
        family: group used for filtering (``"activation"``, ``"rl"`` ...).
        example_inputs: makes ``(args, kwargs)`` for a forward call.
        objective: scalar to back-propagate, ``None`` for modules whose
            outputs are not differentiable.
        summary: one line; the first line of the builder's docstring if omitted.
        defaults: values that replace the signature's defaults (or supply
            them where it has none): one class can be registered under
            several configurations, and every model builds with defaults.
        memory: ``memory(**kwargs)`` returns the bytes of parameters and buffers
            a build with the builder's keyword arguments allocates (None:
            unknown). Omitted: :func:`create_model` builds the model on the
            ``meta`` device first to count them, which needs a builder that
            does not read tensor values; ``False``: no estimate.
        **extras: family-specific attributes stored on the spec.

    Returns:
        The decorator, which returns the builder unchanged.

    Raises:
        ValueError: the name is already registered or empty; a default outside its parameter's
            range or choices.
        TypeError: a builder, ``example_inputs``, ``objective`` or ``memory`` that is not callable,
            a family that is not a name, a default of the wrong type, or ``defaults`` naming a
            parameter the builder does not take.

    Examples:
        >>> from typing import Annotated
        >>> import torch
        >>> from workbench import Range, create_model, register_model, unregister_model
        >>> @register_model("doc_net", family="user",
        ...                 example_inputs=lambda model, batch_size, generator=None: ((torch.randn(batch_size, 3),), {}),
        ...                 objective=lambda model, inputs, out: out.pow(2).mean())
        ... def doc_net(width: Annotated[int, Range(1, 512)] = 16):
        ...     '''Two linear layers.
        ...
        ...     Args:
        ...         width: hidden units.
        ...     '''
        ...     return torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        >>> create_model("doc_net", width=8)[0]
        Linear(in_features=3, out_features=8, bias=True)
        >>> unregister_model("doc_net")
    """

    if name is not None and (not isinstance(name, str) or not name or any(c.isspace() for c in name)):
        raise ValueError(f"register_model: name must be a non-empty string without spaces, such as 'my_net', "
                         f"got {name!r}. Omit it to use the builder's name, lower-cased.")
    if not isinstance(family, str) or not family.strip():
        raise TypeError(f"register_model: family must be a non-empty string such as 'user' (list_families() has "
                        f"the others), got {family!r}.")
    for what, value, optional in (("example_inputs", example_inputs, False), ("objective", objective, True)):
        if not callable(value) and not (optional and value is None):
            raise TypeError(f"register_model: {what} must be a function, got {value!r}; see "
                            f"workbench.register_model's docstring for its arguments"
                            + (" (or None for a model without one)." if optional else "."))
    if not (memory is None or isinstance(memory, bool) or callable(memory)):
        raise TypeError(f"register_model: memory must be a function of the builder's arguments returning bytes, "
                        f"None (counted on the meta device) or False (no check), got {memory!r}.")

    def decorate(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if not callable(builder):
            raise TypeError(f"register_model decorates a builder function or an nn.Module class, got {builder!r}.")
        key = name or builder.__name__.lower()
        if key in _REGISTRY:
            raise ValueError(
                f"A model named {key!r} is already registered (family {_REGISTRY[key].family!r}). "
                "Choose another name or call workbench.unregister_model first."
            )
        _check_positional_only(key, builder)
        params = params_of(builder, defaults=defaults)
        _check_defaults(key, params, defaults or {})
        doc = (builder.__doc__ or "").strip().splitlines()
        _REGISTRY[key] = ModelSpec(
            name=key,
            family=family,
            summary=summary or (doc[0].strip() if doc else key),
            builder=builder,
            params=params,
            example_inputs=example_inputs,
            objective=objective,
            extras=dict(extras),
            memory=memory,
        )
        return builder

    return decorate


def _check_positional_only(name: str, builder: Callable[..., Any]) -> None:
    """create_model passes keyword arguments: a positional-only parameter without a default could
    never be given (every build would fail with Python's "missing 1 required positional argument")."""
    try:
        signature = inspect.signature(builder.__init__ if isinstance(builder, type) else builder)
    except (TypeError, ValueError):  # (a builtin without a signature: params_of says so)
        return
    stuck = [p.name for p in signature.parameters.values()
             if p.kind is p.POSITIONAL_ONLY and p.default is p.empty and p.name != "self"]
    if stuck:
        raise TypeError(f"register_model({name!r}): the builder's parameter(s) {stuck} are positional-only and "
                        "have no default; create_model passes keyword arguments, so they could never be given. "
                        "Make them keyword parameters (drop the '/') or give them defaults.")


def _check_defaults(name: str, params: Sequence[ParamInfo], defaults: Mapping[str, Any]) -> None:
    """Every default is a value its parameter accepts (a model must build with its defaults, and a
    form shows them): its type, its choices, its range. Choices computed when asked (``Choices``,
    such as the registered activations, which may not all be registered yet) are checked at build."""
    unknown = [k for k in defaults if k not in {p.name for p in params}]
    if unknown:
        raise TypeError(f"register_model({name!r}): defaults names {unknown}, which the builder does not take; "
                        f"its parameters are {[p.name for p in params]}.")
    for info in params:
        if info.required:
            continue
        static = info if not isinstance(info.choices, Choices) else dataclasses.replace(info, choices=None)
        try:
            check_value(static, info.default, f"register_model({name!r})")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{exc} It is the parameter's default: give it a default it accepts, or "
                            "widen its annotation.") from None


def unregister_model(name: str) -> None:
    """Remove a registered model (for tests and interactive re-registration).

    Args:
        name: a registered name.

    Raises:
        ValueError: the name is unknown (the message suggests close names).
    """
    get_spec(name)
    del _REGISTRY[name]


def list_models(pattern: str | Sequence[str] = "*", family: str | None = None) -> list[str]:
    """Sorted names of registered models.

    Args:
        pattern: an fnmatch pattern (``"*lu"``) or a list of them, matched regardless of case.
        family: keep only this family.

    Returns:
        The matching names, sorted.

    Raises:
        TypeError: a pattern or family that is not a string.
        ValueError: a family no registered model is of.

    Examples:
        >>> import workbench
        >>> workbench.list_models("*lu", family="activation")
        ['gelu', 'prelu', 'relu']
        >>> workbench.list_models(["mlp", "efficientzero_*"])
        ['efficientzero_dynamics', 'efficientzero_dynamics_atari', 'mlp']
    """
    if not isinstance(pattern, str) and not (isinstance(pattern, (list, tuple))
                                             and all(isinstance(p, str) for p in pattern)):
        raise TypeError(f"list_models: pattern must be an fnmatch pattern such as '*lu' or a list of them, "
                        f"got {pattern!r} ({type(pattern).__name__}).")
    if family is not None and not isinstance(family, str):
        raise TypeError(f"list_models: family must be a family name such as 'activation' (see list_families()) "
                        f"or None, got {family!r}.")
    if family is not None and family not in list_families():  # (an unknown family is a typo, not "no models")
        close = difflib.get_close_matches(family, list_families(), n=1, cutoff=0.6)
        raise ValueError(f"list_models: no family {family!r}" + (f"; did you mean {close[0]!r}?" if close else ".")
                         + f" The families are {list_families()}.")
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    return sorted(
        n for n, s in _REGISTRY.items()
        if (family is None or s.family == family) and any(fnmatch.fnmatchcase(n.lower(), p.lower()) for p in patterns)
    )


def list_families() -> list[str]:
    """Sorted family names of the registered models.

    Returns:
        The names, sorted.

    Examples:
        >>> import workbench
        >>> workbench.list_families()
        ['activation', 'dynamics', 'mlp', 'rl', 'storage']
    """
    return sorted({s.family for s in _REGISTRY.values()})


def get_spec(name: str) -> ModelSpec:
    """The spec of a registered model.

    Args:
        name: a name from `list_models`.

    Returns:
        Its `ModelSpec`: parameters, example inputs, objective and family extras.

    Raises:
        ValueError: the name is unknown; the message suggests close names.
        TypeError: the name is not a string.

    Examples:
        >>> import workbench
        >>> spec = workbench.get_spec("prelu")
        >>> [(p.name, p.default) for p in spec.params]
        [('num_parameters', 1), ('init', 0.25), ('device', None), ('dtype', None)]
        >>> workbench.get_spec("gelú")
        Traceback (most recent call last):
        ...
        ValueError: Unknown model 'gelú'. Did you mean 'gelu'? See workbench.list_models().
    """
    if not isinstance(name, str):
        raise TypeError(f"A model name must be a string, got {name!r} ({type(name).__name__}).")
    try:
        return _REGISTRY[name]
    except KeyError:
        close = close_names(name, list(_REGISTRY))
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"Unknown model {name!r}.{hint} See workbench.list_models().") from None


def close_names(name: str, names: Sequence[str], n: int = 3) -> list[str]:
    """The names a mistyped ``name`` most likely meant: those equal to it but for case first
    (``'MLP'`` -> ``'mlp'``), then close spellings, compared regardless of case."""
    lowered = {}
    for candidate in names:
        lowered.setdefault(candidate.lower(), candidate)
    same = [c for c in names if c.lower() == name.lower()]
    close = [lowered[c] for c in difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.6)]
    return list(dict.fromkeys(same + close))[:n]


def create_model(name: str, *, memory_limit: Any = None, **overrides: Any) -> nn.Module:
    """Build a registered model.

    Before building, the bytes of the model's parameters and buffers are
    estimated from the configuration (``get_spec(name).estimate_memory(...)``)
    and a configuration that would not fit is refused, nothing allocated.

    Args:
        name: a name from :func:`list_models`.
        memory_limit: the most bytes the model may take: an int, or a size such
            as ``'16GB'``; ``'off'`` skips the check. By default the environment
            variable ``WORKBENCH_MEMORY_LIMIT`` (same forms), else 80 % of the
            memory available now (``MemAvailable`` of ``/proc/meminfo``).
        **overrides: builder parameters; see ``get_spec(name).params``.

    Returns:
        The built module.

    Raises:
        ValueError: unknown name, or a value outside its choices/range.
        TypeError: an unknown parameter or a value of the wrong type.
        workbench.params.MemoryLimitError: (a ValueError) the estimate exceeds the limit.

    Examples:
        >>> import workbench
        >>> workbench.create_model("prelu", num_parameters=4, init=0.1)
        PReLU(num_parameters=4)
        >>> workbench.create_model("mlp", depth=0)
        Traceback (most recent call last):
        ...
        ValueError: Model 'mlp': parameter 'depth' must lie in [1, 32], got 0.
    """
    return get_spec(name).build(memory_limit=memory_limit, **overrides)


@dataclass
class ProbeResult:
    """One forward (and backward) pass on a model's example inputs.

    Attributes:
        inputs: the ``(args, kwargs)`` used.
        outputs: what the model returned.
        loss: the objective, or ``None`` when the spec has none.
        input_grads: gradients w.r.t. floating-point positional tensor inputs
            (``None`` for the other arguments), when there was a backward pass.
    """

    inputs: Inputs
    outputs: Any
    loss: torch.Tensor | None
    input_grads: list[torch.Tensor | None]


def checked_example_inputs(spec: ModelSpec, inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What a spec's ``example_inputs`` returned, as ``(args, kwargs)``.

    Raises:
        TypeError: it is not a pair of a tuple (or list) of positional inputs and a dict of keyword inputs,
            naming what it is.
    """
    if (isinstance(inputs, (tuple, list)) and len(inputs) == 2 and isinstance(inputs[0], (tuple, list))
            and isinstance(inputs[1], dict)):
        return tuple(inputs[0]), inputs[1]
    got = _shape(inputs) if isinstance(inputs, torch.Tensor) else f"{type(inputs).__name__} {inputs!r:.80}"
    raise TypeError(f"Model {spec.name!r}: example_inputs must return (args, kwargs), a tuple of the positional "
                    f"inputs and a dict of the keyword inputs, e.g. ((x,), {{}}) for model(x); got {got}.")


def _shape(value: Any) -> str:
    """A tensor as ``Tensor(4, 3)``, anything else as its type's name."""
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}".replace(",)", ")")
    return type(value).__name__


def probe(name_or_spec: str | ModelSpec, model: nn.Module | None = None, batch_size: int = 4,
          seed: int = 0, backward: bool = True) -> ProbeResult:
    """Run a model once on its example inputs and back-propagate its objective.

    Floating-point positional inputs are made to require gradients (through a
    copy, so in-place modules still work), so models without parameters -
    activations - can be probed too.

    Args:
        name_or_spec: a registered name or spec.
        model: the model to probe; built with defaults if omitted.
        batch_size: batch size of the example inputs, >= 1.
        seed: seed of the generator for the example inputs, in [0, 2**63 - 1].
        backward: whether to back-propagate the objective.

    Returns:
        A `ProbeResult`: the inputs, outputs, loss and input gradients.

    Raises:
        ValueError: an unknown name, a batch size < 1 or a seed out of range.
        TypeError: a spec or model of the wrong type, an ``example_inputs`` that does not return ``(args, kwargs)``
            or an objective that does not return a scalar tensor.
        Exception: what the model's forward raised on its example inputs, with a note naming the model and the
            inputs' shapes.

    Examples:
        >>> import workbench
        >>> result = workbench.probe("relu", batch_size=2)
        >>> result.outputs.shape == result.inputs[0][0].shape, result.input_grads[0] is not None
        (True, True)
    """
    spec = get_spec(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"probe expects a registered model's name or its ModelSpec, got {spec!r} "
                        f"({type(spec).__name__}). See workbench.list_models().")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"probe: batch_size must be an int >= 1, got {batch_size!r}. Pass e.g. batch_size=4.")
    check_seed(seed, "probe")
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"probe: model must be a torch.nn.Module built from {spec.name!r} (or None to build one "
                        f"with defaults), got {type(model).__name__}.")
    model = spec.build() if model is None else model
    generator = torch.Generator().manual_seed(seed)
    args, kwargs = checked_example_inputs(spec, spec.example_inputs(model, batch_size, generator))
    grad = backward and spec.objective is not None and torch.is_grad_enabled()
    leaves: list[torch.Tensor | None] = []
    call_args = []
    for a in args:
        if grad and isinstance(a, torch.Tensor) and a.is_floating_point():
            leaf = a.detach().requires_grad_(True)
            leaves.append(leaf)
            call_args.append(leaf.clone())  # a non-leaf, so in-place modules may write into it
        else:
            leaves.append(None)
            call_args.append(a)
    try:
        outputs = model(*call_args, **kwargs)
    except Exception as error:
        shapes = ", ".join(_shape(a) for a in args) + (f" and keyword inputs {sorted(kwargs)}" if kwargs else "")
        error.add_note(f"probe: the forward pass of model {spec.name!r} ({type(model).__name__}) failed on its "
                       f"example_inputs, of shapes {shapes}: check that example_inputs makes what the model takes.")
        raise
    loss = None
    if spec.objective is not None:
        loss = spec.objective(model, (tuple(call_args), kwargs), outputs)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else repr(loss)[:80]
            raise TypeError(f"probe: the objective of model {spec.name!r} must return a scalar tensor to "
                            f"back-propagate, got {got}. Reduce it, e.g. objective=lambda model, inputs, out: "
                            f"out.pow(2).mean().")
        if grad:
            loss.backward()
    return ProbeResult((tuple(args), kwargs), outputs, loss,
                       [leaf.grad if leaf is not None else None for leaf in leaves])
