"""Call sites: which module call a hook is in, named as the rows name it. Pure bookkeeping on
the module tree - no torch hooks - so it is tested by calling :meth:`CallSites.enter` and
:meth:`CallSites.leave` by hand.

A call site is a module path and a call index: the ``k``-th call of the
module at that path within a step. A module object reachable under several
paths (one activation module shared by several parents) is named by the path
through which its caller called it: the modules with children keep a stack of
the call sites being executed (:meth:`CallSites.enter`), and a call is
attributed to the alias under its caller's path (:meth:`CallSites.resolve`).
Without a shared module every module has its one path and no stack is kept.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

from torch import nn

from workbench.instrument.torch_internals import member_dicts, unwrap_compiled

__all__ = ["CallSites", "ModuleSelector", "selector", "unwrap", "unwrap_parallel", "wrappers"]

ModuleSelector = str | Sequence[str] | Callable[[str], bool] | None


def unwrap_parallel(model: nn.Module) -> nn.Module:
    """The module a ``DistributedDataParallel`` (or ``DataParallel``) wraps, else ``model``: its
    paths are the ones a user knows (no ``module.`` prefix)."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def _peel(model: nn.Module) -> nn.Module:
    """The module one wrapper of ``model`` wraps (data-parallel or ``torch.compile``'s), else ``model``."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return unwrap_compiled(model)[0]


def wrappers(model: nn.Module) -> list[nn.Module]:
    """The wrappers around the model the rows are named by, outermost first: data-parallel ones
    (``DistributedDataParallel``, ``DataParallel``) and ``torch.compile``'s, in any order
    (``torch.compile(ddp)`` as well as ``DistributedDataParallel(torch.compile(model))``)."""
    found = []
    while (inner := _peel(model)) is not model:
        found.append(model)
        model = inner
    return found


def unwrap(model: nn.Module) -> tuple[nn.Module, bool]:
    """The module inside every wrapper of ``model`` (:func:`wrappers`), whose paths name the rows,
    and whether one of the wrappers was ``torch.compile``'s."""
    found = wrappers(model)
    compiled = any(unwrap_compiled(wrapper)[1] for wrapper in found)
    return (_peel(found[-1]) if found else model), compiled


def selector(spec: ModuleSelector, what: str) -> Callable[[str], bool]:
    """A predicate on module paths from a glob, a list of globs or a predicate (None: nothing).

    Raises:
        TypeError: ``spec`` is none of these; the predicate returned raises one, naming ``spec`` and the
            path, where ``spec``, a predicate, raises.
    """
    if spec is None:
        return lambda path: False
    if callable(spec):
        def checked(path: str) -> bool:
            try:
                return bool(spec(path))
            except Exception as exc:  # (the user's function: say which option it is and what it is given)
                raise TypeError(f"{what}={spec!r} raised {type(exc).__name__}: {exc}, given the module path "
                                f"{path!r}; a predicate takes one path (a str such as 'blocks.0.attn', '' for "
                                "the model itself) and returns True to select it.") from exc

        return checked
    patterns = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple, set)) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{what} must be a glob string, a list of globs or a predicate on the module path, "
                        f"got {spec!r}.")
    for pattern in patterns:
        _check_glob_syntax(what, pattern)
    return lambda path: any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _check_glob_syntax(what: str, pattern: str) -> None:
    """Refuse a malformed glob: a ``[`` set never closed by ``]`` (fnmatch would read it as a literal
    ``[`` and match nothing) or a reversed range such as ``[z-a]`` (which fnmatch matches to nothing).

    Raises:
        ValueError: naming ``what``, the pattern and what is wrong with it.
    """
    fix = "write '[[]' for a literal '[', or close the set, e.g. 'blocks.[0-3].*'"
    start = pattern.find("[")
    while start != -1:
        close = start + 1
        if close < len(pattern) and pattern[close] == "!":
            close += 1
        if close < len(pattern) and pattern[close] == "]":  # (a ']' first in a set is one of its characters)
            close += 1
        close = pattern.find("]", close)
        if close == -1:
            raise ValueError(f"{what}: the glob {pattern!r} is malformed: the '[' at position {start} opens a "
                             f"set of characters that no ']' closes; {fix}.")
        members = pattern[start + 1:close].removeprefix("!")
        for low, high in re.findall(r"(.)-(.)", members):
            if low > high:
                raise ValueError(f"{what}: the glob {pattern!r} is malformed: the range '{low}-{high}' runs "
                                 f"backwards and matches nothing; write it low to high, '{high}-{low}'.")
        start = pattern.find("[", close + 1)


def module_classes(model: nn.Module) -> dict[str, str]:
    """The qualified class name of each module of ``model`` by path (``''``: the model itself), every
    alias path of a shared module included: what a stored run keeps to say which call sites feed which
    module (e.g. a Linear layer's output an activation's input), as :func:`module_class_tree`."""
    return {path: _qualified(module) for path, module in model.named_modules(remove_duplicate=False)}


