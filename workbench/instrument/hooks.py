"""The hooks of a watch: where each tensor is seen, and handed to the step's sums with its row key.

- A forward hook, process-wide (:func:`~workbench.instrument.torch_internals.register_module_hooks`),
  sees every module call and passes over modules of other models; :class:`~workbench.instrument.sites.CallSites`
  names the call. It applies the site's interventions, reduces each tensor of the output at once
  (a later in-place op may change it) and hooks the node that made it for its gradient
  (:class:`~workbench.instrument.torch_internals.GradientHook`). A process-wide pre-hook marks
  where each forward of the model starts, and, where a module is shared, keeps the call stack. A
  call that raises is no call: the forward hook, called then too, counts it not, and a forward of
  the model that raises takes back the rows and calls of the modules it called. Under
  ``torch.vmap`` and ``torch.func.grad`` a tensor is read as the plain tensor under torch.func's
  wrappers (every sample's values, reduced at once with torch.func off), its gradient hooked on
  the tensor an autograd node makes (:func:`~workbench.instrument.torch_internals.vmap_unwrapped`).
- Output gradients are queued when small (nothing changes a gradient once computed) and reduced in
  one call when the backward ends. Several backward passes through one forward make one row of
  their total gradient: a backward that keeps the graph holds its gradients, added to by the next.
  Parameter gradients come from post-accumulate-grad hooks, and are reduced together there;
  parameter values (and their updates) in :meth:`Hooks.end_step`.
- A forward run inside a backward is activation checkpointing recomputing what the forward
  recorded: it records no rows, only the output gradients the forward could not hook (reentrant
  checkpointing runs it under no_grad).
- Steps that record nothing run without our hooks (:class:`~workbench.instrument.torch_internals.HookSwitch`),
  except on a model that is compiled or holds a compiled part: dynamo does not guard its graphs on
  the process-wide hooks, so the hooks stay in, and the model compiles anew when the watch starts
  (graphs compiled before would never call them) and when it closes (graphs compiled with them
  break at every module call).
- A failure inside a hook is kept in ``errors`` and that site's kind disabled; the forward and
  backward of the model go on untouched. The hooks hold this object weakly: a watch let go of
  without ``close()`` takes them out when it is collected.
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import nn

from workbench.instrument import torch_internals as internals
from workbench.instrument.interventions import Intervention, warn_user
from workbench.instrument.reduce import StepSums
from workbench.instrument.schema import ACTIVATION, GRAD_OUTPUT, PARAM, PARAM_GRAD, UPDATE, site_name
from workbench.instrument.sites import CallSites
from workbench.instrument.tree import shape_of, tensor_leaves

__all__ = ["Hooks", "Entry", "MAX_BACKWARDS_PER_STEP", "MAX_ROWS_PER_STEP", "MAX_HELD_PASSES"]

#: Backward passes within one step past which a step is taken to have been forgotten (a training
#: loop that never calls ``w.step()``): far more than gradient accumulation makes.
MAX_BACKWARDS_PER_STEP = 1000
#: Rows within one step past which it is taken to have been forgotten (an evaluation loop, no
#: backward, never ``w.step()``): far more than a training step makes, a site called thousands of
#: times included (an RNN cell unrolled over a long sequence); its memory is in docs/watch.md.
#: Past either limit nothing more of the step is recorded (memory stays bounded), with a warning.
MAX_ROWS_PER_STEP = 200_000
#: Backward passes keeping the graph (``retain_graph=True``) within one step past which the output
#: gradients held for another pass are recorded at once and let go: a loop that keeps the graph and
#: never calls ``w.step()`` would otherwise hold a gradient per site and pass until the step's limits
#: (a step of a GAN keeps it once or twice). A later pass through those forwards is left out (its
#: total can no longer be taken), with an error that says so.
MAX_HELD_PASSES = 16

#: A recorded tensor of the step: (row key, numel, row of the step's sums). The row key is
#: (module path, call, kind, tensor leaf name, shape).
Entry = tuple[tuple[str, int, str, str, tuple[int, ...]], int, int]


class Hooks:
    """The hooks of one watch and the step they record into.

    Args:
        sites: names each module call.
        sums: the step's sums, which every recorded tensor is reduced into.
        kinds: kind -> the paths whose tensors of that kind are recorded (a failure takes its path out).
        compiled: the model runs compiled code (also where it holds a compiled part): the hooks
            stay in, and dynamo compiles anew at the start and at :meth:`close`.
        updates: record each parameter's update over a recorded step.
        wanted: the kinds the watch's options ask for (default: those with a path in ``kinds``): a
            module or parameter that appears after the start is recorded in these.
    """

    def __init__(self, sites: CallSites, sums: StepSums, kinds: dict[str, set[str]], compiled: bool,
                 updates: bool, wanted: set[str] | None = None) -> None:
        self.sites, self.sums, self.kinds = sites, sums, kinds
        self._wanted = {kind for kind, paths in kinds.items() if paths} if wanted is None else set(wanted)
        self.compiled, self.updates = compiled or internals.contains_compiled(sites.model), updates
        self.errors: list[dict[str, Any]] = []
        self.step_index = 0
        self.interventions: dict[str, list[Intervention]] = {}
        self.paused = 0  # paused() blocks entered
        self.closed = False
        # Read by the process-wide hooks, which fire for every model's modules on every thread from
        # the moment they are registered: inactive until the first step starts
        self.active = self.recording = False
        self.generation = 0  # steps started, discarded ones included
        #: the step in progress may have called the model while the module hooks were out and the watch not paused
        #: (a step not recorded, with no patch to apply): :meth:`calls_made` does not count those calls. A paused
        #: block's calls leave it as it is: they are never counted nor patched, in any step
        self.calls_uncounted = False
        self._calls_before: dict[str, int] = {}  # see _start
        self._late_reported: set[str] = set()  # sites whose gradient arrived after its step ended
        # Row keys, one object per distinct key: each recorded step keeps its keys, and keys made
        # anew would be objects for the garbage collector to count (a full collection every few
        # hundred steps on a model with hundreds of rows a step)
        self._keys: dict[tuple, tuple] = {}
        self._not_floating: set[tuple] = set()  # the activation keys of integer, bool (...) tensors
        self._param_batches: dict[str, tuple[list, list, list]] = {}  # see _record_parameters
        # id(leaf tensor) -> the handle of the gradient hook on it: a leaf returned as an output (a
        # parameter) keeps a tensor hook until removed, replaced as a later step hooks it again
        # (the step's backward would find the last step's too, and call its gradient late)
        self._leaf_hooks: dict[int, Any] = {}
        self.params = sites.parameters()
        # the post-hook runs also when a call raises: a forward of the model that raises leaves no rows
        handles = internals.register_module_hooks(_weakly(self._post_hook), _weakly(self._pre_hook), always_call=True)
        if self.compiled:
            internals.compile_again()  # (graphs compiled before the watch would never call the hooks)
        self._module_hooks = internals.HookSwitch(handles)
        self._fresh_hook_dicts: list[nn.Parameter] = []
        self._param_handles: dict[int, Any] = {}  # id(parameter) -> the handle of its gradient hook
        self._handles = list(handles)  # every hook in, as the finalizer removes them (kept in step)
        self._hook_params()
        self._param_hooks = internals.HookSwitch(self._param_handles.values())
        self._release = weakref.finalize(self, _remove_hooks, self._handles, self._fresh_hook_dicts)
        # The model may change under the watch (a checkpoint loaded with assign=True, a module
        # swapped, a parameter unfrozen): compared at each recorded step, re-hooked where it did
        # (see check_frozen, check_structure)
        self._structure = sites.structure()
        self._check_due = False  # the recorded step has not compared it yet
        self._change_reported = False
        self._limit_reported = False  # a step past MAX_BACKWARDS_PER_STEP or MAX_ROWS_PER_STEP warned
        self._eval_reported = False  # an unpaused evaluation forward warned
        self._left_out_reported = False  # output gradients left out by _drop_left_out warned
        self._held_reported = False  # output gradients reduced at MAX_HELD_BYTES warned

    def _hook_params(self) -> None:
        """Hook the recorded parameters' gradients as they are now (:func:`hook_param_grads`)."""
        hook_param_grads(self.params, self.kinds[PARAM_GRAD] if PARAM_GRAD in self._wanted else set(),
                         self._record_param_grad, self._param_handles, self._handles, self._fresh_hook_dicts)

    def check_frozen(self) -> None:
        """Hook the gradients of parameters unfrozen since the last look, unhook those frozen: at
        the first module call of a recorded step, so that a parameter unfrozen before its forward
        has its gradient recorded in that step. Only flags are compared here: mid-forward a wrapper
        may hold other parameter objects for a while (FSDP's unsharded ones, ``functional_call``'s),
        which :meth:`check_structure` must not take for the model's."""
        flags = self.sites.requires_grad()
        if flags == self._structure[1]:
            return
        try:
            self._structure = (self._structure[0], flags)
            self._param_hooks.set(True)  # (every hook in its dict, where HookSwitch finds it)
            self._hook_params()
            self._param_hooks = internals.HookSwitch(self._param_handles.values())
            self.update()
        except Exception as exc:  # never into training
            self.fail("", 0, "structure", exc, disable=False)

    def check_structure(self) -> None:
        """Re-attach to the model as it is now when its parameters or modules were replaced, added,
        removed, frozen or unfrozen since the last look (at the end of each recorded step, the
        model at rest): its new modules are named and recorded, its current parameters read and
        their gradients hooked. A replacement is warned of once per watch."""
        structure = self.sites.structure()
        if structure == self._structure:
            return
        try:
            before, self.params, changed = reattach(self.sites, self.params, self.kinds, self._wanted)
            self._structure = self.sites.structure()
            self._param_hooks.set(True)  # (every hook in its dict, where HookSwitch finds it)
            self._hook_params()
            self._param_hooks = internals.HookSwitch(self._param_handles.values())
            self.update()
            if [id(p) for p in before[1].values()] != [id(p) for _, _, p in self.params]:
                self._before = None  # (no update rows this step: what it started from is gone)
        except Exception as exc:  # never into training
            self.fail("", 0, "structure", exc, disable=False)
            return
        if changed and not self._change_reported:
            self._change_reported = True
            warn(replaced_message(changed, "watch()"))

    # ------------------------------------------------------------------ the step
    def start_step(self, step_index: int, recording: bool) -> None:
        """Start recording step ``step_index`` (``recording``: rows are taken, else only patches apply)."""
        self._check_patched_calls()
        self._check_uncalled_patches()
        self._start(step_index, recording, {})

    def record_rest_of_step(self) -> None:
        """Record the step in progress from here on (``Watch.record_next`` part-way through a step): its rows
        count calls from 0, while a patch of one call keeps counting the step's calls from its start, so that
        it applies to that call once."""
        carried = dict(self._calls_before)
        for path, calls in self.sites.calls.items():
            carried[path] = carried.get(path, 0) + calls
        self._start(self.step_index, True, carried)

    def _start(self, step_index: int, recording: bool, calls_before: dict[str, int]) -> None:
        self.generation += 1  # (a gradient hooked before this tells its step is over)
        self.step_index, self.recording = step_index, recording
        self.calls_uncounted = False
        #: each site's calls in the step before its calls were counted from 0 again (see record_rest_of_step)
        self._calls_before = calls_before
        self.update()
        self.sites.new_step()
        self.sums.reset()  # (keeps its arrays, grown to the largest step so far)
        # one append per recorded tensor: threads running hooks at once keep them aligned
        self.entries: list[Entry] = []
        self._ended_rows: set[int] = set()  # the rows of the parameters end_step added (see there)
        self._param_grads: dict[tuple[str, str], Entry] = {}
        self._pending_param_grads: list[tuple[str, str, torch.Tensor]] = []  # until the backward ends
        self._seen: dict[int, list] = {}  # id(tensor) -> see _seen_entry
        self._grads_hooked: set[str] = set()  # paths whose output gradients this step's forward hooked
        self._flush_queued = False
        self._keeps_graph = True  # whether the backward running keeps the graph (read with _flush_queued)
        for site in getattr(self, "_held", ()):  # (of a discarded step: its graph may live on)
            site.held = None
        self._held: list[_GradSite] = []  # sites holding the total gradient of passes that kept the graph
        self._held_passes = 0  # backward passes keeping the graph since the held gradients were last reduced
        self._left_out: set[tuple] = set()  # grad_output row keys of sites _leave_out named
        self.step_errors: list[dict[str, Any]] = []
        self._before: list[torch.Tensor] | None = None
        self._check_due = recording
        # per forward of the model running (a model may call itself, threads may call it at once): [the
        # step's entries and calls before it, its thread, whether another thread's forward ran meanwhile]
        self._forwards: list[list] = []
        self._backwards = 0  # backward passes that handed parameter gradients in
        # whether the step's first call of the model trained (training mode, grad enabled), and any did
        self._first_call_trained: bool | None = None
        self._a_call_trained = False
        if recording and self.updates and self.kinds[UPDATE]:
            self._before = [param.detach().clone() for _, _, param in self._update_params()]

    def end_step(self, parameters: bool) -> list[Entry]:
        """The step's entries, once every tensor is reduced or queued (``parameters``: read the
        parameters' values and updates now)."""
        self._take_param_grads()  # (from hooks that ran outside a backward)
        self._take_back_interrupted()
        self._check_due = False
        self.check_structure()  # (before the parameters are read)
        if not self._eval_reported and self._first_call_trained is False and self._a_call_trained:
            self._eval_reported = True
            warn(unpaused_evaluation_message(self.step_index, self.sites.model))
        if self._ended_rows:  # (an end of this step that did not complete: a KeyboardInterrupt in w.step(), which
            # is called again, or the step goes on) its rows of the parameters are taken anew, not twice
            self.entries = [entry for entry in self.entries if entry[2] not in self._ended_rows]
        ended: list[Entry] = []
        if parameters:
            sites = self.kinds[PARAM]
            ended += self._record_parameters(PARAM, [item for item in self.params if item[0] in sites])
        if self._before is not None:
            moved = [(module_path, name, param.detach() - before)
                     for (module_path, name, param), before in zip(self._update_params(), self._before)]
            ended += self._record_parameters(UPDATE, moved)
        ended += self._param_grads.values()
        self._ended_rows = {row for _, _, row in ended}
        self.entries.extend(ended)
        self._reduce_held()
        self._drop_left_out()
        self._flush_deferred()
        return self.entries

    def ran(self) -> bool | None:
        """Whether the step so far called one of the model's modules (selected or not), where the
        module hooks are in (activations, output gradients, patches); None where they are not (a
        backward's parameter gradients do not tell: a step may have none)."""
        return bool(self.sites.calls) if self._module_hooks.attached else None

    def calls_made(self, path: str | None = None) -> int:
        """The calls of the call site ``path`` (None: of every module of the model) the step made so far, as far
        as :meth:`ran` tells (0 where it does not): a count that grows with each call, for what came after a given
        moment of the step."""
        if self.ran() is None:
            return 0
        calls, before = self.sites.calls, self._calls_before
        if path is None:
            return sum(calls.values()) + sum(before.values())
        return calls.get(path, 0) + before.get(path, 0)

    def _check_patched_calls(self) -> None:
        """A patch of call ``k`` of a module that the step just ended called, but fewer than ``k + 1``
        times, patched nothing: it fails (removed, with a warning), as a patch that raises does."""
        for path, items in tuple(self.interventions.items()):
            made = self.sites.calls.get(path, 0) + self._calls_before.get(path, 0)
            for intervention in tuple(items):  # (one from the next step on applied to no call of this one)
                if intervention.call is not None and 0 < made <= intervention.call and not intervention.from_next_step:
                    intervention.fail(self.fail(path, intervention.call, f"patch:{intervention.label}", ValueError(
                        f"the step called {path!r} {made} time(s): it has no call {intervention.call}, and the patch "
                        f"applied to nothing. Patch a call from 0 to {made - 1}, or every call (call=None)")))

    def _check_uncalled_patches(self) -> None:
        """A patch in place through a step that called the model but never its site patched nothing in it: warned
        of once, at the line that made it, with why where that can be told (it stays: a site called in some steps
        only, a branch, is patched in those). Two causes are common: the module is held under several names by
        one caller (``self.dec = self.enc``), whose calls are named by the first (the name a call goes through
        cannot be told); or its parent uses its weights without calling it (``nn.MultiheadAttention``'s
        ``out_proj``)."""
        if not self.interventions or not self.calls_made():
            return
        for path, items in tuple(self.interventions.items()):
            if self.calls_made(path):
                continue
            for intervention in items:
                if (intervention.warned_uncalled or intervention.from_next_step or intervention.error is not None
                        or intervention.start_step > self.step_index):
                    continue
                intervention.warned_uncalled = True
                warn_user(f"workbench: the intervention {intervention.label} at {path!r} applied to nothing at step "
                          f"{self.step_index}: the step called the model, but not {path!r}; {self._uncalled(path)} "
                          f"It stays in place for the steps that call {path!r} ({intervention.id} in the watch's "
                          "intervention_log(); remove() ends it).", intervention.origin)

    def _uncalled(self, path: str) -> str:
        """Why the step made no call of ``path`` that a patch could take, as far as the module tree tells."""
        try:
            module = self.sites.model.get_submodule(path)
        except AttributeError:  # (replaced since)
            return f"{path!r} is no module of the model now."
        named = [alias for alias in self.sites.aliases.get(id(module), ()) if alias != path and self.calls_made(alias)]
        if named:
            return (f"its module is also at {', '.join(map(repr, named))}, the path its calls in this step were named "
                    f"by (where one caller holds a module under several names, which one a call goes through cannot "
                    f"be told): patch {named[0]!r}, as the rows name it.")
        return ("either a branch of the forward that this step did not take calls it (then the patch applies in the "
                "steps that do), or its parent uses its weights without calling it (nn.MultiheadAttention's "
                "out_proj), which leaves no call to patch: patch the module that uses it, whose output the rows show.")

    def _update_params(self) -> list[tuple[str, str, nn.Parameter]]:
        return [item for item in self.params if item[0] in self.kinds[UPDATE]]

    def update(self) -> None:
        """Whether the hooks act (a recorded step or patches to apply, and not paused), and which
        are in: the module hooks where activations, output gradients or patches are to be taken,
        the parameters' hooks where parameter gradients are. A watch of parameters and their
        gradients alone runs every module call on torch's unhooked path."""
        patching = bool(self.interventions)
        self.active = not self.closed and not self.paused and (self.recording or patching)
        recording = self.active and self.recording
        kinds = self.kinds
        compiled = self._runs_compiled()  # (graphs compiled while the hooks were out would never call them)
        self._module_hooks.set(self.on_forked_call is not None or compiled or (self.active and patching)
                               or (recording and bool(kinds[ACTIVATION] or kinds[GRAD_OUTPUT])))
        self.calls_uncounted = self.calls_uncounted or not (self._module_hooks.attached or self.paused)
        self._param_hooks.set(compiled or (recording and bool(kinds[PARAM_GRAD])))

    #: in a process forked from the one that made the watch: called at each call of the model there (see forked_off)
    on_forked_call: Callable[[], None] | None = None

    def forked_off(self, on_call: Callable[[], None]) -> None:
        """In a process forked from the one that made the watch: record nothing (the step in progress is the
        parent's; patches still apply), the module hooks in, so that each call of the model calls ``on_call``."""
        self.on_forked_call = on_call
        self.recording = False
        self.update()

    def close(self) -> None:
        """Remove every hook (idempotent); a compiled model compiles anew, without them."""
        was_open = not self.closed
        self.closed = True
        self.active = False
        self._release()
        for site in getattr(self, "_held", ()):  # (gradients held for a pass that never came: the graph may live on)
            site.held = None
        self._module_hooks.clear()
        self._param_hooks.clear()
        self._leaf_hooks.clear()  # (removed with every other handle by _release)
        self.interventions.clear()
        if self._runs_compiled() and was_open:
            internals.compile_again()  # (once the hooks are out: graphs compiled now are the model's own)

    def _runs_compiled(self) -> bool:
        """Whether the model runs compiled code: so at the start, or compiled in place
        (``model.compile()``) since."""
        return self.compiled or internals.is_compiled(self.sites.model)

    # ------------------------------------------------------------------ forward
    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        if not self.active:
            if self.on_forked_call is not None and module is self.sites.model:
                self.on_forked_call()
            return
        if module is self.sites.model and not internals.in_backward():
            if self.on_forked_call is not None:
                self.on_forked_call()
            self._forward_starts()
        self.sites.enter(module)

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not self.active:
            return None
        if output is None and internals.call_raised(module):
            self._call_raised(module)
            return None
        if self._check_due:  # the first module call of a recorded step
            self._check_due = False
            self.check_frozen()
        path = self.sites.leave(module)
        if module is self.sites.model and self._forwards and not internals.in_backward():
            index = self._forward_of_thread(first=False)
            if index is not None:
                del self._forwards[index]
        if path is None:
            return None
        kinds = self.kinds
        want_grads = self.recording and path in kinds[GRAD_OUTPUT] and module.training and torch.is_grad_enabled()
        recomputing = internals.in_backward()
        if recomputing:
            # a forward inside the backward: activation checkpointing recomputes outputs that the
            # forward recorded. No activation rows, no call counted; patches apply again, so that
            # the recomputed values are those the forward used. The gradients come from the
            # recomputed graph where the forward made none (reentrant checkpointing runs it under
            # no_grad). Which call is recomputed is known only when the forward called the site once:
            # the calls of a forward interrupted since (an earlier forward's loss back-propagated after
            # the interrupt) are none, taken back first.
            self._take_back_interrupted()
            call = 0 if self.sites.calls.get(path) == 1 else None
            record_activations = False
            record_grads = want_grads and call is not None and path not in self._grads_hooked
        else:
            call = self.sites.count(path)
            record_activations = self.recording and path in kinds[ACTIVATION]
            record_grads = want_grads
            if module is self.sites.model and self.recording:  # (a forward of an evaluation, unpaused?)
                trained = module.training and torch.is_grad_enabled()
                if self._first_call_trained is None:
                    self._first_call_trained = trained
                self._a_call_trained = self._a_call_trained or trained
            if self._backwards >= MAX_BACKWARDS_PER_STEP or len(self.entries) >= MAX_ROWS_PER_STEP:
                record_activations = record_grads = self._past_limits(path, call)  # w.step() forgotten?
        replaced = False
        if self.interventions:  # (most watches patch nothing)
            before = self._calls_before.get(path, 0)  # (a patch's call counts from the step's start)
            step_call = call if call is None or not before else None if recomputing else call + before
            output, replaced = self._apply_interventions(path, step_call, recomputing, output)
        if record_activations or record_grads:
            try:
                # most outputs are one tensor: skip the walk
                leaves = (("out", output),) if isinstance(output, torch.Tensor) else tuple(tensor_leaves(output))
                self._record_output(path, call, leaves, record_activations, record_grads)
            except Exception as exc:  # an output the walk or the row keys cannot take: the site stops
                for kind in (ACTIVATION, GRAD_OUTPUT):
                    if path in kinds[kind]:
                        self.fail(path, call, kind, exc)
        return output if replaced else None

    def _call_raised(self, module: nn.Module) -> None:
        """A call that raised is no call: not counted, no rows. Where it is the model's own forward
        (a batch skipped with ``except OutOfMemoryError: continue``, or retried smaller), the rows
        and calls of the modules it called are taken back, so that the next forward in the step is
        numbered as if the failed one had not run (and the step holds no partial forward)."""
        self.sites.leave(module)  # (a container's entry off the call stack)
        if module is self.sites.model and self._forwards and not internals.in_backward():
            self._take_back(self._forward_of_thread(first=False))

    def _forward_starts(self) -> None:
        """Mark where a forward of the model starts, on this thread. This thread's forwards that never
        ended while none is running were interrupted (no hook ran): taken back first."""
        thread, forwards = threading.get_ident(), self._forwards
        overlapped = False
        if forwards:  # (a forward nested in another, one interrupted, or one on another thread)
            first = self._forward_of_thread(first=True)
            if first is not None and not self._runs_compiled() and internals.calls_running(self.sites.model) == 1:
                self._take_back(first)
            for forward in forwards:
                if forward[2] != thread:
                    forward[3] = overlapped = True
        forwards.append([len(self.entries), dict(self.sites.calls), thread, overlapped])

    def _take_back_interrupted(self) -> None:
        """Take back this thread's forward of the model interrupted (none of its calls is running here)."""
        if self._forwards and not self._runs_compiled() and internals.calls_running(self.sites.model) == 0:
            self._take_back(self._forward_of_thread(first=True))

    def _forward_of_thread(self, first: bool) -> int | None:
        """The index in ``_forwards`` of this thread's first (or last) forward running, None if none."""
        thread = threading.get_ident()
        order = range(len(self._forwards)) if first else range(len(self._forwards) - 1, -1, -1)
        return next((index for index in order if self._forwards[index][2] == thread), None)

    def _take_back(self, forward: int | None) -> None:
        """Take back the rows and calls of this thread's forwards of the model from ``forward`` (an index
        of ``_forwards``, None for none) on: they raised, or were interrupted (a ``KeyboardInterrupt``
        runs no hook, and is found as the next forward of the model starts or the step ends). Where
        another thread's forward ran meanwhile, its rows and calls are among theirs, not told apart:
        they are kept (as they were before forwards were taken back), and only the marks go."""
        if forward is None:
            return
        thread, overlapped = self._forwards[forward][2:]
        if overlapped:
            self._forwards[forward:] = [f for f in self._forwards[forward:] if f[2] != thread]
            return
        entries, calls = self._forwards[forward][:2]
        del self._forwards[forward:]
        # the rows of the calls made since it started go; rows of earlier calls that arrived since stay
        # (the output gradients of an earlier forward, its loss back-propagated after the interrupt)
        self.entries[entries:] = [entry for entry in self.entries[entries:]
                                  if entry[0][1] is not None and entry[0][1] < calls.get(entry[0][0], 0)]
        self.sites.calls.clear()
        self.sites.calls.update(calls)
        # a tensor those calls returned may be returned again (a parameter, as learned queries are),
        # its gradient site found again in _seen: the keys of the calls taken back go, as their rows
        for seen in self._seen.values():
            site = seen[3]
            if site is not None:
                site.keys[:] = [key for key in site.keys if key[1] < calls.get(key[0], 0)]

    def _apply_interventions(self, path: str, call: int | None, recomputing: bool, output: Any) -> tuple[Any, bool]:
        replaced = False
        for intervention in tuple(self.interventions.get(path, ())):  # (a failing one is removed)
            if intervention.from_next_step:
                continue
            if recomputing and call is None and intervention.call is not None:
                intervention.fail(self.fail(path, call, f"patch:{intervention.label}", RuntimeError(
                    f"activation checkpointing recomputes {path!r}, which the forward called "
                    f"{self.calls_made(path)} times: a patch of call {intervention.call} cannot tell "
                    "which call is recomputed, and the gradients would not match the forward. Patch "
                    "every call (call=None), or a site outside the checkpointed segment.")), output)
            elif intervention.applies(call):
                try:
                    patched = intervention.fn(output)
                    # None: fn edited the output in place (as a forward hook may), which stays the output
                    if patched is not None:
                        output, replaced = patched, True
                except Exception as exc:
                    intervention.fail(self.fail(path, call, f"patch:{intervention.label}", exc), output)
        return output, replaced

    def _record_output(self, path: str, call: int, leaves: Sequence[tuple[str, torch.Tensor]],
                       activations: bool, grads: bool) -> None:
        for name, tensor in leaves:
            values = internals.functorch_unwrapped(tensor)  # (under torch.vmap: every sample's values)
            seen = self._seen_entry(values)
            shape = shape_of(values)  # a plain tuple: the garbage collector stops tracking the keys
            if activations:
                try:
                    if seen[2] is None:
                        seen[2] = self._reduce(values, values is not tensor, defer=False)
                    key = self._keys.get((path, call, ACTIVATION, name, shape))
                    if key is None:
                        key = self._intern((path, call, ACTIVATION, name, shape))
                        if not values.is_floating_point():  # (ablate zeroes none of its units)
                            self._not_floating.add(key)
                    # one append (a list append is atomic): hooks on other threads cannot interleave a row
                    self.entries.append((key, values.numel(), seen[2]))
                except Exception as exc:
                    self.fail(path, call, ACTIVATION, exc)
                    activations = False
            tracked = tensor if values is tensor else internals.vmap_unwrapped(tensor)  # (made by an autograd node)
            if grads and tracked.requires_grad:
                try:
                    if seen[3] is None:
                        seen[3] = _GradSite(self)
                        leaf_hook = seen[3].attach(tracked)
                        if leaf_hook is not None:  # (a parameter returned: one hook of ours on it at a time)
                            old = self._leaf_hooks.pop(id(tracked), None)
                            if old is not None:
                                old.remove()
                                self._handles.remove(old)
                            self._leaf_hooks[id(tracked)] = leaf_hook
                            self._handles.append(leaf_hook)  # (removed should the watch be let go of unclosed)
                    seen[3].keys.append((path, call, name, shape))
                    self._grads_hooked.add(path)
                except Exception as exc:
                    self.fail(path, call, GRAD_OUTPUT, exc)
                    grads = False

    def output_shapes(self, path: str) -> set[tuple[str, tuple]]:
        """The leaf names and shapes of the floating-point activations (those ``ablate`` zeroes) recorded
        at ``path`` so far (none before a recorded step)."""
        return {(key[3], key[4]) for key in list(self._keys)
                if key[0] == path and key[2] == ACTIVATION and key not in self._not_floating}

    def _intern(self, key: tuple) -> tuple:
        """The one kept object equal to ``key`` (see ``_keys``)."""
        return self._keys.setdefault(key, key)

    def _seen_entry(self, tensor: torch.Tensor) -> list:
        """``[weakref, version, row, grad site]`` of ``tensor`` in this step.

        A container's output is often its last child's output, the same tensor object (a
        Sequential, a residual block, the model): it is reduced and hooked once, and every call
        site that returned it gets a row (with the same row of sums: the record's ``tensors``
        tells the UI they are one tensor). Likewise a gradient that the backward hands to several
        sites. The weakref proves identity without keeping the tensor alive, the version counter
        proves it was not modified in place since.
        """
        version = internals.tensor_version(tensor)
        if version is None:  # an inference-mode tensor: never reused
            return [None, None, None, None]
        seen = self._seen.get(id(tensor))
        if seen is None or seen[0]() is not tensor or seen[1] != version:
            seen = self._seen[id(tensor)] = [weakref.ref(tensor), version, None, None]
        return seen

    # ------------------------------------------------------------------ backward
    def _record_grad(self, site: _GradSite, grad: torch.Tensor | None) -> None:
        if grad is None or self.closed or self.paused:
            return
        keys = [key for key in site.keys if key[0] in self.kinds[GRAD_OUTPUT]]
        if site.generation != self.generation:
            if site.step == self.step_index:  # of a forward whose step was discarded
                return
            # the user's order, not the site, is at fault: the site records again from the next
            # step. Reported once per site: a loop that always steps too early would report every step
            if not self._late_reported and keys:  # (and said once: the rows are missing, not delayed)
                warn(f"workbench: the output gradients of step {site.step} arrived after w.step() ended that "
                     "step, and are not recorded (w.errors names each site). Call w.step() after "
                     "loss.backward().")
            for path, call, _, _ in keys:
                if path not in self._late_reported:
                    self._late_reported.add(path)
                    self.fail(path, call, GRAD_OUTPUT, RuntimeError(
                        f"the gradient of step {site.step} arrived after watch.step() ended that step; "
                        "call w.step() after loss.backward()"), disable=False)
            return
        if not keys:
            return
        try:
            self._flush_when_backward_ends()  # (and tells whether this backward keeps the graph)
            if site.recorded:  # a backward after one that freed the graph: nothing to add this one to
                self._leave_out(site, keys)
                return
            values = internals.functorch_unwrapped(grad)  # (under torch.vmap: every sample's gradient)
            if values is grad and (self._keeps_graph or site.held is not None):
                # Several backward passes through one forward (retain_graph=True, then another):
                # the row is of the total gradient, as a parameter's .grad is. A backward that keeps
                # the graph adds its gradient to the site's total, reduced when a backward that frees
                # the graph adds the last one, or at the end of the step.
                own = grad.detach() if grad.requires_grad else grad  # (create_graph: no graph kept alive)
                total = own if site.held is None else site.held + own
                if self._keeps_graph:
                    if site.held is None:
                        self._held.append(site)
                    site.held = total
                    return
                site.held, values, grad = None, total, total
            self._add_grad_rows(keys, values, values is not grad)
            site.recorded = True
        except Exception as exc:
            for path, call, _, _ in keys:
                self.fail(path, call, GRAD_OUTPUT, exc)

    def _add_grad_rows(self, keys: list[tuple[str, int, str, tuple]], grad: torch.Tensor, unwrapped: bool) -> None:
        """A ``grad_output`` row of ``grad`` at each of ``keys`` (path, call, leaf name, shape)."""
        # The backward often hands one gradient tensor to several sites (an add node passes its
        # incoming gradient to both branches of a residual connection): while its Python object
        # lives it is found and reduced once. Nothing changes a gradient once computed: small ones
        # are queued and reduced together when the backward ends.
        seen = self._seen_entry(grad)
        if seen[2] is None:
            seen[2] = self._reduce(grad, unwrapped, defer=True)
        row = seen[2]
        self.entries.extend((self._intern((path, call, GRAD_OUTPUT, name, shape)), grad.numel(), row)
                            for path, call, name, shape in keys)

    def _reduce_held(self, past_limit: bool = False) -> None:
        """The rows of the totals that backward passes keeping the graph left (none followed that
        freed it): at the end of the step, which no later pass of its forward may add to, or
        (``past_limit``) after :data:`MAX_HELD_PASSES` backward passes that kept the graph."""
        if past_limit and not self._held_reported:
            self._held_reported = True
            warn(f"workbench: {self._held_passes} backward passes keeping the graph (retain_graph=True) within "
                 f"step {self.step_index} left {len(self._held)} output gradients held for another pass: they are "
                 "recorded now, and a later pass through those forwards is left out. Is w.step() called after "
                 "each training step? Said once per watch.")
        held, self._held, self._held_passes = self._held, [], 0
        for site in held:
            grad, site.held, site.recorded = site.held, None, True
            keys = [key for key in site.keys if key[0] in self.kinds[GRAD_OUTPUT]]
            if grad is None or not keys:
                continue
            try:
                self._add_grad_rows(keys, grad, False)
            except Exception as exc:
                for path, call, _, _ in keys:
                    self.fail(path, call, GRAD_OUTPUT, exc)

    def _leave_out(self, site: _GradSite, keys: list[tuple[str, int, str, tuple]]) -> None:
        """A backward that reached ``site`` after one that freed the graph had made its rows (a
        graph whose nodes save no tensor runs again without retain_graph; torch.func's gradients
        are reduced at once): the first pass's gradient is gone, so the total cannot be taken, and
        the site's rows are left out of the step (:meth:`end_step` says so) rather than kept as the
        gradient of one pass."""
        self._left_out.update(self._intern((path, call, GRAD_OUTPUT, name, shape)) for path, call, name, shape in keys)

    def _drop_left_out(self) -> None:
        """Take the rows of the sites :meth:`_leave_out` named out of the step, with an error (and a
        warning, once per watch), as the compiled watch leaves out the rows it cannot total."""
        if not self._left_out:
            return
        left_out = self._left_out
        self.entries = [entry for entry in self.entries if entry[0] not in left_out]
        # (named as the views name them: "#call" where the module was called more than once this step)
        sites = sorted({site_name(path, call, name, self.sites.calls.get(path, 0) > 1)
                        for path, call, _, name, _ in left_out})
        message = (f"the output gradients of {len(sites)} call site(s) ({', '.join(sites[:3])}"
                   f"{' ...' * (len(sites) > 3)}) came from several backward passes through one forward, the "
                   "first of which freed the graph (no retain_graph=True): its gradient was gone when the next "
                   f"came, so their total cannot be recorded and they are left out of step {self.step_index}. Pass "
                   "retain_graph=True to every backward but the last, or back-propagate the sum of the losses "
                   "once ((loss1 + loss2).backward())")
        self.fail("", None, GRAD_OUTPUT, RuntimeError(message), disable=False)
        if not self._left_out_reported:
            self._left_out_reported = True
            warn(f"workbench: {message}. Said once per watch; w.errors names each step.")

    def _reduce(self, values: torch.Tensor, unwrapped: bool, defer: bool) -> int:
        """The row of ``values``, reduced now or (``defer``) when the backward ends; one ``unwrapped``
        from torch.func's wrappers at once, with torch.func off (inside a ``grad`` transform its ops
        would make wrapped tensors again, and its values may not outlive the transform)."""
        if not unwrapped:
            return self.sums.add(values, defer=defer)
        with internals.functorch_disabled():
            return self.sums.add(values)

    def _record_param_grad(self, module_path: str, name: str, param: nn.Parameter) -> None:
        if not (self.recording and self.active) or module_path not in self.kinds[PARAM_GRAD]:
            return
        if self._backwards >= MAX_BACKWARDS_PER_STEP:  # w.step() forgotten? The step stops growing
            self._past_limits(module_path, None)
            return
        grad = param.grad
        if grad is None:  # a hook that ran before ours took it: an optimizer step inside the backward
            where = ".".join(filter(None, (module_path, name)))
            self.fail(module_path, 0, PARAM_GRAD, RuntimeError(
                f"the gradient of {where} was already None when watch's hook ran: a post-accumulate-grad "
                "hook registered before watch() took it (an optimizer step in the backward?). Start "
                "watch() before registering such hooks to record it."))
            return
        # the gradient as accumulated now (a hook behind ours may take it), reduced with the
        # others when the backward ends
        self._pending_param_grads.append((module_path, name, grad))
        self._flush_when_backward_ends()

    def _record_parameters(self, kind: str, items: list[tuple[str, str, torch.Tensor]]) -> list[Entry]:
        """Rows of ``kind`` (param, param_grad, update) for ``(module path, name, tensor)`` items,
        reduced together (``StepSums.add_many``); a tensor that cannot be reduced fails its site alone.
        Returns the entries of ``param`` and ``update`` rows (``param_grad`` ones go to ``_param_grads``)."""
        tensors = [tensor for _, _, tensor in items]
        try:
            rows = self.sums.add_many(tensors)
        except Exception:  # (a meta tensor ...) one by one, to tell which
            rows = []
            for module_path, _, tensor in items:
                try:
                    rows.append(self.sums.add(tensor, defer=True))
                except Exception as exc:
                    self.fail(module_path, 0, kind, exc)
                    rows.append(None)
        # the row keys of a batch stay the same while its names and shapes do (a step's parameters,
        # its gradients in the order the backward made them): made once, then compared
        names = [(module_path, name) for module_path, name, _ in items]
        shapes = [tensor.shape for tensor in tensors]
        batch = self._param_batches.get(kind)
        if batch is None or batch[0] != names or batch[1] != shapes:
            keys = [self._intern((module_path, 0, kind, name, shape_of(tensor))) for module_path, name, tensor in items]
            batch = self._param_batches[kind] = (names, shapes, list(zip(keys, [t.numel() for t in tensors])))
        entries = [(key, numel, row) for (key, numel), row in zip(batch[2], rows) if row is not None]
        if kind == PARAM_GRAD:  # the last backward of the step wins: .grad holds the accumulated total
            self._param_grads.update(zip([where for where, row in zip(names, rows) if row is not None], entries))
            return []
        return entries

    def _flush_when_backward_ends(self) -> None:
        """Reduce the gradients deferred during this backward in one call when it ends (while they
        are still there: ``zero_grad`` may zero them in place). Outside a backward (a hook run by
        hand) ``end_step`` does."""
        if not self._flush_queued:
            self._flush_queued = internals.queue_end_of_backward(self._end_of_backward)
            self._keeps_graph = internals.keeps_graph()  # (True outside a backward)

    def _end_of_backward(self) -> None:
        self._flush_queued = False
        self._backwards += 1
        if self._held and self._keeps_graph:
            self._held_passes += 1
            if self._held_passes >= MAX_HELD_PASSES:
                self._reduce_held(past_limit=True)
        self._flush_deferred()

    def _take_param_grads(self) -> None:
        if self._pending_param_grads:
            pending, self._pending_param_grads = self._pending_param_grads, []
            self._record_parameters(PARAM_GRAD, pending)

    def _flush_deferred(self) -> None:
        self._take_param_grads()
        try:
            self.sums.flush()
        except Exception as exc:
            self.fail("", 0, "statistics", exc)

    def _past_limits(self, path: str, call: int | None) -> bool:
        """Past :data:`MAX_BACKWARDS_PER_STEP` or :data:`MAX_ROWS_PER_STEP` in one step: nothing
        more of it is recorded (False), and a warning (once per watch) and an error say so."""
        if not self._limit_reported:
            self._limit_reported = True
            where = repr(path) if path else "the model"
            what = (f"{self._backwards} backward passes" if self._backwards >= MAX_BACKWARDS_PER_STEP
                    else f"{len(self.entries):,} rows, {where} called {call + 1} times,")
            message = (f"{what} within step {self.step_index}: is w.step() called after each training step? "
                       f"Past {MAX_BACKWARDS_PER_STEP} backward passes or {MAX_ROWS_PER_STEP:,} rows in one step "
                       "nothing more of the step is recorded. Call w.step() after loss.backward() and the "
                       "optimizer step, and run evaluation inside `with w.paused():`")
            self.fail(path, None, "step", RuntimeError(message), disable=False)
            warn(f"workbench: {message}.")
        return False

    # ------------------------------------------------------------------ failures
    def fail(self, path: str, call: int | None, kind: str, exc: BaseException, disable: bool = True) -> dict:
        """Keep an instrumentation failure in ``errors`` and (``disable``) stop recording ``kind`` at
        ``path``; returns it. A failing patch is removed instead (``Intervention.fail``, which warns):
        the model no longer runs as the user asked."""
        if disable and kind in self.kinds:
            self.kinds[kind].discard(path)
        error = {"step": self.step_index, "module": path, "call": call, "kind": kind,
                 "error": f"{type(exc).__name__}: {exc}", "traceback": "".join(traceback.format_exception(exc))}
        self.errors.append(error)
        self.step_errors.append(error)
        return error


