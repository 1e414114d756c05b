"""Per-node facts, kept on ``node.meta["gfx"]`` and read and written only through this module.

PyTorch's own keys (``val``, ``nn_module_stack``) stay as they are; everything galvatron_fx
learns about one node lives in one small record, :class:`NodeFacts`, so that copying a graph
copies the facts and no pass invents its own ad-hoc key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.fx as fx

GFX_KEY = "gfx"


@dataclass(slots=True)
class NodeFacts:
    """What galvatron_fx knows about one node.

    Costs are for the captured (global) shapes, one forward and one backward.
    ``fwd_bytes``/``bwd_bytes`` are bytes read plus written by the kernels the node runs (views
    are free); ``saved_bytes`` are the activation bytes this node keeps alive for backward
    (unique storages, parameters excluded).
    """

    layer: str | None = None
    param: str | None = None  # the parameter/buffer FQN, for placeholders
    requires_grad: bool = False
    fwd_flops: int = 0
    bwd_flops: int = 0
    fwd_bytes: int = 0
    bwd_bytes: int = 0
    output_bytes: int = 0
    saved_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


_COST_FIELDS = ("fwd_flops", "bwd_flops", "fwd_bytes", "bwd_bytes", "output_bytes", "saved_bytes")


def facts(node: fx.Node) -> NodeFacts:
    """The node's facts, created empty on first access."""
    f = node.meta.get(GFX_KEY)
    if f is None:
        f = node.meta[GFX_KEY] = NodeFacts()
    return f


def has_facts(node: fx.Node) -> bool:
    return GFX_KEY in node.meta


def copy_costs(src: fx.Node, dst: fx.Node) -> None:
    """Copy the cost fields (not the layer or param name) from ``src`` to ``dst``."""
    s, d = facts(src), facts(dst)
    for name in _COST_FIELDS:
        setattr(d, name, getattr(s, name))


def cost_field_names() -> tuple[str, ...]:
    return _COST_FIELDS


def all_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(NodeFacts))


def tensor_bytes(x) -> int:
    """Bytes of every tensor in ``x`` (a value, list or tuple of values)."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(v) for v in x)
    return 0


def node_val(node: fx.Node):
    """The FakeTensor (or structure of them) recorded for a node by the tracer, or None."""
    return node.meta.get("val")
