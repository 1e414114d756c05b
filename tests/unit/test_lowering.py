"""``galvatron_fx.lower``: a plan applied by graph passes, with no process group (a stand-in one).

Checked per strategy: the program's collectives equal those the plan priced (plans searched with
``lowered_prices``), and ordered patterns in the dumped text (Megatron's all-reduce after the
row-parallel matmul, sequence parallelism's gather and reduce-scatter, Ulysses' all-to-all,
ZeRO-3's gathers and reduce-scatter around a layer, DDP's bucket after the backward that
completes it, recomputation's forward ops again in the backward, a pipeline's send at the end of
stage 0); the passes' contracts, dumps and names; the partition equal to AOTAutograd's own.
"""

from __future__ import annotations

import json
import re

import pytest

import galvatron_fx as gfx
from galvatron_fx import zoo
from galvatron_fx.ir.recompute import Recompute
from galvatron_fx.ir.strategy import DPType, SPMode
from galvatron_fx.passes.dump_program import compare_with_plan, write_program

lower = gfx.lower  # the public entry point

BATCH, SEQ = 8, 64


@pytest.fixture(scope="module")
def tiny():
    model, inputs = zoo.build("gpt-tiny", batch_size=BATCH, seq_len=SEQ, device="cpu", seed=0)
    return gfx.capture(model, inputs)


@pytest.fixture(scope="module")
def a100():
    return gfx.Cluster.preset("dgx-a100-80g", nodes=1)


STRATEGIES = {
    "ddp": dict(tp=(1,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,)),
    "zero2": dict(tp=(1,), dp_types=(DPType.ZERO2,), recompute=(Recompute.NONE,)),
    "zero3": dict(tp=(1,), dp_types=(DPType.ZERO3,), recompute=(Recompute.NONE,)),
    "tp": dict(tp=(2,), sp=(SPMode.NONE,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,)),
    "tp+megatron": dict(tp=(2,), sp=(SPMode.MEGATRON,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,)),
    "ulysses": dict(tp=(2,), sp=(SPMode.ULYSSES,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,)),
    "recompute": dict(tp=(2,), sp=(SPMode.NONE,), recompute=(Recompute.FULL,)),
    "selective": dict(tp=(1,), recompute=(Recompute.SELECTIVE,)),
    "pp": dict(pp=(2,), tp=(1,), num_microbatches=(2,), schedules=("1f1b",)),
    # gradient communication: the sums' bytes in bf16, PowerSGD's factors
    "ddp-bf16": dict(tp=(1,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,), reduce_dtypes=("bfloat16",)),
    "zero3-bf16": dict(tp=(1,), dp_types=(DPType.ZERO3,), recompute=(Recompute.NONE,), reduce_dtypes=("bfloat16",)),
    "ddp-powersgd": dict(tp=(1,), dp_types=(DPType.DDP,), recompute=(Recompute.NONE,), powersgd_ranks=(4,)),
}


def _plan(mg, cluster, key: str):
    space = dict(STRATEGIES[key], lowered_prices=True)
    space.setdefault("pp", (1,))
    space.setdefault("num_microbatches", (1,))
    return gfx.plan(mg, cluster, global_batch_size=BATCH * space["num_microbatches"][0], baselines=False,
                    search=space)


_PROGRAMS: dict = {}


def _program(tiny, a100, key: str, tmp_path_factory):
    if key not in _PROGRAMS:
        plan = _plan(tiny, a100, key)
        out = tmp_path_factory.mktemp(key.replace("+", "_"))
        prog = lower(tiny, plan, dump_dir=out)
        _PROGRAMS[key] = (plan, prog, write_program(prog, out), out)
    return _PROGRAMS[key]