class _GradSite(internals.GradientHook):
    """The gradient w.r.t. one output tensor, recorded when the backward computes it, for every
    call site that returned the tensor (``keys``)."""

    __slots__ = ("hooks", "keys", "step", "generation", "held", "recorded")

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = weakref.ref(hooks)  # (a hook on a leaf outlives the graph: it keeps no watch alive)
        self.keys: list[tuple[str, int, str, tuple[int, ...]]] = []  # (path, call, leaf name, shape) per call site
        self.step, self.generation = hooks.step_index, hooks.generation
        self.held: torch.Tensor | None = None  # the total gradient of the passes so far that kept the graph
        self.recorded = False  # its rows are made: a later backward pass has nothing to add to

    def on_gradient(self, grad: torch.Tensor | None) -> None:
        hooks = self.hooks()
        if hooks is not None:
            hooks._record_grad(self, grad)


def warn(message: str) -> None:
    """A RuntimeWarning at the user's line that made the step (not a line of workbench's or torch's),
    that never raises into training or the store's writer (where warnings are turned into errors,
    the failure is still in ``errors``)."""
    warn_user(message)


def hook_param_grads(params: list[tuple[str, str, nn.Parameter]], paths: set[str], on_grad: Callable,
                     hooked: dict[int, Any], handles: list, fresh: list) -> None:
    """Hook the gradient of each of ``params`` (module path, name, parameter) at ``paths`` that
    requires grad and has no hook in ``hooked`` (id of the parameter -> its hook's handle) yet, with
    ``on_grad(module path, name, parameter)`` held weakly; unhook those of ``hooked`` gone or frozen.
    ``handles`` keeps every hook in, ``fresh`` the hook dicts made (see
    :func:`~workbench.instrument.torch_internals.register_param_grad_hook`). Hooks already in keep
    their place among the user's. Both watches' (eager and compiled)."""
    want = {id(p): (path, name, p) for path, name, p in params if p.requires_grad and path in paths}
    for key in [key for key in hooked if key not in want]:
        handle = hooked.pop(key)
        handle.remove()
        handles.remove(handle)
    internals.restore_param_hook_dicts(fresh)
    for key, (module_path, name, param) in want.items():
        if key not in hooked:
            handle = internals.register_param_grad_hook(param, _weakly(on_grad, module_path, name), fresh)
            hooked[key] = handle
            handles.append(handle)


