"""placement_ilp — the placement ILP of one layer: its data, its solver and its oracle.

The formulation is :mod:`~galvatron_fx.search.intra_layer`'s (which builds the
:class:`PlacementProblem` from a layer's graph). Large problems are solved with alike nodes
tied (:func:`alike_nodes`): nodes whose ILP data agree (strategies, costs, forbidden choices,
the values they make) and whose neighbours, to :data:`TIE_ROUNDS` steps either way, agree too
get one strategy between them. A layer that unrolls a loop (Mamba's selective scan: 256 time
steps of the same few ops) then has one set of variables per step's op, not per op: the tied
ILP is exact for the assignment it returns (each node, edge and value keeps its own cost),
it only leaves out assignments that treat alike nodes differently.

A view hands its consumers' partial gradient on to its producer (rather than summing it). In a
problem of more than :data:`SPLIT_ABOVE` edge products that is modelled by two copies of each of
its pass-through strategies, one that hands a partial gradient on and one that hands none back
(:func:`_split_pass_through`): every term is then a pair of strategies and the relaxation stays
tight (a T5 block at tp 8: 0.4 s instead of 8–12 s). Smaller problems keep a variable per view
and the same optimum (equal-cost assignments may differ between the two models).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from galvatron_fx.cluster import Collective
from galvatron_fx.errors import PlanError
from galvatron_fx.ir.placements import NodePlacement, R, parse_placement, pstr

TIE_ABOVE = 20_000  # edge products above which alike nodes are tied
TIE_ROUNDS = 3
SPLIT_ABOVE = 1_000  # edge products above which views' pass-through strategies are split

# concurrent solves (:func:`solver_job`): a job's own Python work holds this lock, the solver
# releases it while it runs (HiGHS releases the GIL), so several layers' ILPs solve at once
_JOB_LOCK = threading.Lock()
_in_job = threading.local()


@contextlib.contextmanager
def solver_job():
    """Run one of several concurrent jobs that solve placement ILPs: everything but the
    solver's own run is serialised with the other jobs (nothing in the Python work needs to be
    thread-safe), the solver runs concurrently with theirs."""
    with _JOB_LOCK:
        _in_job.on = True
        try:
            yield
        finally:
            _in_job.on = False


@contextlib.contextmanager
def _others_run():
    """Inside a :func:`solver_job`, the lock is free while the solver runs: the other jobs'
    Python work goes on meanwhile."""
    if not getattr(_in_job, "on", False):
        yield
        return
    _JOB_LOCK.release()
    try:
        yield
    finally:
        _JOB_LOCK.acquire()


def _collective(src: Placement, dst: Placement) -> str | None:
    if src == dst:
        return None
    if isinstance(src, Partial):
        return Collective.REDUCE_SCATTER if isinstance(dst, Shard) else Collective.ALL_REDUCE
    if isinstance(src, Shard) and isinstance(dst, Replicate):
        return Collective.ALL_GATHER
    if isinstance(src, Shard) and isinstance(dst, Shard):
        return Collective.ALL_TO_ALL
    if isinstance(dst, Partial):
        return None  # R/S -> P is a local zeroing
    return None  # R -> S is a local slice


def _dual(p: Placement) -> Placement:
    """The gradient placement the producer of a value with placement ``p`` needs."""
    return R if isinstance(p, (Partial, Replicate)) else p



class _Model:
    """Variable bookkeeping for ``scipy.optimize.milp``."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.compute_cost: list[float] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, cost: float = 0.0, *, compute: bool = False) -> int:
        self.cost.append(cost)
        self.compute_cost.append(cost if compute else 0.0)
        return len(self.cost) - 1

    def row(self, coefs: dict[int, float], lo: float, hi: float) -> None:
        self.rows.append((coefs, lo, hi))

    def solve(self) -> np.ndarray:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        n = len(self.cost)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        lo = np.empty(len(self.rows))
        hi = np.empty(len(self.rows))
        for i, (coefs, l, h) in enumerate(self.rows):
            rows.extend([i] * len(coefs))
            cols.extend(coefs.keys())
            vals.extend(coefs.values())
            lo[i], hi[i] = l, h
        a = coo_matrix((vals, (rows, cols)), shape=(len(self.rows), n)).tocsr()
        # costs in microseconds: in seconds, gaps of 1e-8 (a small collective) fall under the
        # solver's optimality tolerances and it stops at a worse assignment
        with _others_run():
            res = milp(np.asarray(self.cost) * 1e6, constraints=LinearConstraint(a, lo, hi),
                       integrality=np.ones(n), bounds=Bounds(0, 1), options={"time_limit": 60})
        if res.x is None:
            raise PlanError(f"the intra-layer placement ILP found no solution ({res.message})")
        return np.round(res.x).astype(int)