@pytest.mark.parametrize("key", list(STRATEGIES))
def test_the_program_issues_the_collectives_the_plan_priced(tiny, a100, key, tmp_path_factory):
    plan, prog, summary, _ = _program(tiny, a100, key, tmp_path_factory)
    blocks = [lp for lp in plan.layers if lp.name.startswith("blocks.")]
    want = STRATEGIES[key]
    if "tp" in want:
        assert all(lp.strategy.tp == want["tp"][0] for lp in blocks)
    for field in ("sp", "dp_types", "recompute"):
        if field in want and len(want[field]) == 1:
            attr = {"dp_types": "dp_type"}.get(field, field)
            assert all(str(getattr(lp.strategy, attr)) == str(want[field][0]) for lp in blocks if lp.dp > 1 or
                       attr != "dp_type"), (key, [lp.strategy for lp in blocks])
    assert compare_with_plan(prog) == {lp.name: [] for lp in plan.layers}, summary["differences"]
    assert summary["matches_plan"] is True
    moved = sum(len(lay["fw_collectives"]) + len(lay["bw_collectives"]) + len(lay["step_collectives"])
                for lay in summary["layers"])
    assert moved > 0  # something to compare
    if key == "pp":
        assert plan.pp == 2 and set(prog.stages) == {0, 1}
    if key in ("ddp-bf16", "zero3-bf16", "ddp-powersgd"):  # fewer bytes than the fp32 sums of the same plan
        fp32 = _program(tiny, a100, key.split("-")[0], tmp_path_factory)[2]
        dp_bytes = lambda s: sum(c["bytes"] for lay in s["layers"] for c in  # noqa: E731
                                 lay["bw_collectives"] + lay["step_collectives"] if c["op"] in ("all_reduce", "reduce_scatter"))
        ratio = dp_bytes(summary) / dp_bytes(fp32)
        assert (0.45 < ratio <= 0.55) if key.endswith("bf16") else ratio < 0.2, (key, ratio)


def test_a_plan_that_priced_other_collectives_does_not_match(tiny, a100, tmp_path_factory):
    import dataclasses

    plan, prog, _, _ = _program(tiny, a100, "tp", tmp_path_factory)
    i = next(i for i, lp in enumerate(plan.layers) if any(c["phase"] == "fwd" for c in lp.collectives))
    lp = plan.layers[i]
    wrong = tuple(dict(c, bytes=c["bytes"] * 2) if c["phase"] == "fwd" else c for c in lp.collectives)
    other = dataclasses.replace(plan, layers=plan.layers[:i] + (dataclasses.replace(lp, collectives=wrong),)
                                + plan.layers[i + 1:])
    prog2 = lower(tiny, other)
    diffs = compare_with_plan(prog2)
    assert diffs[lp.name] and "the plan priced" in diffs[lp.name][0]
    bare = dataclasses.replace(plan, layers=tuple(dataclasses.replace(x, collectives=()) for x in plan.layers))
    assert any("records no priced collectives" in d[0] for d in compare_with_plan(lower(tiny, bare)).values() if d)


_LEAN: dict = {}


def _lean_program(mg, key: str, tp: int, sp: str, tmp_path_factory, world: int = 8):
    """A hand-made plan (every block ``tp`` with ``sp``; the ILP's memory-lean placements, every
    matrix sharded: Megatron's layout), lowered and dumped."""
    if key in _LEAN:
        return _LEAN[key]
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.ir.plan import LayerPlan, LayerPrediction, ParallelPlan, PlanPrediction, graph_hash
    from galvatron_fx.ir.strategy import LayerStrategy
    from galvatron_fx.search.intra_layer import solve_intra_layer

    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    layers = []
    for layer in mg.layers:
        lsp = sp if layer.role == "block" else "none"
        opt = solve_intra_layer(mg, layer, tp, lsp, cm, shard_params=True)
        layers.append(LayerPlan(name=layer.name, kind=layer.kind, role=layer.role, stage=0,
                                strategy=LayerStrategy(tp=tp, sp=lsp), dp=world // tp, placements=opt.placements,
                                predicted=LayerPrediction(fwd_s=0.0, bwd_s=0.0)))
    plan = ParallelPlan(model=key, graph_hash=graph_hash(mg), cluster_hash="c" * 64, world_size=world, pp=1,
                        num_microbatches=1, schedule="1f1b", global_batch_size=BATCH, virtual_stages=1,
                        micro_batch_size=BATCH // (world // tp), stage_boundaries=(0,),
                        stage_ranks=(tuple(range(world)),), layers=tuple(layers),
                        predicted=PlanPrediction(step_time_s=0.0, throughput_samples_s=0.0, peak_memory_bytes=(0,),
                                                 memory_budget_bytes=0), solver_stats={"search_s": 0.0})
    out = tmp_path_factory.mktemp(key)
    prog = lower(mg, plan, dump_dir=out)
    _LEAN[key] = (plan, prog, write_program(prog, out), out)
    return _LEAN[key]


