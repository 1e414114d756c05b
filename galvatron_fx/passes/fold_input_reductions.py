"""fold_input_reductions — a data-parallel sum of an exact count over a user input, computed from
the whole input instead: no collective.

Contract: requires ``"hoisted"`` (a :class:`~galvatron_fx.ir.program.LayerGraphs` of the simple
form, :func:`~galvatron_fx.passes.hoist_saved_collectives.simple_form`); produces ``"folded"``.
Every rank is handed each user input whole (the runtime takes its dp piece itself, see
:meth:`galvatron_fx.runtime.parallel_module.ParallelModule.run_layers`). A forward
``all_reduce(sum)`` over the layer's dp group whose operand is, in order,

1. a layer input that is a user input, laid out ``(Shard(0), Replicate())``;
2. pointwise ops (``torch.Tag.pointwise``) and views of it, each reading only such values and
   Python scalars (every value holds the input's elements in their row-major order);
3. one full ``sum`` of a bool or integer tensor (exact in any order);
4. dtype casts of that scalar,

is the same ops on the whole input (flattened: pointwise ops on values of one element order do
not care for their shape), summed and cast: the sum of the dp pieces' counts. The all-reduce and
its wait go; the forward takes the whole input as an extra placeholder ``whole_<input>`` after
its inputs; ``whole_inputs`` lists, in that order, the layer inputs (by position among the
non-parameter inputs) the runtime appends whole. A mean loss's count of targets over the global
batch (the labels not ignored), for instance, costs no collective and no wait in forward. The
numerics are those of the all-reduce: integer sums are exact, and a cast of the exact total is
at least as exact as the sum of cast pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx as fx
from torch.distributed.tensor import Replicate, Shard

from galvatron_fx.passes.clean_up_graphs import drop_unused_ops, recompiled
from galvatron_fx.passes.runner import PassContext, graph_pass

__all__ = ["fold_input_reductions", "fold_input_reductions_pass"]

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints)


def _val(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _cast_only(n: fx.Node) -> bool:
    """A dtype cast and nothing else (no device, layout or memory-format change)."""
    if n.op != "call_function":
        return False
    if n.target is aten._to_copy.default:
        return len(n.args) == 1 and set(n.kwargs) <= {"dtype"}
    return n.target is torch.ops.prims.convert_element_type.default and len(n.args) == 2 and not n.kwargs


def _chain(top: fx.Node, source: fx.Node) -> list[fx.Node] | None:
    """The pointwise ops and views from ``source`` to ``top`` in graph order, or None when
    ``top`` reads anything else (another tensor, a non-pointwise op)."""
    seen: dict[fx.Node, None] = {}
    numel = cast(torch.Tensor, _val(source)).numel()  # a placeholder with a tensor value
    stack = [top]
    while stack:
        n = stack.pop()
        if n is source or n in seen:
            continue
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) \
                or n.target._schema.is_mutable or torch.Tag.nondeterministic_seeded in n.target.tags:
            return None
        if n.target in _VIEWS:
            if not isinstance(n.args[0], fx.Node) or any(isinstance(a, fx.Node) for a in n.args[1:]):
                return None
            v = _val(n.args[0])
            if v is None or not v.is_contiguous():
                return None
        elif not (torch.Tag.pointwise in n.target.tags or _cast_only(n)):
            return None
        for a in (*n.args, *n.kwargs.values()):
            if isinstance(a, fx.Node):
                v = _val(a)
                if v is None or v.numel() != numel:  # no broadcasting: every value one element order
                    return None
                stack.append(a)
            elif isinstance(a, (list, tuple)) and any(isinstance(x, fx.Node) for x in a):
                return None
        seen[n] = None
    order = {n: i for i, n in enumerate(top.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def fold_input_reductions(fw: fx.GraphModule, whole_ok: dict[fx.Node, tuple[int, tuple]],
                          dp_group: str) -> list[int]:
    """Fold in ``fw`` every sum over ``dp_group`` of the form the module doc describes whose
    input placeholder is a key of ``whole_ok`` (placeholder -> its position among the layer's
    inputs and its whole shape); returns those positions, one per placeholder added, in order."""
    added: dict[fx.Node, fx.Node] = {}  # input placeholder -> its whole placeholder
    last_ph = [n for n in fw.graph.nodes if n.op == "placeholder"][-1]
    folded = 0
    for ar in list(fw.graph.nodes):
        if ar.op != "call_function" or ar.target is not torch.ops._c10d_functional.all_reduce.default:
            continue
        src, op, group = ar.args[:3]
        if op != "sum" or group != dp_group or len(ar.users) != 1:
            continue
        (wait,) = ar.users
        if wait.target is not torch.ops._c10d_functional.wait_tensor.default:
            continue
        casts = []
        n = src
        while isinstance(n, fx.Node) and n.op == "call_function" and _cast_only(n):
            casts.append(n)
            n = n.args[0]
        total = n
        if not (isinstance(total, fx.Node) and total.target is aten.sum.default and len(total.args) == 1
                and not total.kwargs):
            continue
        operand = cast(fx.Node, total.args[0])  # a node where ``_val`` finds a tensor
        v = _val(operand)
        if v is None or v.dtype.is_floating_point or v.dtype.is_complex:
            continue
        for ph in whole_ok:
            chain = _chain(operand, ph) if operand is not ph else []
            if chain is not None:
                break
        else:
            continue
        if ph not in added:
            with fw.graph.inserting_after(last_ph):
                whole = fw.graph.placeholder(f"whole_{ph.name}")
            whole.meta["val"] = torch.empty(tuple(whole_ok[ph][1]), dtype=cast(torch.Tensor, _val(ph)).dtype,
                                            device="meta")
            added[ph] = last_ph = whole
        whole = added[ph]
        with fw.graph.inserting_before(wait):
            env = {ph: fw.graph.call_function(aten.view.default, (whole, [-1]))}
            env[ph].meta["val"] = torch.empty(math.prod(whole.meta["val"].shape),
                                              dtype=cast(torch.Tensor, _val(ph)).dtype, device="meta")
            for n in chain:
                if n.target in _VIEWS:
                    env[n] = env[cast(fx.Node, n.args[0])]  # flat already: one element order
                    continue
                new = fw.graph.node_copy(n, env.__getitem__)
                new.meta["val"] = cast(Callable[..., Any], n.target)(
                    *fx.node.map_arg(new.args, lambda a: a.meta["val"]),
                    **fx.node.map_arg(new.kwargs, lambda a: a.meta["val"]))
                env[n] = new
            out: fx.Node = fw.graph.call_function(aten.sum.default, (env[operand],))
            out.meta["val"] = total.meta["val"]
            for c in reversed(casts):
                out = fw.graph.node_copy(c, cast(Callable[[fx.Node], fx.Node], lambda a, out=out: out))
                out.meta["val"] = c.meta["val"]
        wait.replace_all_uses_with(out)
        fw.graph.erase_node(wait)
        fw.graph.erase_node(ar)
        folded += 1
    if folded:
        drop_unused_ops(fw)  # the pieces' counts, if nothing else reads them
    recompiled(fw, folded)
    return [whole_ok[ph][0] for ph in added]


@graph_pass(requires=("hoisted",), produces=("folded",))
def fold_input_reductions_pass(prog, ctx: PassContext):
    """A lowered layer's forward with its dp sums over user inputs folded (see module doc);
    ``whole_inputs`` and the recorded forward collectives updated."""
    from galvatron_fx.ir.program import collectives_of

    mesh, mg, dl = ctx.mesh, ctx.graph, prog.decomposed
    if not prog.simple or mesh is None or mg is None or mesh.size(0) == 1:
        return prog
    users = set(mg.input_names)
    names = [n for n, role in zip(dl.input_names, dl.input_roles) if role != "param"]
    phs = [n for n in prog.fw.graph.nodes if n.op == "placeholder"]
    first = len(phs) - len(prog.trace.in_specs)
    whole_ok = {phs[first + i]: (i, tuple(spec[1])) for i, (name, spec) in enumerate(zip(names, prog.trace.in_specs))
                if name in users and tuple(spec[0]) == (Shard(0), Replicate()) and _val(phs[first + i]) is not None}
    if not whole_ok:
        return prog
    prog.whole_inputs = fold_input_reductions(prog.fw, whole_ok, mesh.get_group(0).group_name)
    if prog.whole_inputs:
        prog.fw_collectives = collectives_of(prog.fw, "fwd")
    return prog
