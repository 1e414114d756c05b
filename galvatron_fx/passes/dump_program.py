"""dump_program — a lowered program as readable files, and whether it issues what its plan priced.

Contract: :func:`write_program` writes, for a :class:`~galvatron_fx.ir.program.LoweredProgram`,
per distinct lowered graph pair ``DIR/<layer>.fw.txt`` and ``DIR/<layer>.bw.txt`` (``<layer>``:
the first layer that runs them; a recomputed layer's backward with its forward ops again),
per stage ``DIR/stage<k>.txt`` (the step graph), and ``DIR/summary.json``; it returns the
summary. Placeholders are named for what they hold: a parameter by its FQN (``.`` as ``_``), an
input by the value it reads (``in_<name>``), a saved tensor by the forward value it is
(``saved_<name>``), an output's gradient ``grad_out<i>``. Nothing else is changed.

The summary: ``{"model", "world_size", "pp", "num_microbatches", "global_batch_size",
"precision", "layers": [{"name", "kind", "stage", "strategy", "dp", "graphs", "fw_collectives",
"bw_collectives", "step_collectives", "recompute", "priced", "matches_plan", "differences"}],
"buckets": [...], "matches_plan", "differences", "timings_s"}``; a collective is ``{"op",
"group_size", "bytes"}`` (bytes per micro-batch on one rank, the cost model's convention).
``matches_plan`` (:func:`compare_with_plan`): every layer's collectives — per phase, ``fwd``,
``bwd`` (a recomputed forward's again) and ``step`` (DDP's bucketed gradients) — equal, as
multisets of (op, group size, bytes within 1%), those its plan layer records as priced
(``LayerPlan.collectives``); collectives over one rank move nothing and are left out. A plan
that records none (made by an older version, or by hand) does not match.
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import cast

import torch.fx as fx

from galvatron_fx.ir.program import CollectiveRecord, LoweredLayer, LoweredProgram

__all__ = ["compare_with_plan", "readable", "summary", "write_program"]


def _ident(s: str) -> str:
    return re.sub(r"\W", "_", s)


def _renamed(gm: fx.GraphModule, names: dict[int, str]) -> fx.GraphModule:
    """A copy of ``gm`` whose placeholders at the given positions carry the given names."""
    g = copy.deepcopy(gm)
    ph = [n for n in g.graph.nodes if n.op == "placeholder"]
    for i, name in names.items():
        if i < len(ph):
            ph[i]._rename(_ident(name))
            ph[i].target = ph[i].name
    g.recompile()
    return g


def readable(lay: LoweredLayer) -> dict[str, str]:
    """``{"fw": text, "bw": text}`` of a lowered layer's graphs (see module doc)."""
    lg = lay.graphs
    n_params = len(lay.param_names)
    fw_names = {i: name for i, name in enumerate(lay.param_names)}
    dl = lg.decomposed
    non_param = [n for n, r in zip(dl.input_names, dl.input_roles) if r != "param"] if dl is not None else []
    for k, name in enumerate(non_param):
        fw_names[n_params + k] = f"in_{name}"
    for k, i in enumerate(lg.whole_inputs):  # user inputs the forward also reads whole
        fw_names[n_params + len(non_param) + k] = f"whole_{non_param[i]}"
    lowered_fw = cast(fx.GraphModule, lg.fw)  # a lowered layer's graphs are split
    fw = _renamed(lowered_fw, fw_names)
    (fw_out,) = [n for n in lowered_fw.graph.nodes if n.op == "output"]
    n_out = len(lg.trace.out_grad)
    readable_ph = {n.name: fw_names.get(i, n.name) for i, n in
                   enumerate(n for n in lowered_fw.graph.nodes if n.op == "placeholder")}
    saved = [readable_ph.get(a.name, a.name) if isinstance(a, fx.Node) else "const" for a in fw_out.args[0][n_out:]]
    tangents = [i for i, g in enumerate(lg.trace.out_grad) if g]
    if lg.recompute_bw is not None:
        ph = [n for n in lg.recompute_bw.graph.nodes if n.op == "placeholder"]
        names = dict(fw_names)
        first_tangent = len(ph) - len(tangents)
        names |= {first_tangent + j: f"grad_out{i}" for j, i in enumerate(tangents)}
        bw = _renamed(lg.recompute_bw, names)
    else:
        names = {i: f"saved_{s}" for i, s in enumerate(saved)}
        names |= {len(saved) + j: f"grad_out{i}" for j, i in enumerate(tangents)}
        bw = _renamed(cast(fx.GraphModule, lg.bw), names)
    st = lay.strategy.to_dict() if hasattr(lay.strategy, "to_dict") else str(lay.strategy)
    head = (f"# layer {lay.name} (kind {lay.kind}), stage {lay.stage}, dp={lay.dp}, strategy {st}\n"
            f"# parameters (in order): {', '.join(lay.param_names) or 'none'}\n")
    hoisted = "".join(f"# saved[{i}] all-reduced ({op}) from forward to backward: launched after the forward\n"
                      for i, op, _g in lg.hoisted)
    return {"fw": head + hoisted + fw.print_readable(print_output=False),
            "bw": head + (f"# recomputation: {lg.recompute} (forward ops again, tagged recompute)\n"
                          if lg.recompute != "none" else "") + bw.print_readable(print_output=False)}


