"""The passes over a lowered layer's traced graphs (passes.clean_up_graphs,
passes.hoist_saved_collectives) and their direct-call form (runtime.graph_code), without processes."""

import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from galvatron_fx.passes.clean_up_graphs import drop_identity_views, drop_unused_ops
from galvatron_fx.passes.hoist_saved_collectives import HOIST_MAX_BYTES, hoist_saved_all_reduces
from galvatron_fx.runtime.graph_code import graph_callable

aten = torch.ops.aten
funcol = torch.ops._c10d_functional


def _f(x, w, b):
    y = torch.nn.functional.layer_norm(x, (4,), w, b, 1e-5)
    v, m = torch.var_mean(y, dim=0, keepdim=True)
    z = (y - m).to(torch.float64).sum(dim=[0], keepdim=True) * 0.5
    return z, v.float(), torch.full((2,), float("inf")), y.t().t()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g), torch.randn(4, generator=g), torch.randn(4, generator=g)


def test_graph_callable_computes_what_the_graph_module_does():
    gm = make_fx(_f)(*_inputs())
    fn = graph_callable(gm)
    assert fn is not gm.forward and "del " in fn.source  # values are dropped after their last use
    xs = _inputs()
    for got, want in zip(fn(*xs), gm(*xs)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_graph_callable_keeps_fx_code_for_graphs_with_attributes():
    const = torch.arange(4.0)
    gm = make_fx(lambda x: x + const)(torch.ones(4))
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    assert graph_callable(gm) == gm.forward


def test_identity_views_and_dead_ops_are_removed():
    gm = make_fx(_f)(*_inputs())
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert before.count(aten.t.default) == 2
    xs = _inputs()
    want = gm(*xs)
    assert drop_identity_views(gm) >= 1  # t(t(y)) is y
    drop_unused_ops(gm)
    after = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.t.default not in after and len(after) < len(before)
    for got, w in zip(gm(*xs), want):
        assert torch.equal(got, w)


def _backward_graph(saved_numel: list[int], shared: bool = False) -> fx.GraphModule:
    """A backward graph reading saved tensors: each is summed over a group and multiplied into
    the tangent (``shared``: the first saved tensor is read by the multiply too)."""
    g = fx.Graph()
    saved = []
    for i, numel in enumerate(saved_numel):
        ph = g.placeholder(f"saved_{i}")
        ph.meta["val"] = torch.empty(numel)
        saved.append(ph)
    tangent = g.placeholder("tangents_1")
    out = tangent
    for i, ph in enumerate(saved):
        red = g.call_function(funcol.all_reduce.default, (ph, "sum", "0"))
        w = g.call_function(funcol.wait_tensor.default, (red,))
        out = g.call_function(aten.mul.Tensor, (out, w))
        if shared and i == 0:
            out = g.call_function(aten.mul.Tensor, (out, ph))
    g.output((out,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_small_saved_all_reduces_are_hoisted():
    bw = _backward_graph([1, 4])
    hoisted = hoist_saved_all_reduces(bw, num_saved=2)
    assert [(i, g) for i, _, g in hoisted] == [(0, "0"), (1, "0")]
    targets = [n.target for n in bw.graph.nodes if n.op == "call_function"]
    assert funcol.all_reduce.default not in targets and funcol.wait_tensor.default not in targets
    # the placeholders now stand for the reduced values: the graph multiplies them in
    out = bw(torch.full((1,), 2.0), torch.full((4,), 3.0), torch.ones(4))[0]
    assert torch.equal(out, torch.full((4,), 6.0))


def test_all_reduces_that_must_stay_in_backward_are_kept():
    big = HOIST_MAX_BYTES // 4 + 1  # float32 elements over the limit
    bw = _backward_graph([1, big], shared=True)
    assert hoist_saved_all_reduces(bw, num_saved=2) == []  # the first is read unreduced too; the second is big
    targets = [n.target for n in bw.graph.nodes if n.op == "call_function"]
    assert targets.count(funcol.all_reduce.default) == 2
    # a tangent is no saved tensor
    bw = _backward_graph([1])
    assert hoist_saved_all_reduces(bw, num_saved=0) == []


def test_hoisted_work_is_tracked_until_waited():
    from galvatron_fx.runtime import lowered

    class Work:
        def __init__(self):
            self.waited = False

        def wait(self):
            self.waited = True

    lowered.wait_in_flight()
    works = [lowered._launch(Work()) for _ in range(lowered._MAX_IN_FLIGHT + 3)]
    assert len(lowered._IN_FLIGHT) == lowered._MAX_IN_FLIGHT
    assert [w.waited for w in works[:4]] == [True, True, True, False]  # the oldest, beyond the bound
    lowered._done(works[-1])  # a backward waited for it
    assert works[-1] not in lowered._IN_FLIGHT
    lowered._done(works[0])  # waited already: no error
    lowered.wait_in_flight()
    assert not lowered._IN_FLIGHT and all(w.waited for w in works[:-1])


def test_values_written_in_place_are_never_redistributed():
    """``y[:, 1:] = x[:, :-1]`` writes into a view of ``y``: the executor must hand the copy_ that
    view, and the view its base, as they are (a redistributed copy would lose the write)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from galvatron_fx.passes.apply_placements import written_through as _written_through

    def shift(x):
        y = x.new_zeros(x.shape)
        y[:, 1:] = x[:, :-1]
        return y * 2

    gm = make_fx(shift)(torch.randn(2, 5))
    pairs = {(u.target.__name__.split(".")[0], a.target.__name__.split(".")[0] if a.op == "call_function" else a.op)
             for u, a in _written_through(gm)}
    assert ("copy_", "slice") in pairs and ("slice", "new_zeros") in pairs
    assert not any(u == "mul" for u, _ in pairs)  # readers of the result move it as planned
