"""Data parallelism of a :class:`~galvatron_fx.runtime.parallel_module.ParallelModule`'s layers:
FSDP units, tied weights, gradient buckets and the gradient sync at the end of a step.

Contract: :class:`DataParallelMixin` is a base of ``ParallelModule``; it reads the host's
``plan``, ``layer_ids``, ``executors`` and ``mesh(dp, tp)``, and, after ``__init__`` built them,
``_tied`` (:meth:`DataParallelMixin._tied_groups`), ``_dtensor_params`` and ``_bucketers``
(:meth:`DataParallelMixin._grad_bucketers`). The host calls :meth:`~DataParallelMixin._shard_all`
and :meth:`~DataParallelMixin._share_tied` while building its executors; ``sync_grads`` after the
last backward of a step leaves every gradient in its parameter's layout, summed over dp and over
the copies of a tied weight.

Terms: a *unit* is what one ``fully_shard`` call covers (one layer, or the layers sharing one tied
weight stored alike); a *tied copy* is one of several parameters that hold one FQN; a *bucketer*
(:class:`~galvatron_fx.runtime.buckets.GradBucketer`) sums the plain local gradients of one dp
group in buckets.

Algorithm, per layer: a DDP layer keeps full replicas over dp and all-reduces
(sums) its gradients once per step, in its dp group's buckets — in the plan's reduce dtype, or as
PowerSGD factors (``plan.grad_comm``, :mod:`~galvatron_fx.runtime.buckets`). A ZeRO-2/ZeRO-3 layer with
``dp > 1`` is wrapped by FSDP2's ``fully_shard`` on its 2-D ``(dp, tp)`` mesh in the SPMD form
(``dp_mesh_dims=DataParallelMeshDims(shard="dp")``): the executor's ``(Replicate, tp)`` DTensor
parameters become ``(Shard(0) | _StridedShard(0), tp)`` shards (dim 0 split over dp, the tp
placement kept), FSDP all-gathers them back to ``(Replicate, tp)`` around the layer's forward
(ZeRO-3: again in backward, ``reshard_after_forward=True``; ZeRO-2 keeps them from forward to
backward) and reduce-scatters the dp-``Partial`` gradients after each backward. Scaling: the
executor's convention is a *sum* over dp of partial grads (the loss's mean already
divided each rank's share), so FSDP's default average is turned off
(``set_gradient_divide_factor(1.0)`` with plain-sum collectives, which gloo supports).
FSDP reduce-scatters in the plan's reduce dtype (``MixedPrecisionPolicy(reduce_dtype=...)``:
fp32 unless the plan chose a 16-bit sum; the sharded gradient is kept in fp32).
Accumulation: FSDP reduce-scatters once per micro-batch backward and accumulates the sharded
grads (the memory model's ZeRO-2/3: only ``1/dp`` gradients persist); no ``no_sync``.
The optimizer must be built after the ``ParallelModule`` (it sees the sharded parameters).

Offload (``LayerStrategy.offload``): a ZeRO-2/3 unit with ``dp > 1`` is sharded with FSDP2's
``CPUOffloadPolicy`` (pinned host memory on a GPU mesh): its sharded parameters, gradients and so
the optimizer's states live on the host; each gather copies the shards to the device, each
reduce-scatter's shard goes back (layers that differ in offload are never one unit). Every other
offloaded layer (DDP, or ``dp == 1``) keeps a host master per parameter and computes with a
device working copy (:meth:`~galvatron_fx.runtime.layer_exec.LayerExecutor.offload`): the
buckets, PowerSGD and the tied-copy sums all work on the working copies' gradients, and the end
of :meth:`DataParallelMixin.sync_grads` moves each one to its master's ``.grad`` on the host
(:meth:`DataParallelMixin._grads_to_host`), where the optimizer steps it; the next read of the
layer's parameters copies the stepped master back. With no offloaded layer nothing of this runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import DataParallelMeshDims
from torch.distributed.tensor import DTensor, Partial, Replicate

from galvatron_fx.errors import PlanError
from galvatron_fx.runtime.buckets import GradBucketer
from galvatron_fx.runtime.layer_exec import Executors, LayerExecutor
from galvatron_fx.runtime.powersgd import PowerSGD

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule

    from galvatron_fx.ir.plan import ParallelPlan

__all__ = ["DataParallelMixin"]

R = Replicate()


class _FSDPRoot(nn.Module):
    """The FSDP root of a :class:`ParallelModule`'s sharded layers (see ``_fsdp_root``)."""

    def __init__(self, units: Sequence[nn.Module]):
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self) -> None:
        return None