MATMULS = {"mm", "addmm", "bmm"}


def _ops(text: str) -> list[str]:
    """The ops of a dumped graph in order (``aten.mm``, ``all_reduce``, a step graph's markers)."""
    out = []
    for line in text.splitlines():
        m = re.search(r"= torch\.ops\.(?:aten|_c10d_functional)\.(\w+)\.|= gfx_(\w+)\(", line)
        if m:
            out.append(m.group(1) or m.group(2))
    return out


def _in_order(ops: list[str], pattern: list) -> bool:
    """Whether ``pattern``'s items (an op, or a set of alternatives) occur in ``ops`` in order."""
    it = iter(ops)
    return all(any(o in (p if isinstance(p, set) else {p}) for o in it) for p in pattern)


def _text(out, name: str) -> str:
    return (out / name).read_text()


def test_megatron_blocks_all_reduce_after_the_row_parallel_matmul(tiny, tmp_path_factory):
    _, _, summary, out = _lean_program(tiny, "megatron", 2, "none", tmp_path_factory)
    fw, bw = _ops(_text(out, "blocks.0.fw.txt")), _ops(_text(out, "blocks.0.bw.txt"))
    # forward: a row-parallel matmul, then its all-reduce, twice (attention out, MLP out), the
    # last matmul's sum the block's last collective
    assert fw.count("all_reduce") == 2 and _in_order(fw, [MATMULS, "all_reduce", MATMULS, "all_reduce"]), fw
    last_mm = max(i for i, o in enumerate(fw) if o in MATMULS)
    assert "all_reduce" in fw[last_mm:]
    # backward: the input gradient of a column-parallel matmul summed over tp
    assert _in_order(bw, [MATMULS, "all_reduce"]), bw
    blk = next(lay for lay in summary["layers"] if lay["name"] == "blocks.0")
    assert [c["op"] for c in blk["fw_collectives"]] == ["all_reduce", "all_reduce"]


def test_sequence_parallel_blocks_gather_before_and_reduce_scatter_after(tiny, tmp_path_factory):
    _, _, _, out = _lean_program(tiny, "megatron_sp", 2, "megatron", tmp_path_factory)
    fw, bw = _ops(_text(out, "blocks.0.fw.txt")), _ops(_text(out, "blocks.0.bw.txt"))
    # the block takes and hands on its hidden state split on the sequence: gathered before its
    # first matmul, reduce-scattered after its last (the ILP keeps the norms on the gathered
    # sequence at this size)
    first_mm = min(i for i, o in enumerate(fw) if o in MATMULS)
    last_mm = max(i for i, o in enumerate(fw) if o in MATMULS)
    assert "all_gather_into_tensor" in fw[:first_mm] and "reduce_scatter_tensor" in fw[last_mm:], fw
    # backward: the output gradient gathered first; the partial sums of the gradient of each
    # value the column-parallel matmuls read all-reduced where the value is made (the norms'
    # outputs, replicated), and the input gradient then split locally to the sequence layout
    assert _in_order(bw, ["all_gather_into_tensor", MATMULS, "all_reduce", "native_layer_norm_backward",
                          MATMULS, "all_reduce", "native_layer_norm_backward", "split"]), bw


def test_ulysses_blocks_all_to_all_around_attention(tiny, tmp_path_factory):
    _, _, _, out = _lean_program(tiny, "ulysses", 2, "ulysses", tmp_path_factory)
    fw = _ops(_text(out, "blocks.0.fw.txt"))
    attn = "_scaled_dot_product_flash_attention_for_cpu"
    # the sequence split moves before attention (at this size the ILP gathers the whole sequence
    # at the block's entry rather than swapping it for heads: all-to-all or all-gather); weights
    # are whole, so no partial sum is all-reduced
    assert _in_order(fw, [{"all_to_all_single", "all_gather_into_tensor"}, attn]), fw
    assert "all_reduce" not in fw


