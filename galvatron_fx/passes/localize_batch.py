"""localize_batch — the captured graph re-instantiated at a data-parallel rank's share of the batch.

Contract: :func:`localized` takes a :class:`~galvatron_fx.ir.graph.ModelGraph` whose
``batch_scaling`` is known (a probe capture at another batch:
:func:`~galvatron_fx.passes.batch_probe.mark_batched`) and a local batch; returns a copy whose graph takes
the user inputs at that batch — every integer argument that follows the batch (a ``view``'s
``B*T``, an ``arange``'s ``B``, a mask's ``full((B, 1, T, T))``) scaled to it, fake values
propagated again — with the same node and layer names, or None (with the reason logged) where
that is not possible. The captured graph is not changed. :func:`local_problem` says why one
layer cannot run on its rank's share of the batch as plain local ops (None when it can).

Terms: a layer runs *locally* (as ``DistributedDataParallel`` runs a module) when each
data-parallel rank runs the layer's own ops on its share of the batch, with no DTensor and no
collective inside the layer. That is exact where each sample's outputs depend only on that
sample's inputs, whatever the layer does in between (a mixture-of-experts block sorts all its
tokens by expert and counts them: each token's output is still its own). A layer is *coupled*
when one of its values holds the batch in two dims (CLIP's image × text similarities): it mixes
samples, and runs with the whole batch's semantics (DTensor on the data-parallel axis). A layer
with an output computed from the batch that holds no batch dim (a loss, a batch statistic) is
*batch-reduced*: it too keeps the whole batch's semantics.

Algorithm: copy the graph, rewrite the recorded integer arguments (``value × b / B``), and run
fake-tensor propagation from the user inputs' local shapes (parameters and buffers whole).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from galvatron_fx.ir.graph import LayerInfo, ModelGraph

log = logging.getLogger(__name__)

__all__ = ["local_problem", "localized"]


@contextlib.contextmanager
def quiet_fake_tensor_log():
    """Fake tensors log every op that fails (a traceback at ERROR level); inside, a failure is an
    answer the caller handles (a graph that does not run at another batch), not an error."""
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        quiet.setLevel(level)


def localized(mg: ModelGraph, batch: int) -> ModelGraph | None:
    """``mg`` at ``batch`` samples (see module doc); ``mg`` itself at its own batch; None where
    the graph cannot be re-instantiated (no probe, sizes not in proportion, propagation fails).
    Kept on ``mg``'s graph module: one copy per batch."""
    s = mg.batch_scaling
    if s is None:
        return mg if mg.example_shapes and mg.example_shapes[0][0] == batch else None
    if batch == s.batch:
        return mg
    cache = mg.gm.meta.setdefault("gfx_localized", {})
    if batch not in cache:
        try:
            cache[batch] = _localize(mg, batch)
        except Exception as e:  # a graph that does not scale: its layers keep the whole batch's semantics
            log.info("the graph of %s cannot be re-instantiated at %d samples (%s: %s); its layers run with "
                     "DTensor on the data-parallel axis", mg.name, batch, type(e).__name__, e)
            cache[batch] = None
    return cache[batch]


def _localize(mg: ModelGraph, batch: int) -> ModelGraph:
    from torch._subclasses.fake_tensor import FakeTensorMode

    s = mg.batch_scaling
    assert s is not None
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(mg.gm.graph, env)
    graph.output(out)
    failed: set[str] = set()  # nodes that do not run at this batch (a value holding the batch twice), and after
    for old, new in env.items():
        new.name = old.name  # (graph_copy keeps names where free; make sure)
        if old.name in s.irregular:
            failed.add(old.name)
        elif old.name in s.ints:
            leaves, spec = tree_flatten((new.args, new.kwargs))
            for i, v in s.ints[old.name]:
                local = s.scales(v, batch)
                if local is None:
                    failed.add(old.name)
                    break
                leaves[i] = local
            new.args, new.kwargs = tree_unflatten(leaves, spec)
    gm = fx.GraphModule(mg.gm, graph)
    by_name = mg.nodes_by_name()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    vals: dict[fx.Node, Any] = {}
    with quiet_fake_tensor_log(), mode:
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                v = by_name[n.name].meta["val"]
                if not isinstance(v, torch.Tensor):
                    vals[n] = v
                    continue
                shape = list(v.shape)
                for d in (s.dims.get(n.name) or ((),))[0]:
                    local = s.scales(int(shape[d]), batch)
                    if local is None:
                        raise ValueError(f"input {n.name}: dim {d} of {tuple(shape)} does not scale to {batch}")
                    shape[d] = local
                vals[n] = torch.empty(shape, dtype=v.dtype, device=v.device)
            elif n.op == "get_attr":
                vals[n] = getattr(gm, n.target)
            elif n.op == "call_function":
                if n.name in failed or any(a.name in failed for a in n.all_input_nodes):
                    failed.add(n.name)
                    continue
                args = fx.node.map_arg(n.args, vals.__getitem__)
                kwargs = fx.node.map_arg(n.kwargs, vals.__getitem__)
                try:
                    vals[n] = n.target(*args, **kwargs)
                except Exception:
                    failed.add(n.name)
                    continue
            else:
                continue
            n.meta["val"] = vals[n]
    gm.meta["gfx_not_local"] = failed
    return dataclasses.replace(mg, gm=gm, exported=None,
                               example_shapes=[(batch, *shape[1:]) for shape in mg.example_shapes])


def local_problem(mg: ModelGraph, layer: LayerInfo, dp: int) -> str | None:
    """Why ``layer`` cannot run locally on each of ``dp`` ranks' share of the captured batch
    (see module doc), or None when it can."""
    coupled = mg.coupled().get(layer.name)
    if coupled:
        return f"its value {coupled} holds the batch in two dims (it couples samples)"
    if dp == 1:
        return None
    s = mg.batch_scaling
    if s is None:
        return "no probe capture says which sizes follow the batch"
    batch = s.batch
    if batch % dp:
        return f"the batch of {batch} does not split evenly over {dp} ranks"
    irregular = [n for n in layer.node_names if n in s.irregular]
    if irregular:
        return f"{irregular[0]} does not follow the batch in proportion"
    by_name = mg.nodes_by_name()
    from_inputs = _from_inputs(mg)
    for name in layer.output_names:
        v = by_name[name].meta.get("val")
        if name in from_inputs and isinstance(v, torch.Tensor) and 0 not in (s.dims.get(name) or ((),))[0]:
            return f"its output {name} is computed from the batch but holds no batch dim (it reduces over samples)"
    local = localized(mg, batch // dp)
    if local is None:
        return f"the graph cannot be re-instantiated at {batch // dp} samples"
    failed = [n for n in layer.node_names if n in local.gm.meta.get("gfx_not_local", ())]
    if failed:
        return f"its node {failed[0]} does not run at {batch // dp} samples"
    return None


def _from_inputs(mg: ModelGraph) -> set[str]:
    """Names of the captured graph's values computed from a user input."""
    cache = mg.gm.meta.get("gfx_from_inputs")
    if cache is None:
        seeds = set(mg.input_names)
        cache = set()
        for n in mg.gm.graph.nodes:
            if n.name in seeds or any(a.name in cache for a in n.all_input_nodes):
                cache.add(n.name)
        mg.gm.meta["gfx_from_inputs"] = cache
    return cache