def _weakly(method: Callable, *bound: Any) -> Callable:
    """A hook that calls ``method(*bound, *args)`` while ``method``'s object lives, and does nothing
    after: torch's hook dicts hold it, and must not keep the watch alive."""
    owner_ref, function = weakref.ref(method.__self__), method.__func__

    def hook(*args: Any) -> Any:
        owner = owner_ref()
        return None if owner is None else function(owner, *bound, *args)

    return hook


def attached(sites: CallSites, params: list[tuple[str, str, nn.Parameter]]) -> tuple[dict, dict]:
    """What a watch is attached to, before :meth:`CallSites.rebuild`: each module path's module id,
    and each (module path, name)'s parameter (for :func:`changes`)."""
    modules = {path: id(m) for key, m in sites.modules.items() for path in sites.aliases[key]}
    return modules, {(path, name): param for path, name, param in params}


def reattach(sites: CallSites, params: list[tuple[str, str, nn.Parameter]], kinds: dict[str, set[str]],
             wanted: Collection[str]) -> tuple[tuple[dict, dict], list[tuple[str, str, nn.Parameter]], list[str]]:
    """Index ``sites`` anew (the model changed) and add its new paths to the ``kinds`` recorded
    (those ``wanted``; paths that failed stay out): what was :func:`attached` before, the parameters
    now, and what :func:`changes` named. Both watches' (eager and compiled)."""
    before = attached(sites, params)
    sites.rebuild()
    params = sites.parameters()
    added, new_param_paths, changed = changes(before, sites, params)
    for kind in (ACTIVATION, GRAD_OUTPUT):
        if kind in wanted:
            kinds[kind].update(added)
    for kind in (PARAM, PARAM_GRAD, UPDATE):
        if kind in wanted and kind in kinds:
            kinds[kind].update(new_param_paths)
    return before, params, changed