def test_zero3_gathers_a_layer_before_its_forward_and_backward_and_reduce_scatters_after(tiny, a100,
                                                                                      tmp_path_factory):
    _, _, summary, out = _program(tiny, a100, "zero3", tmp_path_factory)
    step = _text(out, "stage0.txt")
    lines = [ln for ln in step.splitlines() if "'blocks.0'" in ln]
    kinds = [re.search(r"gfx_(\w+)\(", ln).group(1) for ln in lines]
    assert kinds == ["fsdp_all_gather", "layer_forward", "fsdp_all_gather", "layer_backward", "fsdp_reduce_scatter"]
    blk = next(lay for lay in summary["layers"] if lay["name"] == "blocks.0")
    assert [c["op"] for c in blk["fw_collectives"]] == ["all_gather"]
    assert [c["op"] for c in blk["bw_collectives"]] == ["all_gather", "reduce_scatter"]


def test_ddp_buckets_are_all_reduced_after_the_backward_that_completes_them(tiny, a100, tmp_path_factory):
    _, prog, summary, out = _program(tiny, a100, "ddp", tmp_path_factory)
    step = _ops(_text(out, "stage0.txt"))
    assert step.count("all_reduce_bucket") == len(prog.buckets) >= 1
    assert step[-1] == "all_reduce_bucket"
    assert step.index("all_reduce_bucket") > step.index("layer_backward")
    params = [p for b in summary["buckets"] for p in b["params"]]
    assert len(params) == len(set(params)) == len({p.name for p in tiny.params.values() if p.requires_grad})
    assert sum(b["bytes"] for b in summary["buckets"]) == sum(c["bytes"] for lay in summary["layers"]
                                                            for c in lay["step_collectives"])


def test_recomputation_runs_the_forward_ops_again_in_the_backward(tiny, a100, tmp_path_factory):
    _, prog, summary, out = _program(tiny, a100, "recompute", tmp_path_factory)
    text = _text(out, "blocks.0.bw.txt")
    bw = _ops(text)
    assert "# recomputation: full" in text
    assert _in_order(bw, ["native_layer_norm", "mm", "native_layer_norm_backward"]), bw
    lg = prog.graph_of("blocks.0")
    assert lg.recompute_bw is not None and any(n.meta.get("recompute") for n in lg.recompute_bw.graph.nodes)
    assert "recompute: PREFER_RECOMPUTE" in text
    blk = next(lay for lay in summary["layers"] if lay["name"] == "blocks.0")
    assert blk["recompute"] is True
    fw_ops = [c["op"] for c in blk["fw_collectives"] if c["group_size"] == 2]
    bw_ops = [c["op"] for c in blk["bw_collectives"] if c["group_size"] == 2]
    assert bw_ops[:len(fw_ops)] == fw_ops  # the forward's collectives again, first


def test_selective_recomputation_is_tags_the_partition_honours(tiny, a100, tmp_path_factory):
    """A selective layer's graphs recompute by themselves (no checkpoint around them): its
    forward ops are tagged with the policy, the partition saves the kept kernels' outputs and
    puts the rest again in the backward, tagged; nothing is run twice but those ops."""
    import operator

    from torch.utils.checkpoint import CheckpointPolicy

    from galvatron_fx.ir.recompute import SAVE_OUTPUTS_OF

    _, prog, summary, out = _program(tiny, a100, "selective", tmp_path_factory)
    _, plain, _, _ = _program(tiny, a100, "ddp", tmp_path_factory)
    lg, base = prog.graph_of("blocks.0"), plain.graph_of("blocks.0")
    assert lg.recompute == "selective" and lg.recompute_bw is None  # (the backward itself recomputes)

    def saved(g):
        (o,) = [n for n in g.fw.graph.nodes if n.op == "output"]
        return list(o.args[0])[len(g.trace.out_grad):]

    def packet(n):
        return getattr(n.target, "_overloadpacket", None)

    mine = saved(lg)
    assert len(mine) < len(saved(base))
    # what the forward keeps: parameters, inputs, the kept kernels' outputs (and their items)
    for v in mine:
        src = v.args[0] if v.op == "call_function" and v.target is operator.getitem else v
        assert v.op == "placeholder" or src.op == "placeholder" or packet(src) in SAVE_OUTPUTS_OF, v.format_node()
    again = [n for n in lg.bw.graph.nodes if n.meta.get("recompute") == CheckpointPolicy.PREFER_RECOMPUTE]
    assert any("layer_norm" in str(n.target) and "backward" not in str(n.target) for n in again)
    assert not any(packet(n) in SAVE_OUTPUTS_OF for n in again)  # matmuls are never run twice
    text = _text(out, "blocks.0.bw.txt")
    assert "# recomputation: selective" in text
    assert "ac_graph_id: 1 - PREFER_RECOMPUTE" in text  # (as fx prints a tagged node)
    blk = next(lay for lay in summary["layers"] if lay["name"] == "blocks.0")
    assert blk["recompute"] is True and summary["matches_plan"] is True


