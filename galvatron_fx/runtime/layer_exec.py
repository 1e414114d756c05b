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
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from galvatron_fx.ir.graph import LayerInfo, ModelGraph
from galvatron_fx.ir.layer_option import LayerOption
from galvatron_fx.passes.apply_placements import PlacedLayer
from galvatron_fx.passes.decompose_layer import DecomposedLayer, decompose_layer
from galvatron_fx.passes.layout_autograd import _AsDTensor
from galvatron_fx.runtime.lowered import _Lowered

log = logging.getLogger(__name__)
R = Replicate()


class LayerExecutor(nn.Module, PlacedLayer):
    """One planned layer on a ``(dp, tp)`` mesh, with its parameters (see module doc).

    ``params`` maps the decomposed layer's parameter input names (``dl.input_names``, the
    captured graph's placeholder names) to real tensors; ``fqns`` maps the same names to the
    user's FQNs (used to name the executor's parameters; tied placeholders share one).
    """

    replicate_plain = False

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
        self.lowered = None  # the traced local-op function (see lower())
        self._local: set[str] = set()  # parameters stored as plain local shards (localize())
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
        return self._interpret(xs)

    # -- lowering -----------------------------------------------------------------------------

    def lower(self, share_with: LayerExecutor | None = None, program=None) -> None:
        """Run the layer as graphs of local ATen ops and functional collectives
        (:class:`_Lowered`): ``program``'s (its :class:`~galvatron_fx.ir.program.LayerGraphs`),
        else traced at the first call; ``share_with``: an executor of the same kind, option, mesh
        and parameter storage whose graphs this one runs too (parameters line up by position)."""
        if share_with is not None and share_with is not self and share_with.lowered is not None:
            self.lowered = share_with.lowered
        else:
            self.lowered = _Lowered(self, program)

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

    def local_params(self) -> list[torch.Tensor]:
        """This rank's shard of every parameter, in ``self.params`` order, as a lowered layer
        reads them (differentiably: an FSDP-unsharded DTensor's local tensor; a hook for callers
        that keep the parameters elsewhere)."""
        # the ParameterDict's own storage (its values() goes through __getitem__ per key; FSDP
        # swaps parameters in place there, so this sees the current ones)
        stored = self.params._parameters
        return [p.to_local() if isinstance(p, DTensor) else p for p in (stored[k] for k in self.params._keys)]

    def _param(self, key: str, local: torch.Tensor | None = None) -> DTensor:
        """The parameter ``key`` as the graph reads it: a ``(Replicate, tp)`` DTensor (a hook for
        wrappers such as FSDP's). ``local``: its local shard to read instead (:meth:`lower`)."""
        if local is None and key not in self._local:
            return self._cast(self.params[key])
        tp_p, shape, stride = self._meta[key]
        t = self._cast(self.params[key] if local is None else local)
        return _AsDTensor.apply(t, self.mesh, tp_p, shape, stride)

    def full_param(self, key: str) -> torch.Tensor:
        """Parameter ``key`` as one full tensor (a collective over the mesh)."""
        return self._as_dtensor(key, self.params[key].detach()).full_tensor()

    def full_grad(self, key: str) -> torch.Tensor | None:
        """The (synchronised) gradient of ``key`` as one full tensor, or None."""
        g = self.params[key].grad
        return None if g is None else self._as_dtensor(key, g).full_tensor()

    def set_full_grad(self, key: str, full: torch.Tensor) -> None:
        """Set the gradient of ``key`` from a full tensor (identical on every rank)."""
        p = self.params[key]
        if not isinstance(p, DTensor):  # a local shard (FSDP's sharded parameters are DTensors)
            tp_p = self._meta[key][0]
            d = DTensor.from_local(full, self.mesh, [R, R], run_check=False).redistribute(self.mesh, (R, tp_p))
            p.grad = d.to_local().clone()
        else:
            # redistribute (not distribute_tensor): FSDP shards may be _StridedShard
            d = DTensor.from_local(full, p.device_mesh, [R] * p.device_mesh.ndim, run_check=False)
            p.grad = d.redistribute(p.device_mesh, p.placements)

    def _as_dtensor(self, key: str, t: torch.Tensor) -> DTensor:
        if isinstance(t, DTensor):
            return t
        tp_p, shape, stride = self._meta[key]
        return DTensor.from_local(t, self.mesh, (R, tp_p), run_check=False, shape=shape, stride=stride)

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