@dataclass
class _Value:
    """One tensor value of the decomposed layer: who makes it, who reads it."""

    producer: str
    index: int
    nbytes: int
    ndim: int
    has_grad: bool
    consumers: list[tuple[str, int]]  # (node, tensor-input slot)


@dataclass
class PlacementProblem:
    """The ILP's data, independent of fx: what :func:`solve_placement` and :func:`evaluate`
    read. Node ids are in topological order; ``fixed`` forbids strategies (layer boundaries)."""

    nodes: list[str]
    strategies: dict[str, list[NodePlacement]]
    compute_s: dict[str, list[float]]
    values: list[_Value]
    view_like: set[str]
    reshard_s: Callable[[Placement, Placement, int, int], float]  # (src, dst, nbytes, ndim) -> seconds
    forbidden: set[tuple[str, int]] = field(default_factory=set)
    # collectives inside a node's kernel under a strategy (vocab-parallel cross-entropy): per
    # node, per strategy, ``(direction, collective, bytes, seconds)``
    inner: dict[str, list[list[tuple[str, str, int, float]]]] = field(default_factory=dict)
    no_grad: set[str] = field(default_factory=set)  # nodes that hand no gradient back (detach)

    def inner_s(self, node: str, i: int) -> float:
        return sum(e[3] for e in self.inner[node][i]) if node in self.inner else 0.0

    def passes(self, node: str, s: NodePlacement) -> bool:
        return node in self.view_like and _passes_through(s)


def evaluate(problem: PlacementProblem, choice: dict[str, int]) -> tuple[float, list[tuple[str, str, str, float]]]:
    """The objective of one assignment, computed directly (the oracle the ILP is tested against).

    Returns the total seconds and the redistributions ``(direction, value, collective, seconds)``.
    """
    pr = problem
    total = sum(pr.compute_s[n][choice[n]] + pr.inner_s(n, choice[n]) for n in pr.nodes)
    events: list[tuple[str, str, str, float]] = []
    gp: dict[tuple[str, int], bool] = {}
    order = {n: i for i, n in enumerate(pr.nodes)}
    for v in sorted(pr.values, key=lambda v: -order[v.producer]):
        sa = pr.strategies[v.producer][choice[v.producer]]
        src = sa.outputs[v.index]
        if src is None:
            continue
        fwd: set[str] = set()
        grads: set[str] = set()
        for n, k in v.consumers:
            sb = pr.strategies[n][choice[n]]
            dst = sb.inputs[k] if k < len(sb.inputs) else None
            if dst is not None and dst != src and not isinstance(dst, Partial):
                fwd.add(pstr(dst))
            if not v.has_grad or dst is None or n in pr.no_grad:
                continue
            if pr.passes(n, sb):
                if gp.get((n, 0), False):
                    grads.add("P")
                continue
            g = sb.grad_of_input(k)
            if g is not None:
                grads.add(pstr(g))
        name = f"{v.producer}[{v.index}]"
        for key in sorted(fwd):
            t = pr.reshard_s(src, parse_placement(key), v.nbytes, v.ndim)
            total += t
            if (c := _collective(src, parse_placement(key))) is not None and t > 0:
                events.append(("fwd", name, str(c), t))
        want = _dual(src)
        for key in sorted(grads):
            g = parse_placement(key)
            if g == want:
                continue
            if isinstance(g, Partial) and pr.passes(v.producer, sa):
                gp[(v.producer, v.index)] = True
                continue
            t = pr.reshard_s(g, want, v.nbytes, v.ndim)
            total += t
            if (c := _collective(g, want)) is not None and t > 0:
                events.append(("bwd", name, str(c), t))
    return total, events


@dataclass(frozen=True)
class _PassThrough(NodePlacement):
    """A view's replicated strategy that hands its consumers' partial gradient on to its producer
    (``partial``) or hands back none of its own (the ILP's copy of a pass-through strategy)."""

    partial: bool = False

    def grad_of_input(self, k: int) -> Placement | None:
        return Partial() if self.partial and self.inputs[k] is not None else None