def test_a_pipeline_sends_at_the_end_of_stage_0_and_receives_first_on_stage_1(tiny, a100, tmp_path_factory):
    plan, _, _, out = _program(tiny, a100, "pp", tmp_path_factory)
    s0, s1 = _ops(_text(out, "stage0.txt")), _ops(_text(out, "stage1.txt"))
    fwd0 = s0[:s0.index("recv_grad")]
    assert fwd0[-1] == "send" and "layer_forward" in fwd0[:-1]
    assert s1[0] == "recv" and "send_grad" in s1
    assert "recv_grad" in s0 and s0.index("recv_grad") < s0.index("layer_backward")


def test_dumps_name_parameters_and_the_runner_dumps_every_pass(tiny, a100, tmp_path_factory):
    _, prog, summary, out = _program(tiny, a100, "tp", tmp_path_factory)
    fw = _text(out, "blocks.0.fw.txt")
    assert "blocks_0_attn_qkv_weight" in fw and "primals_" not in fw.split("\n")[3]
    assert "saved_" in _text(out, "blocks.0.bw.txt") and "grad_out0" in _text(out, "blocks.0.bw.txt")
    passes = sorted(p.name for p in (out / "passes" / "blocks.0").iterdir())
    for name in ("apply_placements", "partition_graphs", "clean_up_graphs", "hoist_saved_collectives",
                 "mark_recompute"):
        assert any(name in p for p in passes), (name, passes)
    assert any("split_stages" in p.name for p in (out / "passes").iterdir())
    assert json.loads((out / "summary.json").read_text()) == summary
    assert {lay["name"] for lay in summary["layers"]} == {l.name for l in tiny.layers}
    for lay in summary["layers"]:
        assert set(lay) >= {"name", "kind", "stage", "strategy", "fw_collectives", "bw_collectives", "recompute"}
        for c in lay["fw_collectives"] + lay["bw_collectives"]:
            assert set(c) == {"op", "group_size", "bytes"} and c["bytes"] > 0


def test_the_partition_is_aotautograds_own(tiny, a100, tmp_path_factory, monkeypatch):
    """The program's graphs are those AOTAutograd's own runtime would run: each layer traced again
    to the end (partitioned, compiled, run forward and backward on fake tensors) gives the same
    ops, and its outputs require grad where the lowering read it off the joint's tangents."""
    import torch
    from functorch.compile import aot_function, make_boxed_func
    from torch._functorch.partitioners import default_partition

    from galvatron_fx.passes import trace_layer
    from galvatron_fx.passes.clean_up_graphs import drop_identity_views, drop_unused_ops
    from galvatron_fx.passes.schedule_collectives import schedule_collectives

    aot: dict[int, dict] = {}  # id(joint) -> what AOTAutograd's compilers got, and its outputs' requires_grad

    def to_the_end(fn, _fw, _bw, partition_fn):
        seen: dict = {}

        def partition(joint, joint_inputs, *, num_fwd_outputs, **kw):
            with pytest.raises(trace_layer._JointTraced):  # (the lowering's own callback stops there)
                partition_fn(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
            seen["joint"] = id(joint)
            return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)

        def keep(slot):
            def compiler(gm, _example):
                seen[slot] = gm
                return make_boxed_func(gm.forward)
            return compiler

        traced = aot_function(fn, keep("fw"), keep("bw"), partition_fn=partition)

        def call(*args):
            outs = traced(*args)
            need = [o for o in outs if o.requires_grad]
            torch.autograd.backward(need, [torch.ones_like(o) for o in need])
            aot[seen["joint"]] = {"fw": seen["fw"], "bw": seen["bw"], "out_grad": [o.requires_grad for o in outs]}
            raise trace_layer._JointTraced  # (as the lowering's callback would have)
        return call

    plan = _plan(tiny, a100, "tp+megatron")  # (before the patch: the search may lower layers itself)
    monkeypatch.setattr(trace_layer, "aot_function", to_the_end)
    prog = lower(tiny, plan, dump_dir=tmp_path_factory.mktemp("aot_own"))
    assert len(aot) == len(prog.layer_graphs)
    for lg in prog.layer_graphs.values():
        theirs = aot[id(lg.trace.joint)]
        assert lg.trace.out_grad == theirs["out_grad"], lg.name
        for slot, mine in (("fw", lg.fw), ("bw", lg.bw)):
            gm = theirs[slot]
            drop_unused_ops(gm)
            if drop_identity_views(gm):
                drop_unused_ops(gm)
            schedule_collectives(gm)  # (the program's collectives are scheduled: the same nodes, reordered)
            ops = lambda g: [str(n.target) for n in g.graph.nodes if n.op == "call_function"]  # noqa: E731
            if slot == "bw" and lg.hoisted:
                continue  # (the program's backward lost its hoisted all-reduces)
            if slot == "fw" and lg.whole_inputs:
                continue  # (and its forward its folded counts: test_a_data_parallel_count_...)
            assert ops(mine) == ops(gm), (lg.name, slot)