def _records(rs) -> list[dict]:  # (each of one phase: the list's)
    return [{k: v for k, v in r.to_dict().items() if k != "phase"} for r in rs]


def _differences(lowered: dict[str, list[CollectiveRecord]], priced: list[CollectiveRecord]) -> list[str]:
    """What differs between a layer's lowered and priced collectives (see module doc)."""
    want: dict[tuple, list[int]] = defaultdict(list)
    got: dict[tuple, list[int]] = defaultdict(list)
    for c in priced:
        if c.group_size > 1:
            want[(c.phase, c.op, c.group_size)].append(c.bytes)
    for phase, rs in lowered.items():
        for r in rs:
            if r.group_size > 1:
                got[(phase, r.op, r.group_size)].append(r.bytes)
    out = []
    for k in sorted(set(want) | set(got)):
        a, b = sorted(got.get(k, [])), sorted(want.get(k, []))
        same = len(a) == len(b) and all(abs(x - y) <= max(1, 0.01 * max(x, y)) for x, y in zip(a, b))
        if not same:
            phase, op, g = k
            out.append(f"{phase} {op} over {g} ranks: the program issues {a or 'none'} bytes, "
                       f"the plan priced {b or 'none'}")
    return out


def _lowered_by_phase(lay: LoweredLayer) -> dict[str, list[CollectiveRecord]]:
    return {"fwd": lay.fw_collectives, "bwd": lay.bw_collectives, "step": list(lay.step_dp)}


def compare_with_plan(program: LoweredProgram) -> dict[str, list[str]]:
    """Layer name -> its differences from the plan's priced collectives (empty: it matches)."""
    out = {}
    for lay in program.layers:
        lp = program.plan.layer(lay.name)
        if not lp.collectives:
            lowered = _lowered_by_phase(lay)
            moved = any(r.group_size > 1 for rs in lowered.values() for r in rs)
            # (none priced and none issued — a layer whose only dp sum was folded — is a match)
            out[lay.name] = ["the plan records no priced collectives (made by hand or by an older version): "
                             "re-plan to compare"] if moved else []
            continue
        out[lay.name] = _differences(_lowered_by_phase(lay), list(lp.collectives))
    return out


def summary(program: LoweredProgram, files: dict[int, str] | None = None) -> dict:
    """The program's summary (see module doc); ``files``: id(LayerGraphs) -> dump file stem."""
    plan = program.plan
    diffs = compare_with_plan(program)
    layers = []
    for lay in program.layers:
        lp = plan.layer(lay.name)
        layers.append({
            "name": lay.name, "kind": lay.kind, "stage": lay.stage, "strategy": lay.strategy.to_dict(), "dp": lay.dp,
            "graphs": (files or {}).get(id(lay.graphs), lay.graphs.name),
            "fw_collectives": _records(lay.fw_collectives), "bw_collectives": _records(lay.bw_collectives),
            "step_collectives": _records(lay.step_dp), "recompute": lay.graphs.recompute != "none",
            "priced": [c.to_dict() for c in lp.collectives], "matches_plan": not diffs[lay.name],
            "differences": diffs[lay.name]})
    all_diffs = [f"{name}: {d}" for name, ds in diffs.items() for d in ds]
    return {
        "model": plan.model, "world_size": plan.world_size, "pp": plan.pp, "num_microbatches": plan.num_microbatches,
        "global_batch_size": plan.global_batch_size, "precision": plan.precision, "layers": layers,
        "buckets": [{"stage": b.stage, "group_size": b.group_size, "bytes": b.bytes, "params": list(b.params),
                     "after_layer": b.after_layer} for b in program.buckets],
        "matches_plan": not all_diffs, "differences": all_diffs,
        "timings_s": {k: round(v, 4) for k, v in program.timings_s.items()},
    }


def write_program(program: LoweredProgram, out_dir: str | Path) -> dict:
    """Write the program's files under ``out_dir`` (see module doc); returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[int, str] = {}
    for lay in program.layers:
        if id(lay.graphs) in files:
            continue
        stem = lay.name if re.fullmatch(r"[\w.\-]+", lay.name) else _ident(lay.name)
        files[id(lay.graphs)] = stem
        text = readable(lay)
        (out / f"{stem}.fw.txt").write_text(text["fw"])
        (out / f"{stem}.bw.txt").write_text(text["bw"])
    for stage, gm in program.stages.items():
        (out / f"stage{stage}.txt").write_text(f"# stage {stage}: one micro-batch's step\n" + gm.code)
    s = summary(program, files)
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    return s