class DataParallelMixin:
    """FSDP sharding, tied weights and the gradient sync of a ``ParallelModule`` (see module doc)."""

    if TYPE_CHECKING:  # set or defined by the host ``ParallelModule``
        plan: ParallelPlan
        layer_ids: Sequence[int]
        executors: Executors
        _tied: list[list[tuple[LayerExecutor, str]]]
        _bucketers: dict[tuple[int, int], GradBucketer]
        _dtensor_params: list  # (executor, key) of the parameters kept as DTensors
        _working: list

        def mesh(self, dp: int, tp: int) -> DeviceMesh: ...

    # ---- sharding and tied weights --------------------------------------------------------------
    def _shard_all(self) -> None:
        """ZeRO-2/3 (``dp > 1``): FSDP2 over each layer's dp axis, summing (not averaging) grads.

        A *unit* is what one ``fully_shard`` call covers: one layer, or the layers that read one
        tied weight when all are sharded alike (same mesh, same stored layout of the weight, ZeRO
        on each); those share a single parameter (its gradient sums both uses in autograd) and
        gather it once, as FSDP's root does for a model's embedding and head. ZeRO-3 reshards after
        forward (and gathers again for backward), ZeRO-2 keeps the gathered parameters until the
        backward, as the plan priced each layer (a last layer, whose backward follows at once, is
        ZeRO-2 where the search found that cheaper). Layers that differ in ``offload`` are separate
        units; an offloaded unit keeps its shards on the host (``CPUOffloadPolicy``). Every unit then
        joins one FSDP root without parameters (:meth:`_fsdp_root`), so that they share FSDP's
        context: a gather is prefetched during the backward of the unit after it."""
        layers = dict(zip(self.layer_ids, self.executors))
        dp_type = {i: str(self.plan.layers[i].strategy.dp_type) for i in self.layer_ids}
        offload = {i: self.plan.layers[i].strategy.offload for i in self.layer_ids}
        for i, ex in layers.items():
            ex.fsdp = dp_type[i] in ("zero2", "zero3") and self.plan.layers[i].dp > 1 and \
                any(True for _ in ex.parameters())
        # units: union of FSDP layers sharing a tied weight stored alike on the same mesh
        unit = {i: i for i, ex in layers.items() if ex.fsdp}

        def find(i):
            while unit[i] != i:
                i = unit[i]
            return i

        owner: dict[str, tuple[int, str]] = {}  # fqn -> (first layer, key)
        for i, ex in layers.items():
            if not ex.fsdp:
                continue
            for key, fqn in ex.fqn_of_key.items():
                if fqn not in owner:
                    owner[fqn] = (i, key)
                    continue
                j, jkey = owner[fqn]
                a, b = layers[j].params[jkey], ex.params[key]
                if layers[j].mesh is ex.mesh and tuple(a.placements) == tuple(b.placements) and a.shape == b.shape \
                        and offload[i] == offload[j]:
                    unit[find(i)] = find(j)
                    ex.params[key] = a  # one parameter for both uses
        groups: dict[int, list[int]] = {}
        for i in unit:
            groups.setdefault(find(i), []).append(i)
        for members in list(groups.values()):
            exs = [layers[i] for i in members]
            ex = exs[0]
            # FSDP cannot shard a 0-dim parameter (CLIP's logit scale): such ones stay whole and
            # are summed over dp with the plain gradients (``_grad_bucketers``); a unit of only
            # those is no FSDP unit
            ignored = self._whole_scalars(exs)
            if all(p in ignored for e in exs for p in e.parameters()):
                for e in exs:
                    e.fsdp = False
                    e._fsdp_ignored.clear()
                del groups[members[0]]
                continue
            # mixed precision: FSDP gathers the parameters in the compute dtype and reduce-scatters
            # the gradients in the plan's reduce dtype (fp32 unless the plan chose a 16-bit sum)
            reduce = self._reduce_dtype()
            mp = MixedPrecisionPolicy(param_dtype=ex.compute_dtype, reduce_dtype=reduce or torch.float32) \
                if ex.compute_dtype is not None or reduce is not None else MixedPrecisionPolicy()
            reshard = all(dp_type[i] == "zero3" for i in members)
            # (one offload setting per unit: see the union above) pinned host memory only for a GPU
            off = CPUOffloadPolicy(pin_memory=ex.mesh.device_type == "cuda") if offload[members[0]] \
                else OffloadPolicy()
            if ex.mesh.size(1) == 1:
                # no tp: plain FSDP over the 1-D dp mesh; its gathered parameters are plain
                # tensors the layer graph reads as they are (no DTensor per parameter and step)
                self._plain_parameters(exs)
                fully_shard(cast("list[nn.Module]", exs) if len(exs) > 1 else ex, mesh=ex.mesh["dp"],
                            reshard_after_forward=reshard, mp_policy=mp, offload_policy=off,
                            ignored_params=ignored or None)
            else:
                # FSDP's SPMD form wants every parameter on the very mesh object it is given
                # (meshes are process-wide, see mesh(), so DTensor's spec cache hands back the same one)
                meshes = {id(cast(DTensor, p).device_mesh): cast(DTensor, p).device_mesh
                          for e in exs for p in e.parameters()}
                if len(meshes) != 1 or next(iter(meshes.values())) is not ex.mesh:
                    raise PlanError(f"layer {self.plan.layers[members[0]].name}: its parameters are not all on "
                                    f"the layer's (dp, tp) mesh {ex.mesh} (found {list(meshes.values())}); cannot "
                                    "shard them with FSDP")
                fully_shard(cast("list[nn.Module]", exs) if len(exs) > 1 else ex, mesh=ex.mesh,
                            reshard_after_forward=reshard, dp_mesh_dims=DataParallelMeshDims(shard="dp"), mp_policy=mp,
                            offload_policy=off, ignored_params=ignored or None)
            for e in exs:
                cast("FSDPModule", e).set_gradient_divide_factor(1.0)
                cast("FSDPModule", e).set_force_sum_reduction_for_comms(True)  # gloo has neither AVG nor PREMUL_SUM
        if groups:
            self._fsdp_root([layers[i] for members in groups.values() for i in members])

    @staticmethod
    def _whole_scalars(exs: list[LayerExecutor]) -> set[nn.Parameter]:
        """The 0-dim parameters of a unit's layers as plain local tensors (``ex._local``), marked
        ``ex._fsdp_ignored``: FSDP leaves them whole."""
        out: set[nn.Parameter] = set()
        plain: dict[int, nn.Parameter] = {}
        for ex in exs:
            for key, p in list(ex.params.items()):
                if p.ndim != 0:
                    continue
                if id(p) not in plain:
                    local = cast(DTensor, p.detach())._local_tensor if isinstance(p, DTensor) else p.detach()
                    plain[id(p)] = nn.Parameter(local, requires_grad=p.requires_grad)
                ex.params[key] = plain[id(p)]
                ex._local.add(key)
                ex._fsdp_ignored.add(key)
                out.add(plain[id(p)])
        return out

    @staticmethod
    def _plain_parameters(exs: list[LayerExecutor]) -> None:
        """The ``(Replicate, Replicate)`` parameters of tp=1 layers as plain tensors (shared ones
        stay shared), read like local ones (``ex._local``) by the layer's graph and interpreter."""
        plain: dict[int, nn.Parameter] = {}
        for ex in exs:
            for key, p in list(ex.params.items()):
                if not isinstance(p, DTensor):  # (plain already: a 0-dim one FSDP leaves whole)
                    continue
                if id(p) not in plain:
                    plain[id(p)] = nn.Parameter(cast(DTensor, p.detach())._local_tensor, requires_grad=p.requires_grad)
                ex.params[key] = plain[id(p)]
                ex._local.add(key)

    def _fsdp_root(self, units: list[LayerExecutor]) -> None:
        """An FSDP root over ``units`` (no parameters of its own), run once so that FSDP takes
        it as the root: the units then share FSDP's state and communication context (backward
        prefetch, one end-of-backward callback), and a unit of several layers is not taken for a
        root, which FSDP refuses. Each step's first unit to run does the root's per-step work."""
        root = _FSDPRoot(units)
        fully_shard(root, mesh=units[0].mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
        root()
        object.__setattr__(self, "_fsdp_root_module", root)  # not a submodule: no parameters of its own

    def _share_tied(self) -> None:
        """Layers outside FSDP that read one tied weight stored alike (plain local tensors of one
        shape and dtype, the same tp layout, the same mesh) share a single parameter, as the user's
        model does: autograd sums both uses into one gradient, which is reduced once, and the
        optimizer steps it once (FSDP units share theirs in :meth:`_shard_all`). Offloaded layers
        share theirs with offloaded layers only, master and working copy alike."""
        first: dict[str, tuple[LayerExecutor, str]] = {}
        for ex in cast("list[LayerExecutor]", self.executors):
            if ex.fsdp:
                continue
            for key, fqn in ex.fqn_of_key.items():
                if key not in ex._local:
                    continue
                if fqn not in first:
                    first[fqn] = (ex, key)
                    continue
                other, okey = first[fqn]
                a, b = other.params[okey], ex.params[key]
                if other.mesh is ex.mesh and other._meta[okey] == ex._meta[key] and a.shape == b.shape \
                        and a.dtype == b.dtype and a.requires_grad == b.requires_grad \
                        and (okey in other._offloaded) == (key in ex._offloaded):
                    ex.params[key] = a
                    if key in ex._offloaded:
                        ex._offloaded[key] = other._offloaded[okey]

    def _tied_groups(self) -> list[list[tuple[LayerExecutor, str]]]:
        """Per tied FQN, one ``(executor, key)`` per distinct parameter holding it (layers of one
        FSDP unit share theirs), where there are several."""
        by_fqn: dict[str, dict[int, tuple[LayerExecutor, str]]] = {}
        for ex in cast("list[LayerExecutor]", self.executors):
            for key, fqn in ex.fqn_of_key.items():
                by_fqn.setdefault(fqn, {}).setdefault(id(ex.params[key]), (ex, key))
        return [list(ps.values()) for ps in by_fqn.values() if len(ps) > 1]

    def _working_copies(self) -> list:
        """The :class:`~galvatron_fx.runtime.layer_exec._Working` pairs of this module's
        offloaded parameters, each once (tied layers share one), in layer order."""
        return list({id(w): w for ex in cast("list[LayerExecutor]", self.executors)
                     for w in ex._offloaded.values()}.values())

    def _grad_bucketers(self) -> dict[tuple[int, int], GradBucketer]:
        """Every plain local parameter of a ``dp > 1`` layer joins its dp group's
        :class:`GradBucketer`, last layer first (an offloaded parameter's working copy, which
        backward fills). Tied copies stored whole (tp ``Replicate``) on
        equal mesh shapes are one bucket entry (summed locally, reduced once; at ``dp == 1`` only
        summed: ``_local_tied``); other tied copies are summed as full tensors (``_slow_tied``)."""
        self._local_tied, self._slow_tied = [], []
        fast: dict[tuple[int, int], list[list[torch.Tensor]]] = {}
        for ps in self._tied:
            whole = all(k in ex._local and not ex.fsdp and isinstance(ex._meta[k][0], Replicate) for ex, k in ps)
            shapes = {(ex.mesh.size(0), ex.mesh.size(1)) for ex, _ in ps}
            if not (whole and len(shapes) == 1):
                self._slow_tied.append(ps)
            elif next(iter(shapes))[0] == 1:
                self._local_tied.append(ps)
            else:
                fast.setdefault(next(iter(shapes)), []).append([ex.grad_param(k) for ex, k in ps])
        in_fast = {id(p) for groups in fast.values() for g in groups for p in g}
        by_group: dict[tuple[int, int], list] = {}
        seen: set[int] = set()
        for ex in cast("list[LayerExecutor]", self.executors):  # in forward order, then reversed: a parameter
            if ex.mesh.size(0) == 1:  # shared by layers (_share_tied) joins where backward finishes it
                continue
            for k in ex.params:
                if ex.fsdp and k not in ex._fsdp_ignored:  # (FSDP reduce-scatters its own)
                    continue
                p = ex.grad_param(k)
                if k in ex._local and p.requires_grad and id(p) not in in_fast and id(p) not in seen:
                    seen.add(id(p))
                    by_group.setdefault((ex.mesh.size(0), ex.mesh.size(1)), []).append(p)
        for ps in by_group.values():
            ps.reverse()
        for shape, groups in fast.items():  # ready when the last copy is: at the end of backward
            by_group.setdefault(shape, []).extend(groups)
        gc = self.plan.grad_comm
        out = {}
        for shape, es in by_group.items():
            if not es:
                continue
            group = self.mesh(*shape).get_group("dp")
            psgd = PowerSGD(gc.powersgd_rank, group, reduce_dtype=self._reduce_dtype(),
                            start_step=gc.powersgd_start_step) if gc.powersgd_rank else None
            out[shape] = GradBucketer(es, group, reduce_dtype=self._reduce_dtype(), powersgd=psgd)
        return out

    def _reduce_dtype(self) -> torch.dtype | None:
        """The dtype the plan sums data-parallel gradients in, when not fp32 (``plan.grad_comm``)."""
        dtype = self.plan.grad_comm.reduce_dtype
        return None if dtype == "float32" else getattr(torch, dtype)

    # ---- gradient sync ------------------------------------------------------------------------
    @torch.no_grad()
    def sync_grads(self) -> None:
        """Reduce every grad to its parameter's layout and sum tied copies (see
        :meth:`_grad_bucketers`). FSDP layers reduce-scattered theirs in backward; the plain
        (DDP-flavour) local grads of all layers sharing a dp group are summed in buckets, launched
        during the last backward when :meth:`train_step` armed them, else here. Offloaded
        parameters' gradients are then moved to their host masters (:meth:`_grads_to_host`)."""
        for bucketer in self._bucketers.values():
            bucketer.finish()
        for ps in self._local_tied:
            grads = [g for g in (ex.grad_param(k).grad for ex, k in ps) if g is not None]
            if grads:
                total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0]
                for ex, k in ps:
                    ex.grad_param(k).grad = total.clone()
        for ex, k in self._dtensor_params:  # parameters kept as DTensors (FSDP reduced theirs)
            p = ex.params[k]
            if p.grad is not None and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        for ps in self._slow_tied:
            self._sum_full(ps)
        if self._working:
            self._grads_to_host()

    def _grads_to_host(self) -> None:
        """Each offloaded working copy's gradient into its host master's ``.grad`` (added to one
        there, as autograd accumulates), the working copy's dropped (see
        :meth:`~galvatron_fx.runtime.layer_exec._Working.grad_to_host`)."""
        for w in self._working:
            w.grad_to_host()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``nn.Module.zero_grad``, and the gradients offloaded layers' working copies hold from a
        backward whose sync has not run (they are no parameters of the module)."""
        cast(nn.Module, super()).zero_grad(set_to_none)
        for w in getattr(self, "_working", ()):
            w.copy.grad = None

    @staticmethod
    def _sum_full(ps) -> None:
        grads = [ex.grad_param(k).grad for ex, k in ps]
        if all(isinstance(g, DTensor) for g in grads) and \
                len({(tuple(g.placements), tuple(g.device_mesh.mesh.flatten().tolist()), g.device_mesh.mesh.shape,
                      tuple(g._local_tensor.shape), g._local_tensor.device) for g in grads}) == 1:
            # copies sharded alike (FSDP on equal meshes): the sum of the shards is the shard of the sum
            total = grads[0]._local_tensor.clone()
            for g in grads[1:]:
                total += g._local_tensor
            for (ex, k), g in zip(ps, grads):
                ex.params[k].grad = DTensor.from_local(total.clone(), g.device_mesh, g.placements, run_check=False,
                                                       shape=g.shape, stride=g.stride())
            return
        fulls = [g for g in (ex.full_grad(k) for ex, k in ps) if g is not None]
        if fulls:
            total = torch.stack(fulls).sum(0) if len(fulls) > 1 else fulls[0]
            for ex, k in ps:
                ex.set_full_grad(k, total)

    def _loss_carrier(self, layout) -> GradBucketer | None:
        """The gradient bucketer that can sum a loss laid out as ``layout`` (``(mesh,
        placements)`` or None, see :func:`_local_and_layout`) with its last bucket: a sum or mean
        over dp (``Partial``), replicated over tp, on a mesh whose dp group that bucketer reduces
        over."""
        if layout is None or layout[0].ndim != 2:
            return None
        mesh, (dp_p, tp_p) = layout
        bucketer = self._bucketers.get((mesh.size(0), mesh.size(1)))
        if bucketer is None or mesh is not self.mesh(mesh.size(0), mesh.size(1)) or not isinstance(tp_p, Replicate) \
                or not (isinstance(dp_p, Partial) and dp_p.reduce_op in ("sum", "avg")):
            return None
        return bucketer

    @staticmethod
    def _reduce_async(value: torch.Tensor, layout) -> torch.Tensor:
        """The local loss ``value`` laid out as ``layout`` made replicated, its collective
        launched now and waited for when the result is read; as it is without a layout."""
        if layout is None:
            return value
        mesh, placements = layout
        dt = DTensor.from_local(value, mesh, placements, run_check=False, shape=value.shape, stride=value.stride())
        return dt.redistribute(mesh, [R] * mesh.ndim, async_op=True).to_local()
