"""capture() of Hugging Face models and of the model shapes users bring: inputs by name, the
loss picked out of structured outputs, layers that never read a later layer's value, lifted
constants, refused buffer updates, and a search that is the same in every process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import galvatron_fx as gfx
from galvatron_fx.errors import UnsupportedModelError
from galvatron_fx.ir.recompute import Recompute

hf_tiny = pytest.importorskip("hf_tiny")
pytest.importorskip("transformers")


def _later_reads(mg) -> list[str]:
    layer_of = {n: i for i, l in enumerate(mg.layers) for n in l.node_names}
    return [f"{mg.layers[layer_of[n]].name} reads {a} of {mg.layers[layer_of[a]].name}"
            for l in mg.layers for n in l.node_names for a in (x.name for x in mg.node(n).all_input_nodes)
            if a in layer_of and layer_of[a] > layer_of[n]]


@pytest.mark.parametrize("family", hf_tiny.FAMILIES)
def test_hf_family_captures_with_its_own_loss(family):
    model, batch = hf_tiny.build(family)
    mg = gfx.capture(model, (), example_kwargs=batch)
    assert mg.input_names == list(batch)  # tensors by name, in the call's order
    assert len(mg.output_names) == 1  # the loss alone, out of the ModelOutput
    assert _later_reads(mg) == []
    assert [str(l.role) for l in mg.layers][-2:] == ["head", "loss"]
    assert len(mg.blocks()) >= 2
    assert mg.num_params == sum(p.numel() for p in model.parameters())


def test_t5_lifted_constant_is_kept_with_the_graph():
    model, batch = hf_tiny.build("t5")
    mg = gfx.capture(model, (), example_kwargs=batch)
    consts = [p for p in mg.params.values() if p.name in mg.constants]
    assert consts and all(p.is_buffer and not p.requires_grad for p in consts)
    assert all(isinstance(t, torch.Tensor) for t in mg.constants.values())


def test_labels_that_are_the_input_ids_are_two_inputs():
    model, batch = hf_tiny.build("llama")
    ids = batch["input_ids"]
    mg = gfx.capture(model, (ids,), example_kwargs={"labels": ids, "use_cache": False})
    assert mg.input_names == ["input_ids", "labels"]
    emb = mg.layers[0]
    assert "input_ids" in emb.input_names and "labels" not in emb.input_names
    assert "labels" in mg.layers[-1].input_names
    # bound positionally, by keyword, or from one mapping; constants must match the capture
    a, b = mg.bind_inputs((ids,), {"labels": ids})
    assert a is ids and b is ids
    assert len(mg.bind_inputs({"input_ids": ids, "labels": ids, "use_cache": False})) == 2
    with pytest.raises(ValueError, match="use_cache.*captured as False"):
        mg.bind_inputs((ids,), {"labels": ids, "use_cache": True})
    with pytest.raises(ValueError, match="must be a tensor"):
        mg.bind_inputs((ids,))
    with pytest.raises(ValueError, match="keywords"):
        mg.bind_inputs((ids,), {"labels": ids, "attention": ids})


def test_logits_only_output_asks_for_labels_or_loss_fn():
    model, batch = hf_tiny.build("gpt2")
    with pytest.raises(UnsupportedModelError, match="pass labels.*loss_fn"):
        gfx.capture(model, (batch["input_ids"],))
    # with a loss_fn on the logits, the last input is the target
    mg = gfx.capture(model, (batch["input_ids"], batch["labels"]),
                     loss_fn=lambda out, y: F.cross_entropy(out.logits.flatten(0, 1), y.flatten()))
    assert len(mg.output_names) == 1 and _later_reads(mg) == []


class _Blocks(nn.Module):
    def __init__(self, norm: type[nn.Module] = nn.LayerNorm):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), norm(16), nn.ReLU()) for _ in range(2))
        self.out = nn.Linear(16, 4)


class _ReturnsTuple(_Blocks):
    def forward(self, x, y):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        pred = self.out(h)
        return F.mse_loss(pred, y), pred


def test_tuple_output_gives_its_first_element_as_the_loss():
    model = _ReturnsTuple()
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    mg = gfx.capture(model, (x, y))
    assert len(mg.output_names) == 1
    assert mg.layers[-1].role == "loss"


class _WithBatchNorm(_Blocks):
    def __init__(self):
        super().__init__(norm=nn.BatchNorm1d)

    def forward(self, x, y):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return F.mse_loss(self.out(h), y)


def test_buffers_batchnorm_writes_in_training_are_listed():
    model = _WithBatchNorm()
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    mg = gfx.capture(model, (x, y))
    stats = {f"blocks.{i}.1.{b}" for i in range(2) for b in ("running_mean", "running_var", "num_batches_tracked")}
    assert set(mg.mutated_buffers) == stats, mg.mutated_buffers
    assert len(mg.blocks()) == 2
    assert gfx.capture(model.eval(), (x, y)).mutated_buffers == []  # in eval mode nothing is written


def test_a_layer_writing_its_statistics_is_never_recomputed(caplog):
    """Recomputing a BatchNorm layer would update its running statistics twice: its costs say
    recomputation saves nothing (not, from a failed measurement, everything), and the search
    keeps its activations even where only recomputation is allowed."""
    model = _WithBatchNorm()
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    with caplog.at_level("WARNING"):
        mg = gfx.capture(model, (x, y))
    assert not [r for r in caplog.records if "under recomputation" in r.getMessage()]
    for b in mg.blocks():
        assert b.costs.activation_bytes > 0
        assert b.costs.activation_bytes_full == b.costs.activation_bytes_selective == b.costs.activation_bytes
    plan = gfx.plan(mg, gfx.Cluster.local_cpu(2), global_batch_size=4,
                    search={"recompute": ("full",), "pp": (1,), "dp_types": ("ddp",)})
    by_layer = {lp.name: str(lp.strategy.recompute) for lp in plan.layers}
    assert all(by_layer[b.name] == "none" for b in mg.blocks()), by_layer
    assert by_layer[mg.layers[0].name] == "full", by_layer  # a layer without state is recomputed as asked
    # a given plan that recomputes one is refused when it is lowered, naming the layer
    from galvatron_fx.passes.lower_program import lower

    block = mg.blocks()[0].name
    bad = dataclasses.replace(plan, layers=[dataclasses.replace(lp, strategy=dataclasses.replace(
        lp.strategy, recompute=Recompute.FULL)) if lp.name == block else lp for lp in plan.layers])
    with pytest.raises(gfx.PlanError, match=f"recomputes layer {block}.*writes state"):
        lower(mg, bad)
    lower(mg, plan)


_DETERMINISM = textwrap.dedent('''
    import hashlib, json, sys
    sys.path.insert(0, sys.argv[1])
    import galvatron_fx as gfx, hf_tiny
    from galvatron_fx import zoo
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.search.intra_layer import solve_intra_layer
    out = {}
    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    for name in ("gpt2", "llama", "qwen2", "gpt-tiny"):
        if name in hf_tiny.FAMILIES:
            model, batch = hf_tiny.build(name)
            mg = gfx.capture(model, (), example_kwargs=batch)
        else:
            model, inputs = zoo.build(name, batch_size=4, seq_len=16)
            mg = gfx.capture(model, inputs)
        pl = {f"{l.name}/{sp}": solve_intra_layer(mg, l, 2, sp, cm, shard_params=True).placements
              for l in mg.layers for sp in (("none", "megatron") if l.role == "block" else ("none",))}
        plan = gfx.plan(mg, gfx.Cluster.local_cpu(4), global_batch_size=8)
        out[name] = [hashlib.sha256(json.dumps(pl, sort_keys=True).encode()).hexdigest(), plan.plan_hash()]
    print(json.dumps(out))
''')


def test_search_is_the_same_under_every_hash_seed():
    tests = str(Path(__file__).resolve().parents[1])
    runs = [subprocess.Popen([sys.executable, "-c", _DETERMINISM, tests], env={**os.environ, "PYTHONHASHSEED": seed},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed in ("1", "2")]  # side by side: one core each
    outs = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]


def test_values_made_whole_with_a_batch_dim_are_found_batched():
    """A probe capture at twice the batch finds the values whose dim 0 is the batch, also those
    built from ``arange`` without reading the inputs (Llama's mask, its positions' cos/sin), and
    not those of the sequence alone."""
    from galvatron_fx.passes.batch_probe import mark_batched

    model, batch = hf_tiny.build("llama")
    mg = gfx.capture(model, (), example_kwargs=batch)
    # the capture probes at twice its batch itself (what compile() relies on): a probe capture
    # made apart finds the same
    own, scaling = set(mg.batched), mg.batch_scaling
    found = mark_batched(mg, gfx.capture(model, (), example_kwargs=hf_tiny.batch("llama", 8), annotate=False))
    assert scaling is not None and found == own and mg.batch_scaling == scaling
    by_name = mg.nodes_by_name()
    crossing = {x for l in mg.layers[1:] for x in l.input_names if x in by_name and by_name[x].op != "placeholder"}
    masks = [x for x in crossing if by_name[x].meta["val"].dtype == torch.bool]
    assert masks and all(x in found for x in masks)
    assert set(mg.input_names) <= found
    hidden = mg.layers[1].input_names[0]
    assert hidden in found
    # a value without a batch dim (Llama's inverse frequencies, a buffer) is not batched
    assert not any(by_name[n].op == "placeholder" and n not in mg.input_names for n in found)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_placements_are_named_by_parameter_and_module(family):
    """explain(layer) lists a tensor-parallel layer's placements by the names people know: every
    parameter of the block by its name within the block, the ops reading them by module; the
    names survive the plan's JSON."""
    model, batch = hf_tiny.build(family)
    mg = gfx.capture(model, (), example_kwargs=batch)
    plan = gfx.plan(mg, gfx.Cluster.preset("dgx-a100-80g", nodes=1), global_batch_size=16,
                    search={"tp": (2,), "pp": (1,)}, baselines=False)
    block = mg.blocks()[0]
    lp = plan.layer(block.name)
    assert lp.strategy.tp == 2 and set(lp.labels) <= set(lp.placements)
    names = {f.removeprefix(block.name + ".") for f, p in mg.params.items()
             if f.startswith(block.name + ".") and not p.is_buffer}
    assert names and names <= set(lp.labels.values()), names - set(lp.labels.values())
    text = plan.explain(block.name)
    listed = text.split("placements (", 1)[1].splitlines()[1:]
    assert all(n in text for n in names)
    first = listed[0].split()[0]
    assert first in names, listed[:3]  # names first, not arg0_1
    modules = {n.rpartition(".")[0] for n in names if n.endswith(".weight")}
    shown = {line.split()[0] for line in listed if len(line.split()) == 4}  # "<module> <op> <placement> [node]"
    assert modules <= shown, (modules - shown, listed)  # every op reading a weight, by its module
    again = gfx.ParallelPlan.from_json(plan.to_json())
    assert again == plan and again.layer(block.name).labels == lp.labels