def _qualified(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def module_class_tree(model: nn.Module) -> dict[str, Any]:
    """:func:`module_classes` of ``model`` as a stored run keeps them (``module_class_tree`` in its metadata):
    ``{"classes": [qualified class names], "tree": node}``, where a module's node is the index of its class
    in ``classes``, or ``[index, {name: node of each submodule}]`` for a module with submodules (every alias
    of a shared module its own node). Each class name is stored once and each path is spelled by its parts: the
    run's metadata is read whole each time a page reads the run's status, and a model of many repeated blocks
    keeps a fraction of what ``{path: class}`` takes. Read back with :func:`module_classes_from_tree`."""
    index: dict[str, int] = {}

    def node(module: nn.Module) -> Any:
        at = index.setdefault(_qualified(module), len(index))
        children = {name: node(child) for name, child in module._modules.items() if child is not None}
        return [at, children] if children else at

    tree = node(model)
    return {"classes": list(index), "tree": tree}


def module_classes_from_tree(stored: Any) -> dict[str, str]:
    """The ``{path: qualified class name}`` of a :func:`module_class_tree` (as a stored run's metadata keeps it).

    Raises:
        ValueError: ``stored`` is not such a tree (damaged metadata).
    """
    classes = stored.get("classes") if isinstance(stored, dict) else None
    if not isinstance(classes, list) or "tree" not in stored:
        raise ValueError(f"a module class tree is {{'classes': [...], 'tree': ...}}, got {repr(stored)[:200]}.")
    found: dict[str, str] = {}
    pending = [("", stored["tree"])]
    while pending:  # (a stack, not recursion: any depth of nesting reads)
        path, node = pending.pop()
        at, children = (node[0], node[1]) if isinstance(node, list) and len(node) == 2 else (node, {})
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(classes) \
                or not isinstance(children, dict):
            raise ValueError(f"the module class tree's node at {path or '(the model)'!r} is {repr(node)[:200]}: "
                             f"expected a class index below {len(classes)}, or [index, {{name: node}}].")
        found[path] = classes[at]
        pending.extend((f"{path}.{name}" if path else name, child) for name, child in reversed(children.items()))
    return found


class CallSites:
    """The module paths of ``model``, those selected for recording, and the call site of each call.

    Args:
        model: the module whose calls are named.
        modules: which paths to record (glob, globs or predicate; the model itself is ``""``).
        exclude: paths to leave out, in the same forms.

    Raises:
        TypeError: a selector of the wrong type.
        ValueError: the selection leaves no path.
    """

    def __init__(self, model: nn.Module, modules: ModuleSelector = "*", exclude: ModuleSelector = None) -> None:
        self.model = model
        self._include, self._skip = selector(modules, "modules"), selector(exclude, "exclude")
        self.paths: list[str] = []
        self.stacked = False
        self.rebuild()
        for what, spec in (("modules", modules), ("exclude", exclude)):  # (a typo among several globs)
            self._check_globs(what, spec)
        if not self.selected:
            raise ValueError(f"modules={modules!r} (exclude={exclude!r}) selects no module of "
                             f"{type(model).__name__}; its module paths are: {self.path_list()}.")
        #: whether the call stack is kept (a module is shared when the watch starts): fixed, as
        #: the pre-hook that keeps it is put in or not once
        self.stacked = any(len(paths) > 1 for paths in self.aliases.values())
        if self.stacked:
            self.rebuild()  # (the containers)
        self._stack: list[tuple[int, str]] = []
        self.calls: dict[str, int] = defaultdict(int)  # calls of each path in this step

    def rebuild(self) -> None:
        """Index the module tree as it is now: alias paths, selection (the globs apply to new paths
        too), the containers that keep the call stack, and what :meth:`structure` compares; at the
        start, and again after :meth:`structure` changed (calls counted so far in the step are kept)."""
        # alias paths of every module object, in named_modules order
        self.aliases: dict[int, list[str]] = defaultdict(list)
        self.modules: dict[int, nn.Module] = {}
        for path, module in self.model.named_modules(remove_duplicate=False):
            self.aliases[id(module)].append(path)
            self.modules[id(module)] = module
        self.paths[:] = [p for paths in self.aliases.values() for p in paths]  # (one list: Watch.paths is it)
        self.selected = {p for p in self.paths if self._include(p) and not self._skip(p)}
        #: ids of the modules that keep the call stack: those with children, when a module is shared
        #: (a module without children finds its call site from the stack's top)
        self.containers = {id(m) for m in self.modules.values()
                           if next(m.children(), None) is not None} if self.stacked else set()
        # the path of each module with one path that keeps no stack: looked up in one step
        self._single_path = {key: paths[0] for key, paths in self.aliases.items()
                             if len(paths) == 1 and key not in self.containers}
        self._resolved: dict[tuple[str | None, int], str] = {}
        members = [d for m in self.modules.values() for d in member_dicts(m)]
        self._dicts = [d for d in members if isinstance(d, dict)]
        self._mappings = [d for d in members if not isinstance(d, dict)]  # (a TorchScript module's wrappers)
        self._all_params = list(self.model.parameters())

    def structure(self) -> tuple:
        """What the watch was attached to, cheap to compare (no walk of the module tree, once per
        recorded step): the ids of every module's parameters and children, and whether each parameter
        requires grad. It changes when a parameter or module is replaced, added or removed
        (``load_state_dict(assign=True)``, ``model.head = nn.Linear(...)``) or (un)frozen; the ids
        stay unique while :meth:`rebuild` keeps the indexed objects."""
        members = chain(chain.from_iterable(map(dict.values, self._dicts)),
                        chain.from_iterable(mapping.values() for mapping in self._mappings))
        return tuple(map(id, members)), self.requires_grad()

    def requires_grad(self) -> tuple[bool, ...]:
        """Whether each parameter indexed requires grad (the second half of :meth:`structure`)."""
        return tuple(map(_requires_grad, self._all_params))

    @property
    def needs_stack(self) -> bool:
        """Whether calls must be followed from their callers (:meth:`enter`): a module is shared."""
        return self.stacked

    def new_step(self) -> None:
        """Count calls from 0 again."""
        self._stack.clear()
        self.calls.clear()

    def enter(self, module: nn.Module) -> None:
        """``module`` starts a call (a pre-hook): a container pushes its call site."""
        if id(module) not in self.containers:
            return
        if module is self.model:
            self._stack.clear()  # a forward that raised earlier may have left entries
        parent = self._stack[-1][1] if self._stack else None
        self._stack.append((id(module), self.resolve(parent, module)))

    def leave(self, module: nn.Module) -> str | None:
        """The path of the call ``module`` has just returned from (a forward hook), or None when
        ``module`` is not of this model (or its call started before the stack was kept)."""
        key = id(module)
        path = self._single_path.get(key)
        if path is not None:
            return path
        if key not in self.modules:  # a module of another model
            return None
        if key not in self.containers:
            return self.resolve(self._stack[-1][1] if self._stack else None, module)
        if not self._stack:  # hooks put in while this module ran
            return None
        mid, path = self._stack.pop()
        while mid != key and self._stack:  # entries of children whose forward raised
            mid, path = self._stack.pop()
        return path

    def count(self, path: str) -> int:
        """The index of this call of ``path`` within the step (and count it)."""
        call = self.calls[path]
        self.calls[path] = call + 1
        return call

    def resolve(self, parent: str | None, module: nn.Module) -> str:
        """The alias path through which ``parent`` (a call-site path) called ``module``."""
        key = (parent, id(module))
        path = self._resolved.get(key)
        if path is None:
            aliases = self.aliases.get(id(module)) or [f"<{type(module).__name__}>"]
            if parent is None:
                path = "" if "" in aliases else aliases[0]
            else:
                prefix = parent + "." if parent else ""
                direct = [a for a in aliases if a.startswith(prefix) and "." not in a[len(prefix):]]
                # of the aliases a call cannot be told apart by (one caller holding the module under several
                # names), one the selection records: modules="dec" of `self.dec = self.enc` records its calls
                if direct:
                    path = next((a for a in direct if self._selects(a)), direct[0])
                else:  # called from elsewhere: the alias closest to the caller
                    path = max(aliases, key=lambda a: (len(_common_prefix(a, parent)), self._selects(a)))
            self._resolved[key] = path
        return path

    def _selects(self, path: str) -> bool:
        """Whether ``path`` or a path under it is selected (its calls, or those of modules it calls, make rows)."""
        return path in self.selected or any(p.startswith(path + ".") for p in self.selected)

    def parameters(self) -> list[tuple[str, str, nn.Parameter]]:
        """``(module path, name, parameter)`` of the selected modules' parameters, each tensor once,
        named by the first selected module path that owns it (a shared module's parameters are
        recorded when any of its paths is selected)."""
        out, seen = [], set()
        for module_path, module in self.model.named_modules(remove_duplicate=False):
            for name, param in module.named_parameters(recurse=False):
                if id(param) in seen or module_path not in self.selected:
                    continue
                seen.add(id(param))
                out.append((module_path, name, param))
        return out

    def check_path(self, path: str) -> None:
        """Raise a ValueError naming close matches when ``path`` is no module path of the model."""
        if path not in self.paths:
            close = difflib.get_close_matches(str(path), self.paths, n=3, cutoff=0.5)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"No module at path {path!r}.{hint} Module paths: {self.path_list()}.")

    def _check_globs(self, what: str, spec: ModuleSelector) -> None:
        """Refuse a glob of ``spec`` (a string or a list of them) that matches no module path."""
        patterns = [spec] if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple, set)) else []
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(path, pattern) for path in self.paths):
                close = difflib.get_close_matches(pattern, [p for p in self.paths if p], n=3)
                hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
                raise ValueError(f"{what}: the glob {pattern!r} matches no module of {type(self.model).__name__}"
                                 f"{hint}; its module paths are: {self.path_list()}.")

    def path_list(self) -> str:
        """The model's module paths, for error messages (the first 40)."""
        shown = [p if p else "'' (the model itself)" for p in self.paths[:40]]
        more = f" ... and {len(self.paths) - 40} more" if len(self.paths) > 40 else ""
        return ", ".join(shown) + more


_requires_grad = attrgetter("requires_grad")


def _common_prefix(a: str, b: str) -> list[str]:
    out = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        out.append(x)
    return out
