"""LayerExecutor — one planned layer, holding its parameters, run with DTensor.

Contract: a :class:`~galvatron_fx.passes.apply_placements.PlacedLayer` (the layer under its
intra-layer plan: the interpreter, the layouts, the trace the lowering makes) that also holds
the layer's parameters (the user's real tensors, laid out in their storage placements) as an
``nn.Module``. Its forward takes the layer's non-parameter inputs as DTensors laid out as
:meth:`~galvatron_fx.passes.apply_placements.PlacedLayer.input_placements` says, and returns
DTensors; after :meth:`LayerExecutor.lower` it runs the layer's traced local graphs
(:class:`~galvatron_fx.runtime.lowered._Lowered`) instead of the interpreter.

Data parallelism: after backward, a parameter's grad is ``Partial`` on dp (its readers saw a
batch-sharded activation) and, under sequence parallelism, possibly ``Partial`` on tp (LayerNorm
weights). :meth:`LayerExecutor.sync_grads` redistributes every grad to its parameter's storage
placement: an all-reduce (sum) over dp and, where needed, tp. The sum is the gradient of the sum
of the per-rank losses; a mean loss must be divided by the dp degree by the caller's loss.

Offload (:meth:`LayerExecutor.offload`, a plain local parameter of a layer whose strategy has
``offload``): the registered parameter becomes the *master*, an fp32 copy in host memory that
the optimizer, ``state_dict`` and checkpoints see; the layer computes with a *working copy* on
the parameter's device (a separate tensor even where host and device are one, CPU), which is
copied from the master again whenever the master changed (its ``_version`` or storage differs
from those last copied), when the layer next reads it (:meth:`~LayerExecutor.local_params`,
:meth:`~LayerExecutor._param`). Backward accumulates gradients on the working copy
(:meth:`~LayerExecutor.grad_param`); the owner's gradient sync moves them to the master
(:meth:`_Working.grad_to_host`). Layers sharing a tied parameter share its :class:`_Working`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import LayerOption
from galvatron_fx.passes.apply_placements import PlacedLayer
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer
from galvatron_fx.passes.layout_autograd import _AsDTensor
from galvatron_fx.runtime.lowered import _Lowered

log = logging.getLogger(__name__)
R = Replicate()


def _mesh_device(mesh: DeviceMesh) -> torch.device:
    """The device ``mesh``'s collectives run on (this process's GPU for a ``cuda`` mesh)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


class _Working:
    """A host master parameter and its device working copy (see module doc)."""

    __slots__ = ("master", "copy", "seen")

    def __init__(self, master: nn.Parameter, copy: torch.Tensor):
        assert master.device.type == "cpu" and copy.data_ptr() != master.data_ptr(), (master.device, copy.device)
        self.master, self.copy = master, copy
        self.seen = (master._version, master.data_ptr())  # the master's state last copied

    def fresh(self) -> torch.Tensor:
        """The working copy, copied from the master first if the master changed since (an
        optimizer step, a load: in-place writes bump ``_version``; a ``.data`` swap moves it)."""
        m = self.master
        if (m._version, m.data_ptr()) != self.seen:
            with torch.no_grad():
                self.copy.copy_(m)
            self.seen = (m._version, m.data_ptr())
        return self.copy

    @torch.no_grad()
    def grad_to_host(self) -> None:
        """The working copy's gradient added to the master's (set when it has none) in host
        memory; the working copy's dropped, so that the next backward starts clean (a bucket's
        view of it goes with it)."""
        g = self.copy.grad
        if g is None:
            return
        m = self.master
        if m.grad is None:
            m.grad = g.to(m.device, copy=True)  # a copy even on CPU: never the bucket's storage
        else:
            m.grad += g.to(m.device)
        self.copy.grad = None