def _split_pass_through(pr: PlacementProblem) -> tuple[PlacementProblem, dict[str, list[int]]]:
    """``pr`` with each pass-through strategy of a view split in two: handing a partial gradient
    on, or none. The choice becomes a property of the strategy, so that "a consumer hands the view
    a partial gradient" is a pair of strategies the ILP forbids (the view's no-partial copy with a
    consumer that hands one) rather than a product of three variables, whose linearisation is weak
    (its LP bound left the solver seconds of branching on a 4k-variable layer). Returns the split
    problem and, per node, the original index of each of its strategies."""
    strategies: dict[str, list[NodePlacement]] = {}
    back: dict[str, list[int]] = {}
    compute: dict[str, list[float]] = {}
    inner: dict[str, list] = {}
    forbidden: set[tuple[str, int]] = set()
    for n in pr.nodes:
        ss: list[NodePlacement] = []
        idx: list[int] = []
        for i, s in enumerate(pr.strategies[n]):
            if pr.passes(n, s):
                copies: list[NodePlacement] = [_PassThrough(s.inputs, s.outputs, False),
                                              _PassThrough(s.inputs, s.outputs, True)]
            else:
                copies = [s]
            for c in copies:
                if (n, i) in pr.forbidden:
                    forbidden.add((n, len(ss)))
                ss.append(c)
                idx.append(i)
        strategies[n], back[n] = ss, idx
        compute[n] = [pr.compute_s[n][i] for i in idx]
        if n in pr.inner:
            inner[n] = [pr.inner[n][i] for i in idx]
    split = dataclasses.replace(pr, strategies=strategies, compute_s=compute, forbidden=forbidden, inner=inner)
    return split, back


def solve_placement(problem: PlacementProblem) -> tuple[dict[str, int], float, int]:
    """Solve the ILP of :mod:`~galvatron_fx.search.intra_layer` on ``problem``: (choice per node,
    objective, #variables). A problem of more than :data:`TIE_ABOVE` edge products is solved with
    its alike nodes tied (:func:`alike_nodes`): exact for the assignment it returns, and far
    smaller where a layer repeats a step (an unrolled scan). A view's pass-through strategies
    are split first (:func:`_split_pass_through`): the same optimum, a tighter model."""
    products = _edge_products(problem)
    if products > SPLIT_ABOVE:
        pr, back = _split_pass_through(problem)
    else:
        pr, back = problem, {n: list(range(len(s))) for n, s in problem.strategies.items()}
    m = _Model()
    tie = alike_nodes(pr) if products > TIE_ABOVE else None
    if tie is None:
        x = {n: [m.var(c + pr.inner_s(n, i)) for i, c in enumerate(pr.compute_s[n])] for n in pr.nodes}
        heads = pr.nodes
    else:
        x = {}
        for n in pr.nodes:
            x[n] = x[tie[n]] if tie[n] in x else [m.var(0.0) for _ in pr.compute_s[n]]
            for i, c in enumerate(pr.compute_s[n]):
                m.cost[x[n][i]] += c + pr.inner_s(n, i)
        heads = [n for n in pr.nodes if tie[n] == n]
    for n in heads:  # _add_choice_constraints: exactly one strategy per node
        m.row({v: 1.0 for v in x[n]}, 1, 1)
    for n, i in sorted(pr.forbidden):
        if tie is None or tie[n] == n:
            m.row({x[n][i]: 1.0}, 0, 0)
    # unsplit, a view's "hands a partial gradient on" is a variable of its own
    gp = {(n, 0): m.var(0.0) for n in heads if n in pr.view_like and pr is problem}
    if tie is not None and gp:
        gp.update({(n, 0): gp[(tie[n], 0)] for n in pr.nodes if n in pr.view_like})
    pair_memo: dict[tuple[str, str], list[list[int]]] = {}

    def pairs_of(u: str, n: str) -> list[list[int]]:
        if tie is None:
            return _pair_vars(m, x[u], x[n])
        key = (tie[u], tie[n])
        if key not in pair_memo:
            pair_memo[key] = _pair_vars(m, x[u], x[n])
        return pair_memo[key]

    done: dict[tuple, list[tuple]] = {}  # tied: a value alike to one seen has its terms again
    charged: dict[tuple, int] = {}
    slots: dict[tuple[str, int], list] = {}
    for v in pr.values:
        key = None if tie is None else (tie[v.producer], v.index, v.nbytes, v.ndim, v.has_grad,
                                        tuple((tie[n], k) for n, k in v.consumers))
        terms = done.get(key) if key is not None else None
        if terms is None:
            terms = _value_terms(pr, v, pairs_of, slots, gp)
            if key is not None:
                done[key] = terms
        for t in terms:
            if t[0] == "charge":
                _charge(m, t[1], t[2], charged if tie is not None else None)
            elif t[0] == "at_least":
                _at_least(m, *t[1:], seen=charged if tie is not None else None)
            elif ("never", t[1]) not in charged:
                charged[("never", t[1])] = 1
                m.row({t[1]: 1.0}, 0, 0)
    sol = m.solve()
    choice = {n: back[n][next(i for i, var in enumerate(vs) if sol[var])] for n, vs in x.items()}
    return choice, float(np.dot(np.asarray(m.cost), sol)), len(m.cost)


