"""Graph dumps: per-layer and per-node tables, JSON and DOT; the ``galvatron-fx inspect`` command.

``galvatron-fx inspect gpt2-small --batch 8 --seq 1024 --json out.json --dot out.dot --node-table``
captures a model (a zoo name, ``--hf-config PATH`` or ``--model module:function``) on the meta
device (no weights are allocated), annotates its costs and prints what the planner will see.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from galvatron_fx.ir.meta import facts
from galvatron_fx.report.fmt import fmt_bytes, fmt_count, format_table  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from galvatron_fx.ir.graph import ModelGraph

# ---- tables ---------------------------------------------------------------------------------

def format_layer_table(mg: ModelGraph) -> str:
    headers = ["layer", "role", "kind", "params", "fwd FLOPs", "bwd FLOPs", "activations", "output"]
    rows = []
    for l in mg.layers:
        c = l.costs
        rows.append([
            l.name, str(l.role), l.kind[:8],
            fmt_count(c.num_params) if c else "-",
            fmt_count(c.fwd_flops) if c else "-",
            fmt_count(c.bwd_flops) if c else "-",
            fmt_bytes(c.activation_bytes) if c else "-",
            fmt_bytes(c.output_bytes) if c else "-",
        ])
    head = (f"{mg.name}: {len(mg.layers)} layers, {len(mg.kinds())} kinds, "
            f"{fmt_count(mg.num_params)} parameters ({fmt_bytes(mg.param_bytes)}), "
            f"inputs {mg.example_shapes}")
    text = head + "\n" + format_table(headers, rows, "lllrrrrr")
    if all(l.costs for l in mg.layers):
        t = mg.total_costs()
        text += (f"\ntotal: {fmt_count(t.fwd_flops)} fwd + {fmt_count(t.bwd_flops)} bwd FLOPs per step, "
                 f"{fmt_bytes(t.activation_bytes)} activations saved for backward")
    return text


def format_node_table(mg: ModelGraph) -> str:
    headers = ["node", "op", "layer", "shape", "fwd FLOPs", "bwd FLOPs", "fwd bytes", "saved"]
    rows = []
    for n in mg.gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        f = facts(n)
        val = n.meta.get("val")
        shape = tuple(val.shape) if hasattr(val, "shape") else "-"
        rows.append([n.name, _op_name(n), f.layer or "-", str(shape), fmt_count(f.fwd_flops),
                     fmt_count(f.bwd_flops), fmt_bytes(f.fwd_bytes), fmt_bytes(f.saved_bytes)])
    return format_table(headers, rows, "llllrrrr")


def _op_name(n) -> str:
    t = n.target
    return str(t) if not callable(t) or hasattr(t, "_schema") else getattr(t, "__name__", str(t))


# ---- JSON and DOT ---------------------------------------------------------------------------

def graph_to_json_dict(mg: ModelGraph, *, nodes: bool = False) -> dict:
    layers = []
    for l in mg.layers:
        c = l.costs
        layers.append({
            "name": l.name, "index": l.index, "kind": l.kind, "role": str(l.role),
            "params": c.num_params if c else None,
            "param_bytes": c.param_bytes if c else None,
            "fwd_flops": c.fwd_flops if c else None,
            "bwd_flops": c.bwd_flops if c else None,
            "fwd_bytes": c.fwd_bytes if c else None,
            "bwd_bytes": c.bwd_bytes if c else None,
            "activation_bytes": c.activation_bytes if c else None,
            "output_bytes": c.output_bytes if c else None,
            "modules": l.modules, "param_names": l.param_names,
            "inputs": l.input_names, "outputs": l.output_names, "nodes": l.node_names,
        })
    out: dict[str, Any] = {
        "model": mg.name,
        "num_params": mg.num_params,
        "param_bytes": mg.param_bytes,
        "inputs": [{"name": n, "shape": list(s), "dtype": d}
                   for n, s, d in zip(mg.input_names, mg.example_shapes, mg.example_dtypes)],
        "layers": layers,
        "params": [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "numel": p.numel,
                    "is_buffer": p.is_buffer, "layers": list(p.layers)} for p in mg.params.values()],
    }
    if nodes:
        out["nodes"] = []
        for n in mg.gm.graph.nodes:
            val = n.meta.get("val")
            out["nodes"].append({
                "name": n.name, "op": n.op, "target": _op_name(n),
                "args": [a.name for a in n.all_input_nodes],
                "shape": list(val.shape) if hasattr(val, "shape") else None,
                "dtype": str(val.dtype).removeprefix("torch.") if hasattr(val, "dtype") else None,
                **facts(n).to_dict(),
            })
    return out


def graph_to_dot(mg: ModelGraph) -> str:
    """Graphviz DOT: one cluster per layer, parameters omitted, edges between value nodes."""
    lines = [f'digraph "{mg.name}" {{', "  rankdir=TB;", '  node [shape=box, fontsize=9];']
    by_layer: dict[str, list] = {}
    for n in mg.gm.graph.nodes:
        if n.op == "placeholder" and facts(n).param:
            continue
        by_layer.setdefault(facts(n).layer or "", []).append(n)
    for i, (layer, nodes) in enumerate(by_layer.items()):
        indent = "  "
        if layer:
            role = mg.layer(layer).role
            lines.append(f'  subgraph cluster_{i} {{\n    label="{layer} ({role})"; style=rounded;')
            indent = "    "
        for n in nodes:
            val = n.meta.get("val")
            shape = "x".join(str(s) for s in val.shape) if hasattr(val, "shape") else ""
            lines.append(f'{indent}"{n.name}" [label="{n.name}\\n{_op_name(n)}\\n{shape}"];')
        if layer:
            lines.append("  }")
    drawn = {n.name for nodes in by_layer.values() for n in nodes}
    for n in mg.gm.graph.nodes:
        for a in n.all_input_nodes:
            if a.name in drawn and n.name in drawn:
                lines.append(f'  "{a.name}" -> "{n.name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"