class LayerExecutor(nn.Module, PlacedLayer):
    """One planned layer on a ``(dp, tp)`` mesh, with its parameters (see module doc).

    ``params`` maps the decomposed layer's parameter input names (``dl.input_names``, the
    captured graph's placeholder names) to real tensors; ``fqns`` maps the same names to the
    user's FQNs (used to name the executor's parameters; tied placeholders share one).
    """

    replicate_plain = False
    fsdp = False  # an FSDP unit's layer (set by the parallel module)

    if TYPE_CHECKING:
        written_values: list[torch.Tensor]  # the new values of the inputs a lowered call wrote (see _Lowered)
        # set by the parallel module: per forward input, the value it reads and its tp placement;
        # the names of the layer's outputs
        feeds: list[tuple[str, Placement]]
        layer_outputs: list[str]

    def __init__(self, dl: DecomposedLayer, option: LayerOption, mesh: DeviceMesh,
                 params: dict[str, torch.Tensor], fqns: dict[str, str] | None = None):
        nn.Module.__init__(self)
        PlacedLayer.__init__(self, dl, option, mesh, fqns)
        self.params = nn.ParameterDict()
        self.fqn_of_key: dict[str, str] = {}
        for key, (fqn, name, _ph) in self.param_keys.items():
            tp_p = self._meta[key][0]
            dt = distribute_tensor(params[name].detach().clone(), mesh, [R, tp_p])
            self.params[key] = nn.Parameter(dt, requires_grad=params[name].requires_grad)
            self.fqn_of_key[key] = fqn
        self.lowered: _Lowered | None = None  # the traced local-op function (see lower())
        # where the layer reads its parameters' local shards from, when not its own storage (the
        # torch.compile backend's: the user's whole tensors, sharded on read); see local_params()
        self.param_source: Callable[[], list[torch.Tensor]] | None = None
        self._local: set[str] = set()  # parameters stored as plain local shards (localize())
        self._fsdp_ignored: set[str] = set()  # of an FSDP unit's, those it leaves whole (0-dim ones)
        self._offloaded: dict[str, _Working] = {}  # key -> host master and working copy (offload())
        # key -> (tp storage placement, global shape, global stride)
        self._meta = {k: (p.placements[1], p.shape, p.stride()) for k, p in self.params.items()}

    @classmethod
    def from_model(cls, mg: ModelGraph, layer: LayerInfo, option: LayerOption, mesh: DeviceMesh,
                   model: nn.Module, *, decomposed: DecomposedLayer | None = None) -> LayerExecutor:
        """Build from a captured model (captured at the runtime micro-batch shape) and the user's
        module, whose parameters are matched by FQN."""
        dl = decomposed or decompose_layer(mg, layer)
        fqns = {node: fqn for fqn, p in mg.params.items() for node in p.nodes}
        named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
        params = {name: named[fqns[name]] for name, role in zip(dl.input_names, dl.input_roles) if role == "param"}
        return cls(dl, option, mesh, params, fqns)

    # -- layouts -----------------------------------------------------------------------------

    def distribute_inputs(self, *xs: torch.Tensor) -> list[DTensor]:
        """Lay out full (identical on every rank) input tensors as :meth:`input_placements` says."""
        return [distribute_tensor(x, self.mesh, list(p)) for x, p in zip(xs, self.input_placements())]

    # -- forward ------------------------------------------------------------------------------

    def forward(self, *xs: DTensor | torch.Tensor, unwrapped: bool = False):
        """The layer's outputs (DTensors) for its inputs laid out as :meth:`input_placements`
        says. ``unwrapped`` (for callers that chain lowered layers): inputs may also be local
        tensors the lowered graph :meth:`_Lowered.accepts`, and DTensor outputs come back as
        their local tensors (:meth:`_Lowered.rewrap` gives their layouts). Called as a module
        (``ex(*xs, unwrapped=True)``), so that FSDP's hooks see it. A lowered layer whose
        program reads user inputs whole (:attr:`_Lowered.whole_inputs`) may get them after its
        inputs."""
        n = len(self._inputs)
        wholes = len(self.lowered.whole_inputs) if self.lowered is not None else 0
        assert len(xs) in (n, n + wholes), f"expected {n} inputs, got {len(xs)}"
        if self.lowered is not None:
            return self.lowered(self, xs[:n], unwrapped=unwrapped, wholes=xs[n:])
        if self.param_source is not None:
            return self._interpret(xs, dict(zip(self.params, self.param_source())))
        return self._interpret(xs)

    # -- lowering -----------------------------------------------------------------------------

    def lower(self, share_with: LayerExecutor | None = None, program=None, *, selective: bool = False) -> None:
        """Run the layer as graphs of local ATen ops and functional collectives
        (:class:`_Lowered`): ``program``'s (its :class:`~galvatron_fx.ir.program.LayerGraphs`),
        else traced at the first call; ``share_with``: an executor of the same kind, option, mesh
        and parameter storage whose graphs this one runs too (parameters line up by position).
        ``selective``: a graph traced here recomputes selectively, as the program's does
        (:func:`~galvatron_fx.ir.recompute.tag_selective`)."""
        if share_with is not None and share_with is not self and share_with.lowered is not None:
            self.lowered = share_with.lowered
        else:
            self.lowered = _Lowered(self, program, selective=selective)

    def localize(self) -> None:
        """Store each parameter as its plain local shard (``tp`` placement kept as metadata).

        The optimizer then steps ordinary tensors, and a gradient arrives as a plain local
        tensor holding this rank's share of a sum over dp (:class:`_AsDTensor`), ready for a
        bucketed all-reduce (:func:`~galvatron_fx.runtime.buckets.all_reduce_coalesced`).
        Not for parameters that FSDP shards (FSDP wants DTensors)."""
        for key, p in list(self.params.items()):
            if key in self._local:
                continue
            self._local.add(key)
            self.params[key] = nn.Parameter(p.detach()._local_tensor, requires_grad=p.requires_grad)

    def offload(self) -> None:
        """Keep every parameter (plain local shards: after :meth:`localize`) as a host master
        with a device working copy (see module doc). The working copy is the tensor the
        parameter was (its storage stays on the device); the master is a new host copy, pinned
        when the device is a GPU, registered in its place."""
        assert self._local == set(self.params.keys()), f"offload() after localize(): {self.name}"
        for key, p in list(self.params.items()):
            if key in self._offloaded:
                continue
            host = p.detach().to("cpu", copy=True)
            if p.device.type == "cuda":
                host = host.pin_memory()
            master = nn.Parameter(host, requires_grad=p.requires_grad)
            self._offloaded[key] = _Working(master, p.detach().requires_grad_(p.requires_grad))
            self.params[key] = master

    def grad_param(self, key: str) -> torch.Tensor:
        """The tensor backward accumulates ``key``'s gradient into: the working copy of an
        offloaded parameter, else the parameter itself."""
        w = self._offloaded.get(key)
        return self.params[key] if w is None else w.copy

    def local_params(self) -> list[torch.Tensor]:
        """This rank's shard of every parameter, in ``self.params`` order, as a lowered layer
        reads them (differentiably: an FSDP-unsharded DTensor's local tensor, an offloaded
        parameter's fresh working copy), or what ``param_source`` gives where one is set."""
        if self.param_source is not None:
            return self.param_source()
        # the ParameterDict's own storage (its values() goes through __getitem__ per key; FSDP
        # swaps parameters in place there, so this sees the current ones)
        stored = cast("dict[str, torch.Tensor]", self.params._parameters)
        if self._offloaded:
            off = self._offloaded
            return [off[k].fresh() if k in off else stored[k] for k in self.params._keys]
        return [p.to_local() if isinstance(p, DTensor) else p for p in (stored[k] for k in self.params._keys)]

    def _param(self, key: str, local: torch.Tensor | None = None) -> DTensor:
        """The parameter ``key`` as the graph reads it: a ``(Replicate, tp)`` DTensor (a hook for
        wrappers such as FSDP's). ``local``: its local shard to read instead (:meth:`lower`)."""
        if local is None and key not in self._local:
            return cast(DTensor, self._cast(self.params[key]))
        tp_p, shape, stride = self._meta[key]
        if local is None:
            w = self._offloaded.get(key)
            local = self.params[key] if w is None else w.fresh()
        return _AsDTensor.apply(self._cast(local), self.mesh, tp_p, shape, stride)

    def full_param(self, key: str) -> torch.Tensor:
        """Parameter ``key`` as one full tensor (a collective over the mesh; an offloaded
        parameter gathers its working copy, on the device, equal to the master)."""
        w = self._offloaded.get(key)
        p = self.params[key].detach() if w is None else w.fresh().detach()
        return self._as_dtensor(key, p).full_tensor()

    def full_grad(self, key: str) -> torch.Tensor | None:
        """The (synchronised) gradient of ``key`` as one full tensor, or None. An offloaded
        parameter's is its working copy's while it has one (backward until the end of the sync),
        else its master's (brought to the device for the gather)."""
        w = self._offloaded.get(key)
        if w is None:
            g = self.params[key].grad
        else:
            g = w.copy.grad if w.copy.grad is not None else w.master.grad
            g = g if g is None else g.to(w.copy.device)
        return None if g is None else self._as_dtensor(key, g).full_tensor()

    def set_full_grad(self, key: str, full: torch.Tensor) -> None:
        """Set the gradient of ``key`` from a full tensor (identical on every rank); of an
        offloaded parameter, where :meth:`full_grad` reads it."""
        p = self.params[key]
        if not isinstance(p, DTensor):  # a local shard (FSDP's sharded parameters are DTensors)
            tp_p = self._meta[key][0]
            d = DTensor.from_local(full, self.mesh, [R, R], run_check=False).redistribute(self.mesh, (R, tp_p))
            w = self._offloaded.get(key)
            if w is None:
                p.grad = d.to_local().clone()
            elif w.copy.grad is not None:
                w.copy.grad = d.to_local().clone()
            else:
                p.grad = d.to_local().to(p.device, copy=True)
        else:
            # redistribute (not distribute_tensor): FSDP shards may be _StridedShard
            d = DTensor.from_local(full.to(_mesh_device(p.device_mesh)), p.device_mesh, [R] * p.device_mesh.ndim,
                                   run_check=False).redistribute(p.device_mesh, p.placements)
            local = p._local_tensor
            if d._local_tensor.device != local.device:  # FSDP's CPU offload: the grad lives on the host
                d = DTensor.from_local(d._local_tensor.to(local.device), p.device_mesh, p.placements, run_check=False,
                                       shape=p.shape, stride=p.stride())
            p.grad = d

    def _as_dtensor(self, key: str, t: torch.Tensor) -> DTensor:
        if isinstance(t, DTensor):
            dev = _mesh_device(t.device_mesh)
            if t._local_tensor.device.type != dev.type:  # FSDP's CPU offload: gather on the device
                return DTensor.from_local(t._local_tensor.to(dev), t.device_mesh, t.placements, run_check=False,
                                          shape=t.shape, stride=t.stride())
            return t
        tp_p, shape, stride = self._meta[key]
        return DTensor.from_local(t, self.mesh, (R, tp_p), run_check=False, shape=cast(torch.Size, shape),
                                  stride=stride)

    # -- gradients ----------------------------------------------------------------------------

    @torch.no_grad()
    def sync_grads(self) -> None:
        """All-reduce (sum) each grad to its parameter's storage layout: over dp (batch-sharded
        readers leave it ``Partial``) and over tp where sequence parallelism left it ``Partial``.
        Local parameters (:meth:`localize`) are summed over dp in buckets."""
        from galvatron_fx.runtime.buckets import all_reduce_coalesced

        local = [p.grad for k, p in self.params.items() if k in self._local and p.grad is not None]
        if local and self.mesh.size(0) > 1:
            all_reduce_coalesced(local, self.mesh.get_group("dp"))
        for k, p in self.params.items():
            if k not in self._local and p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)


class Executors(nn.ModuleList):
    """The executors of a module's layers, in order: an ``nn.ModuleList`` typed as holding
    :class:`LayerExecutor` s."""

    def __iter__(self) -> Iterator[LayerExecutor]:
        return cast("Iterator[LayerExecutor]", super().__iter__())