def test_passes_refuse_to_run_out_of_order(tiny, a100):
    from galvatron_fx.passes.clean_up_graphs import clean_up_graphs_pass
    from galvatron_fx.passes.runner import PassContext, PassOrderError, run_pass

    with pytest.raises(PassOrderError, match="partitioned"):
        run_pass(clean_up_graphs_pass, object(), PassContext(produced={"decomposed"}))


def test_the_lower_command_writes_the_program_and_says_whether_it_matches(tmp_path, capsys):
    from galvatron_fx.cli import main

    plan_path = tmp_path / "plan.json"
    assert main(["plan", "gpt-tiny", "--nodes", "1", "--batch", "8", "--seq", "64", "--tp", "2", "--no-baselines",
                 "--out", str(plan_path)]) == 0
    assert main(["lower", "gpt-tiny", "--plan", str(plan_path), "--out", str(tmp_path / "low")]) == 0
    s = json.loads((tmp_path / "low" / "summary.json").read_text())
    assert s["matches_plan"] is True and "matches_plan=true" in capsys.readouterr().out
    assert (tmp_path / "low" / "blocks.0.fw.txt").exists() and (tmp_path / "low" / "passes").is_dir()
    # another model's plan is refused
    assert main(["lower", "llama-tiny", "--plan", str(plan_path), "--out", str(tmp_path / "x")]) == 2
    # an earlier output is written over; a directory of other files, or a file, is refused before anything runs
    assert main(["lower", "gpt-tiny", "--plan", str(plan_path), "--out", str(tmp_path / "low")]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["lower", "gpt-tiny", "--plan", str(plan_path), "--out", str(mine)]) == 2
    assert main(["lower", "gpt-tiny", "--plan", str(plan_path), "--out", str(mine / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert "a directory of other files" in err and "a file" in err and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_collectives_are_issued_early_and_waited_late(tiny, a100, tmp_path_factory):
    """schedule_collectives: a data-parallel mean loss (its count not folded) all-reduces its
    target count before its log-softmax and waits where it divides; the reordered graph
    computes the same values."""
    import copy

    import torch

    from galvatron_fx.passes import lower_program
    from galvatron_fx.passes.fold_input_reductions import fold_input_reductions_pass
    from galvatron_fx.passes.schedule_collectives import schedule_collectives

    # the count of targets is all-reduced when it is not folded (fold_input_reductions)
    plan = _program(tiny, a100, "ddp", tmp_path_factory)[0]
    unfolded = tuple(p for p in lower_program.LAYER_PASSES if p is not fold_input_reductions_pass)
    mp = pytest.MonkeyPatch()
    mp.setattr(lower_program, "LAYER_PASSES", unfolded)
    try:  # (a lowering that dumps keeps no lowering shared with the graph)
        prog = lower(tiny, plan, dump_dir=tmp_path_factory.mktemp("unfolded"))
    finally:
        mp.undo()
    loss = next(lg for lg in prog.layer_graphs.values() if lg.name == "loss")
    ops = [n for n in loss.fw.graph.nodes if n.op == "call_function"]
    names = [str(n.target) for n in ops]
    ar = next(i for i, t in enumerate(names) if "all_reduce" in t)
    wait = next(i for i, t in enumerate(names) if "wait_tensor" in t)
    assert ar < names.index("aten._log_softmax.default") < wait
    assert ops[wait + 1].target is torch.ops.aten.div.Tensor  # waited where the mean divides
    assert schedule_collectives(loss.fw) == 0  # scheduled once, stable after
    # the pass only reorders: an unscheduled copy computes the same values (the stand-in group
    # sums over one rank)
    g = torch.Generator().manual_seed(0)
    vals = [n.meta["val"] for n in loss.fw.graph.nodes if n.op == "placeholder"]
    args = [torch.randn(v.shape, generator=g) if v.is_floating_point() else
            torch.randint(0, 512, v.shape, generator=g) for v in vals]
    unscheduled = copy.deepcopy(loss.fw)
    for n in [n for n in unscheduled.graph.nodes if "wait_tensor" in str(n.target)]:
        n.args[0].append(n)  # back to right after its collective, as traced
    unscheduled.recompile()
    for a, b in zip(loss.fw(*args), unscheduled(*args)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_a_batch_of_one_on_one_dp_rank_lowers(name, a100):
    """On one data-parallel rank inputs are whole (Replicate), not Shard(0) of a batch of one,
    which DTensor cannot fold into the sequence dim (the micro-batch 1 of a tensor-parallel
    stage)."""
    model, inputs = zoo.build(name, batch_size=1, seq_len=SEQ, device="cpu", seed=0)
    mg = gfx.capture(model, inputs)
    import dataclasses

    for tp in (1, 2):
        plan = gfx.plan(mg, dataclasses.replace(a100, devices_per_node=tp), global_batch_size=1, baselines=False,
                        search={"tp": (tp,), "pp": (1,), "num_microbatches": (1,), "max_tp": tp,
                                "vocab_parallel": False})
        assert {lp.dp for lp in plan.layers} == {1}
        prog = lower(mg, plan)
        assert all(lg.fw is not None for lg in prog.layer_graphs.values())


def test_a_data_parallel_count_of_targets_is_computed_from_the_whole_labels(tiny, a100, tmp_path_factory):
    """fold_input_reductions: the DDP loss's count of targets needs no collective: every rank
    holds the whole labels. Its forward reads them whole (named so in the dump), issues no
    collective and computes what the unfolded forward computes when the whole labels are this
    rank's (the stand-in group sums over one rank)."""
    import torch

    from galvatron_fx.passes import lower_program
    from galvatron_fx.passes.fold_input_reductions import fold_input_reductions_pass

    plan, prog, summary, out = _program(tiny, a100, "ddp", tmp_path_factory)
    loss = next(lg for lg in prog.layer_graphs.values() if lg.name == "loss")
    assert loss.whole_inputs == [1]  # (logits, labels): the labels
    assert not [n for n in loss.fw.graph.nodes if "c10d" in str(n.target)]
    assert not next(lay for lay in summary["layers"] if lay["name"] == "loss")["fw_collectives"]
    assert "whole_" in _text(out, "loss.fw.txt") and summary["matches_plan"]
    mp = pytest.MonkeyPatch()
    mp.setattr(lower_program, "LAYER_PASSES",
               tuple(p for p in lower_program.LAYER_PASSES if p is not fold_input_reductions_pass))
    try:
        ref = next(lg for lg in lower(tiny, plan, dump_dir=tmp_path_factory.mktemp("ref")).layer_graphs.values()
                   if lg.name == "loss")
    finally:
        mp.undo()
    assert ref.whole_inputs == [] and [n for n in ref.fw.graph.nodes if "all_reduce" in str(n.target)]
    g = torch.Generator().manual_seed(0)
    local = [n.meta["val"] for n in ref.fw.graph.nodes if n.op == "placeholder"]  # this rank's pieces
    logits = torch.randn(local[0].shape, generator=g)
    labels = torch.randint(0, 512, tuple(local[1].shape), generator=g)
    labels[0, :5] = -100  # ignored targets are not counted
    for a, b in zip(loss.fw(logits, labels, labels), ref.fw(logits, labels)):
        assert torch.equal(a, b)


def _count_graph(dtype, *, group="dp", extra_input=False):
    """all_reduce(float(sum(x != 0))) over ``group``, as a traced loss counts its targets."""
    import torch
    import torch.fx as fx

    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 8, dtype=dtype, device="meta")
    y = g.placeholder("y")
    y.meta["val"] = torch.empty(4, 8, dtype=dtype, device="meta")
    v = g.call_function(aten.view.default, (x, [32]))
    v.meta["val"] = torch.empty(32, dtype=dtype, device="meta")
    ne = g.call_function(aten.ne.Tensor if extra_input else aten.ne.Scalar,
                         (v, g.call_function(aten.view.default, (y, [32])) if extra_input else 0))
    if extra_input:
        ne.args[1].meta["val"] = v.meta["val"]
    ne.meta["val"] = torch.empty(32, dtype=torch.bool, device="meta")
    if dtype.is_floating_point:  # a float value summed: not exact in any order
        ne = g.call_function(aten.mul.Tensor, (v, 2.0))
        ne.meta["val"] = v.meta["val"]
    s = g.call_function(aten.sum.default, (ne,))
    s.meta["val"] = torch.empty((), dtype=torch.int64 if not dtype.is_floating_point else dtype, device="meta")
    f = g.call_function(aten._to_copy.default, (s,), {"dtype": torch.float32})
    f.meta["val"] = torch.empty((), device="meta")
    ar = g.call_function(c10d.all_reduce.default, (f, "sum", group))
    w = g.call_function(c10d.wait_tensor.default, (ar,))
    g.output((w,))
    return fx.GraphModule({}, g), x


@pytest.mark.parametrize("case", ["count", "float", "other group", "reads another tensor"])
def test_only_an_exact_count_over_the_dp_group_of_one_input_is_folded(case):
    import torch

    from galvatron_fx.passes.fold_input_reductions import fold_input_reductions

    gm, x = _count_graph(torch.float32 if case == "float" else torch.int64,
                         group="tp" if case == "other group" else "dp", extra_input=case == "reads another tensor")
    added = fold_input_reductions(gm, {x: (0, (8, 8))}, "dp")
    has_ar = any("all_reduce" in str(n.target) for n in gm.graph.nodes)
    if case != "count":
        assert added == [] and has_ar
        return
    assert added == [0] and not has_ar
    whole = torch.randint(0, 3, (8, 8))
    (count,) = gm(whole[:4], whole[:4], whole)
    assert count.dtype == torch.float32 and count.item() == (whole != 0).sum().item()


def test_a_view_of_a_value_laid_out_otherwise_at_run_time_lowers(tmp_path):
    """HF GPT-2's attention output is traced laid out so that its transpose → view is viewable;
    under this plan (tp 2 everywhere, a vocab-parallel loss on latency-free links) DTensor hands
    the value over in another memory layout, which the view cannot read. The view then reads a
    contiguous copy: the layer lowers (it failed with ``Cannot view a tensor with shape ...``)
    and its program matches the plan."""
    import dataclasses

    import hf_tiny
    import torch.nn.functional as F

    from galvatron_fx.cost_models import AnalyticCostModel

    model, batch = hf_tiny.build("gpt2")

    def loss_fn(out, target):
        return F.cross_entropy(out.logits.flatten(0, 1), target.flatten())

    ids = batch["input_ids"]
    cluster = gfx.Cluster.local_cpu(2, cache_dir=tmp_path)  # no profile of this machine: the same everywhere
    cluster = dataclasses.replace(cluster, intra_node=dataclasses.replace(cluster.intra_node, latency_s=0.0))
    mg = gfx.capture(model, (ids, ids.roll(-1, 1)), loss_fn=loss_fn)
    plan = gfx.plan(mg, cluster, global_batch_size=4, search={"pp": (1,), "tp": (2,)},
                    cost_model=AnalyticCostModel(cluster))
    assert all(lp.strategy.tp == 2 for lp in plan.layers)
    prog = lower(mg, plan)
    assert [ll.name for ll in prog.layers] == [lp.name for lp in plan.layers]
    assert all(ll.graphs.fw is not None for ll in prog.layers)