def _value_terms(pr: PlacementProblem, v: _Value, pairs_of, slots: dict, gp: dict[tuple[str, int], int]) -> list[tuple]:
    """The objective's terms of one value: ``("charge", [(pair var, condition)], seconds)``,
    ``("at_least", var, pair var, condition)`` (an unsplit view handing a partial gradient on:
    ``gp``'s variables) and ``("never", pair var)`` (split: a partial gradient handed to a view's
    copy that hands none on); its product variables are made by ``pairs_of``. ``slots`` caches
    each (node, input slot)'s placement and gradient per strategy."""
    out: list[tuple] = []
    pairs = {(n, k): pairs_of(v.producer, n) for n, k in v.consumers}  # _add_edge_constraints
    reads = []
    for n, k in v.consumers:
        if (n, k) not in slots:
            slot: list[tuple[Placement | None, Placement | None, int | None]] = []  # (input, gradient, condition)
            for sb in pr.strategies[n]:
                dst = sb.inputs[k] if k < len(sb.inputs) else None
                if dst is None:
                    slot.append((None, None, None))
                elif gp and pr.passes(n, sb):  # partial only if the view's output is
                    slot.append((dst, Partial(), gp[(n, 0)]))
                else:
                    slot.append((dst, sb.grad_of_input(k), None))
            slots[(n, k)] = slot
        reads.append((pairs[(n, k)], slots[(n, k)], v.has_grad and n not in pr.no_grad))
    for ia, sa in enumerate(pr.strategies[v.producer]):
        src = sa.outputs[v.index]
        if src is None:
            continue
        need_fwd: dict[Placement, list[tuple[int, int | None]]] = {}
        need_bwd: dict[Placement, list[tuple[int, int | None]]] = {}
        for pair, slot, grads in reads:
            row = pair[ia]
            for ib, (dst, g, cond) in enumerate(slot):
                if dst is None:
                    continue
                if dst != src and not isinstance(dst, Partial):
                    need_fwd.setdefault(dst, []).append((row[ib], None))
                if grads and g is not None:
                    need_bwd.setdefault(g, []).append((row[ib], cond))
        for dst, pvs in need_fwd.items():
            out.append(("charge", pvs, pr.reshard_s(src, dst, v.nbytes, v.ndim)))
        want = _dual(src)
        for g, pvs in need_bwd.items():  # _add_grad_constraints
            if g == want:
                continue
            if isinstance(g, Partial) and isinstance(sa, _PassThrough):
                if not sa.partial:  # a partial gradient reaches a view that hands none on
                    out += [("never", pv) for pv, _ in pvs]
                continue  # else handed on to this view's producer
            if isinstance(g, Partial) and gp and pr.passes(v.producer, sa):
                for pv, cond in pvs:  # hand the partial gradient on: gp[v] >= pv (AND cond)
                    out.append(("at_least", gp[(v.producer, v.index)], pv, cond))
                continue
            out.append(("charge", pvs, pr.reshard_s(g, want, v.nbytes, v.ndim)))
    return out