def changes(before: tuple[dict, dict], sites: CallSites,
            params: list[tuple[str, str, nn.Parameter]]) -> tuple[set[str], set[str], list[str]]:
    """After :meth:`CallSites.rebuild`, against :func:`attached` before it: the new module paths
    the watch selects, the module paths that own a parameter now and did not, and what changed
    (``module 'path'`` or a parameter's dotted name), to be named in :func:`replaced_message`."""
    old_modules, old_params = before
    new_modules, new_params = attached(sites, params)
    added = {path for path in new_modules if path not in old_modules and path in sites.selected}
    param_paths = {path for path, _ in old_params}
    new_param_paths = {path for path, _ in new_params if path not in param_paths}
    changed = [f"module {path!r}" for path in new_modules.keys() | old_modules.keys()
               if new_modules.get(path) != old_modules.get(path)]
    changed += [".".join(filter(None, where)) for where in new_params.keys() | old_params.keys()
                if new_params.get(where) is not old_params.get(where)]
    return added, new_param_paths, changed


def replaced_message(changed: list[str], started: str) -> str:
    """The warning, once per watch, that the model's parameters or modules changed under it."""
    shown = ", ".join(sorted(changed)[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    return (f"workbench: the model's parameters or modules were replaced, added or removed after {started} "
            f"started ({shown}; load_state_dict(assign=True), a new nn.Parameter or submodule?). The watch "
            "now records the current ones: their parameter values from this step, their activations and "
            "gradients from the next step. Said once per watch.")


def unpaused_evaluation_message(step: int, model: nn.Module) -> str:
    """The warning, once per watch, of a recorded step that began with an evaluation call of the model."""
    return (f"workbench: the step {step} began with a call of the model ({type(model).__name__}) in eval mode or "
            "under torch.no_grad(), recorded as its call 0, before its training calls: if it is an evaluation "
            "pass, run it inside `with w.paused():` so that it leaves no rows and the training forward stays "
            "call 0. Said once per watch.")


def _remove_hooks(handles: list, fresh_hook_dicts: list[nn.Parameter]) -> None:
    """Take the hooks out of torch's hook dicts (on close(), or when the Hooks are collected)."""
    for handle in handles:
        handle.remove()
    handles.clear()
    internals.restore_param_hook_dicts(fresh_hook_dicts)
    fresh_hook_dicts.clear()