def _at_least(m: _Model, var: int, pv: int, cond: int | None, *, seen: dict | None = None) -> None:
    """``var >= pv`` (or ``var >= pv AND cond``, linearised as ``var >= pv + cond - 1``); once
    per ``seen`` (a tied problem repeats its rows)."""
    if seen is not None:
        if ("row", var, pv, cond) in seen:
            return
        seen[("row", var, pv, cond)] = 1
    if cond is None:
        m.row({var: 1.0, pv: -1.0}, 0, np.inf)
    else:
        m.row({var: 1.0, pv: -1.0, cond: -1.0}, -1, np.inf)


def _charge(m: _Model, pvs: list[tuple[int, int | None]], t: float, memo: dict | None = None) -> None:
    """Pay ``t`` once if any of the (pair variable AND condition) terms holds; with ``memo``
    (a tied problem), terms over the same variables share one charge, their seconds added."""
    if t <= 0 or not pvs:
        return
    if len(pvs) == 1 and pvs[0][1] is None:
        m.cost[pvs[0][0]] += t
        return
    key = ("charge", tuple(pvs))
    if memo is not None and key in memo:
        m.cost[memo[key]] += t
        return
    var = m.var(t)
    if memo is not None:
        memo[key] = var
    for pv, cond in pvs:
        _at_least(m, var, pv, cond)


def _passes_through(s: NodePlacement) -> bool:
    return len(s.inputs) >= 1 and isinstance(s.inputs[0], Replicate) and all(
        isinstance(p, Replicate) for p in s.outputs if p is not None)


def _pair_vars(m: _Model, xu: list[int], xn: list[int]) -> list[list[int]]:
    """Variables equal to ``x_u[a]·x_n[b]``, with the tight (marginal) linearisation.

    A side with a single strategy needs no new variable: the product is the other side's ``x``.
    """
    if len(xu) == 1:
        return [list(xn)]
    if len(xn) == 1:
        return [[v] for v in xu]
    y = [[m.var(0.0) for _ in xn] for _ in xu]
    for ia in range(len(xu)):  # Σ_b y[a,b] = x_u[a]
        m.row({**{y[ia][ib]: 1.0 for ib in range(len(xn))}, xu[ia]: -1.0}, 0, 0)
    for ib in range(len(xn)):  # Σ_a y[a,b] = x_n[b]
        m.row({**{y[ia][ib]: 1.0 for ia in range(len(xu))}, xn[ib]: -1.0}, 0, 0)
    return y


def _edge_products(pr: PlacementProblem) -> int:
    """How many product variables the untied model has (both sides with several strategies)."""
    size = {n: len(s) for n, s in pr.strategies.items()}
    return sum(size[v.producer] * size[n] for v in pr.values for n, _ in v.consumers
               if size[v.producer] > 1 and size[n] > 1)


def alike_nodes(pr: PlacementProblem) -> dict[str, str]:
    """Each node -> the first node alike to it (see the module doc), itself where none is.

    Colour refinement: a node's first colour is its own ILP data; each round adds the colours
    of the values it reads (with their slots) and of the nodes reading its values (not the
    slot they read it in: a ``stack`` of every step's output must not tell the steps apart)."""
    ins: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    outs: dict[str, list[tuple[int, str]]] = defaultdict(list)
    made: dict[str, list[tuple]] = defaultdict(list)
    for v in pr.values:
        made[v.producer].append((v.index, v.nbytes, v.ndim, v.has_grad, len(v.consumers)))
        for n, k in v.consumers:
            ins[n].append((k, v.producer, v.index))
            outs[v.producer].append((v.index, n))
    forbidden: dict[str, list[int]] = defaultdict(list)
    for n, i in pr.forbidden:
        forbidden[n].append(i)
    ids: dict[tuple, int] = {}
    colour = {n: ids.setdefault((tuple(pr.strategies[n]), tuple(pr.compute_s[n]),
                                 tuple(pr.inner_s(n, i) for i in range(len(pr.strategies[n]))),
                                 tuple(sorted(forbidden[n])), n in pr.view_like, n in pr.no_grad,
                                 tuple(sorted(made[n]))), len(ids)) for n in pr.nodes}
    for _ in range(TIE_ROUNDS):
        ids = {}
        colour = {n: ids.setdefault((colour[n],
                                     tuple(sorted((k, colour[u], i) for k, u, i in ins[n])),
                                     tuple(sorted((i, colour[c]) for i, c in outs[n]))), len(ids))
                  for n in pr.nodes}
    first: dict[int, str] = {}
    return {n: first.setdefault(colour[n], n) for n in pr.nodes}
