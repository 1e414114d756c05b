"""ParallelModule on real gloo ranks: planned models train like the single-process model.

Spawned once per world size (2 and 4); every rank runs every case and writes its figures; checks
run in the parent. Per plan: the loss of the first micro-batch step, full gradients after one
step's backward, and parameters after 3 AdamW steps against the plain model (fp32). Also the
reshard primitive on its own, ``compile``'s world-size and plan-hash checks.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn

T = 16  # sequence length
TOL = 1e-5  # losses and gradients, absolute (fp32)
PARAM_TOL = 2e-4  # parameters after 3 AdamW steps at lr 1e-3: Adam's normalised update turns
#                   float noise in near-zero gradients into up to lr-sized differences
STEPS = 3

# name -> (model, global batch, num_microbatches, [(dp, tp, sp, recompute) for embedding, blocks..., head, loss])
# a spec entry may be one tuple for every layer
CASES = {
    2: {
        "dp2": ("gpt-tiny", 4, 1, (2, 1, "none", "none")),
        "tp2": ("gpt-tiny", 4, 1, (1, 2, "none", "none")),
        "tp2-sp": ("gpt-tiny", 4, 1, (1, 2, "megatron", "none")),
        "dp2-full-recompute-m2": ("gpt-tiny", 8, 2, (2, 1, "none", "full")),
        "tp2-selective": ("gpt-tiny", 4, 1, (1, 2, "none", "selective")),
        "llama-tp2-sp": ("llama-tiny", 4, 1, (1, 2, "megatron", "none")),
        "dp2-zero3-m2": ("gpt-tiny", 8, 2, (2, 1, "none", "none", "zero3")),  # tied embedding/head: one unit
        # a batch of one on one dp rank (a tensor-parallel stage's micro-batch 1): inputs whole
        "tp2-batch1": ("gpt-tiny", 1, 1, (1, 2, "none", "none")),
        "llama-tp2-sp-batch1": ("llama-tiny", 1, 1, (1, 2, "megatron", "none")),
    },
    4: {
        "dp2tp2": ("gpt-tiny", 4, 1, (2, 2, "none", "none")),
        "mixed": ("gpt-tiny", 4, 1, [(4, 1, "none", "none"),      # embedding
                                     (2, 2, "none", "none"),      # blocks.0
                                     (1, 4, "none", "none"),      # blocks.1
                                     (4, 1, "none", "full"),      # blocks.2
                                     (2, 2, "megatron", "none"),  # blocks.3
                                     (1, 4, "none", "none"),      # head
                                     (2, 2, "none", "none")]),    # loss
        "llama-dp2tp2-sp-zero3": ("llama-tiny", 4, 1, (2, 2, "megatron", "none", "zero3")),
        "llama-dp2tp2-selective": ("llama-tiny", 4, 1, (2, 2, "none", "selective")),
        "gpt-tp4-ulysses": ("gpt-tiny", 4, 1, (1, 4, "ulysses", "none")),
    },
    8: {  # slow
        "mixed8": ("gpt-tiny", 16, 2, [(8, 1, "none", "none"),            # embedding
                                      (4, 2, "none", "none", "zero3"),   # blocks.0
                                      (2, 4, "megatron", "none"),        # blocks.1
                                      (8, 1, "none", "full", "zero2"),   # blocks.2
                                      (2, 4, "none", "selective"),       # blocks.3
                                      (4, 2, "none", "none"),            # head
                                      (8, 1, "none", "none")]),          # loss
        "llama-dp4tp2-zero2": ("llama-tiny", 8, 1, (4, 2, "megatron", "none", "zero2")),
    },
}
TIMED = "dp2"



# ---- helpers shared with the worker -------------------------------------------------------------

def build(name: str, batch: int, seed: int = 0):
    """The zoo model, its graph captured at ``batch`` samples and the example inputs."""
    import galvatron_fx as gfx
    from galvatron_fx import zoo

    model, inputs = zoo.build(name, batch_size=batch, seq_len=T, device="cpu", seed=seed)
    return model, gfx.capture(model, inputs), inputs


_OPTIONS: dict = {}


def make_plan(mg, world: int, spec, *, gbs: int, m: int, name: str = "test", pp: int = 1,
              boundaries: tuple[int, ...] = (0,), schedule: str = "1f1b", options: dict | None = None):
    """A hand-made plan: per layer (dp, tp, sp, recompute[, dp_type[, offload]]), placements from the ILP
    (the memory-lean variant: every matrix weight sharded, so tp>1 really shards; ``options``:
    layer kind -> a solved ``LayerOption`` to take instead). ``pp > 1``:
    chunks start at ``boundaries`` (``pp × virtual stages`` of them), chunk c on stage c % pp,
    stages on contiguous rank blocks; each layer's dp × tp covers a stage."""
    import galvatron_fx as gfx
    from galvatron_fx.cost_models import AnalyticCostModel
    from galvatron_fx.ir.plan import LayerPlan, LayerPrediction, ParallelPlan, PlanPrediction, graph_hash
    from galvatron_fx.ir.strategy import LayerStrategy
    from galvatron_fx.passes.decompose_layer import decompose_layer
    from galvatron_fx.search.intra_layer import solve_intra_layer

    spec = spec if isinstance(spec, list) else [spec] * len(mg.layers)
    cm = AnalyticCostModel(gfx.Cluster.preset("dgx-a100-80g"))
    layers = []
    chunk_of = {}
    ends = (*boundaries[1:], len(mg.layers))
    for c, (a, e) in enumerate(zip(boundaries, ends)):
        chunk_of.update({i: c for i in range(a, e)})
    for i, (layer, (dp, tp, sp, rc, *rest)) in enumerate(zip(mg.layers, spec)):
        assert dp * tp * pp == world
        if layer.role != "block":
            sp = "none"  # sequence parallelism shards the blocks' hidden states
        placements = {}
        if options and layer.kind in options:
            placements = options[layer.kind].placements
        elif tp > 1:
            key = (id(mg), layer.kind, tp, sp)
            if key not in _OPTIONS:
                _OPTIONS[key] = solve_intra_layer(mg, layer, tp, sp, cm, decomposed=decompose_layer(mg, layer),
                                                  shard_params=True)
            placements = _OPTIONS[key].placements
        layers.append(LayerPlan(name=layer.name, kind=layer.kind, role=layer.role, stage=chunk_of[i] % pp,
                                strategy=LayerStrategy(tp=tp, sp=sp, recompute=rc, dp_type=(rest or ["ddp"])[0],
                                                       offload=len(rest) > 1 and rest[1]),
                                dp=dp, placements=placements, predicted=LayerPrediction(fwd_s=0.0, bwd_s=0.0)))
    k = world // pp
    return ParallelPlan(model=name, graph_hash=graph_hash(mg), cluster_hash="c" * 64, world_size=world, pp=pp,
                        num_microbatches=m, schedule=schedule, global_batch_size=gbs,
                        virtual_stages=len(boundaries) // pp,
                        micro_batch_size=max(1, gbs // m // max(d for d, *_ in spec)),
                        stage_boundaries=tuple(boundaries),
                        stage_ranks=tuple(tuple(range(s * k, (s + 1) * k)) for s in range(pp)), layers=tuple(layers),
                        predicted=PlanPrediction(step_time_s=0.0, throughput_samples_s=0.0, peak_memory_bytes=(0,) * pp,
                                                 memory_budget_bytes=0),
                        solver_stats={"search_s": 0.0})


def _batches(gbs: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(123)
    return [(torch.randint(0, 64, (gbs, T), generator=g), torch.randint(0, 64, (gbs, T), generator=g))
            for _ in range(steps)]


def _full_grads(pm) -> dict:
    out = {}
    for ex in pm.executors:
        for key, fqn in ex.fqn_of_key.items():
            g = ex.full_grad(key)
            if g is not None and fqn not in out:
                out[fqn] = g
    return out


def compare_training(model, pm, batches, m: int, *, on_first_grads=None) -> tuple[dict, object, object]:
    """Train ``pm`` and a copy of ``model`` on the same batches (AdamW, lr 1e-3, ``m``
    micro-batches); record loss, step-1 gradient and final parameter differences.

    ``on_first_grads(res)`` runs after the first backward and grad sync (before the optimizer
    step). Returns ``(res, ref_step, opt)`` for callers that time or inspect further.
    """
    import copy

    import torch

    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res: dict = {}

    def ref_step(batch, record=False):
        chunks = [x.chunk(m) for x in batch]
        total = 0.0
        for i in range(m):
            loss = ref(*(c[i] for c in chunks))
            (loss / m).backward()
            total += loss.item()
        grads = {k: p.grad.clone() for k, p in ref.named_parameters()} if record else None
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        return total / m, grads

    # step 1 by hand as a DDP loop, to see the grads (micro-batches accumulated under no_sync, the
    # sync run when the last backward ends); then train_step
    chunks = [x.chunk(m) for x in batches[0]]
    total = 0.0
    for i in range(m):
        with pm.no_sync() if i < m - 1 else contextlib.nullcontext():
            loss = pm(*(c[i] for c in chunks))
            (loss / m).backward()
        total += loss.item()
    grads = _full_grads(pm)
    if on_first_grads is not None:
        on_first_grads(res)
    opt.step()
    opt.zero_grad(set_to_none=True)
    ref_loss, ref_grads = ref_step(batches[0], record=True)
    res["loss_errs"] = [abs(total / m - ref_loss)]
    gerrs = {k: (grads[k] - g).abs().max().item() for k, g in ref_grads.items() if k in grads}
    res["grad_err"] = max(gerrs.values())
    res["grad_err_at"] = max(gerrs, key=gerrs.get)
    res["grads_compared"] = sum(k in grads for k in ref_grads)
    res["num_ref_params"] = len(ref_grads)
    for b in batches[1:]:
        got = pm.train_step(b, opt)
        want, _ = ref_step(b)
        res["loss_errs"].append(abs(got - want))
    sd = pm.state_dict()
    ref_sd = ref.state_dict()
    res["missing_keys"] = sorted(set(ref_sd) - set(sd))
    errs = {k: (sd[k] - v).abs().max().item() for k, v in ref_sd.items() if k in sd}
    res["param_err"] = max(errs.values())
    res["param_err_at"] = max(errs, key=errs.get)
    res["param_moved"] = max((v - model.state_dict()[k]).abs().max().item() for k, v in ref_sd.items())
    res["shapes_ok"] = all(tuple(sd[k].shape) == tuple(v.shape) for k, v in ref_sd.items() if k in sd)
    return res, ref_step, opt


LOOP_STEPS = 5
MAX_NORM = 0.05  # below every step's gradient norm of gpt-tiny here: every step clips


def warmup_cosine(opt, warmup: int = 2, total: int = LOOP_STEPS):
    """A warmup-cosine ``LambdaLR`` (the schedule an LLM recipe uses)."""
    import math

    import torch

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def _micro_losses(ref, batch, m: int):
    """The reference model's loss on each of ``m`` micro-batches of a positional batch."""
    chunks = [x.chunk(m) for x in batch]
    return (ref(*(c[i] for c in chunks)) for i in range(m))


def no_decay(name: str) -> bool:
    """The parameters a recipe exempts from weight decay, by the user's FQN: biases and norms."""
    leaf = name.rsplit(".", 2)
    return name.endswith("bias") or any("norm" in x or x.startswith("ln") for x in leaf[:-1])


def _adamw(named):
    """AdamW with weight decay 0.1 on all but biases and norms, grouped by name as a recipe does."""
    import torch

    return torch.optim.AdamW([{"params": [p for n, p in named if not no_decay(n)], "weight_decay": 0.1},
                              {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}], lr=1e-3)


def compare_user_loop(model, pm, batches, m: int, *, short_form: bool = False, local: bool = False,
                      accumulate: int = 1, backward: bool = False, micro_losses=_micro_losses,
                      optimizer=_adamw) -> dict:
    """The loop a user owns, against one process: ``pm.forward_backward(batch)``, then
    ``pm.clip_grad_norm_(MAX_NORM)``, AdamW with decoupled weight decay on all but norms and
    biases (parameter groups by ``pm.named_parameters()``'s names, which must be the model's) and a
    warmup-cosine ``LambdaLR`` stepped by the loop, ``zero_grad``; the reference runs the same
    loop on a copy of ``model`` with ``torch.nn.utils.clip_grad_norm_``. Records each step's loss
    and total-norm relative differences and the parameters' largest difference after the last
    step. ``short_form``: the same loop as ``pm.train_step(batch, opt, max_norm=, scheduler=)`` (no
    norm to compare). ``local``: ``inputs="local"``, each rank passing only its replica's share of
    each global batch (``pm.data_parallel_rank`` of ``pm.data_parallel_size``); then a step whose
    shares differ in shape is refused (recorded as ``mismatch``). ``accumulate``: each step sums the
    gradients of that many batches (the step's and the next ones), all but the last
    ``forward_backward`` inside ``pm.no_sync()``. ``backward``: a loop written for DDP instead,
    ``loss = pm(batch); loss.backward()`` on the whole batch (the sync hooked to backward's end).
    ``micro_losses(ref, batch, m)``: the
    reference's loss per micro-batch (a Hugging Face batch by name: its ``.loss``);
    ``optimizer(named_parameters)``: the AdamW both sides step (parameter groups)."""
    import contextlib
    import copy

    import torch

    ref = copy.deepcopy(model)
    named, ref_named = list(pm.named_parameters()), list(ref.named_parameters())
    opt, ref_opt = optimizer(named), optimizer(ref_named)
    sched, ref_sched = warmup_cosine(opt), warmup_cosine(ref_opt)
    res: dict = {"loss_rel": [], "norm_rel": [], "ref_norms": [],
                 "unknown_names": sorted({n for n, _ in named} - {n for n, _ in ref_named}),
                 "no_decay": sum(no_decay(n) for n, _ in named)}
    if local:
        pm.set_inputs("local")
        d, k = pm.data_parallel_size, pm.data_parallel_rank
        res["dp_size"] = d
    for step, _batch in enumerate(batches):
        group = [batches[(step + j) % len(batches)] for j in range(accumulate)]
        shares = [tuple(x.chunk(d)[k] for x in b) if local else b for b in group]
        if short_form:
            loss, norm = pm.train_step(shares[0], opt, max_norm=MAX_NORM, scheduler=sched), None
        else:
            for j, share in enumerate(shares):
                with pm.no_sync() if j < accumulate - 1 else contextlib.nullcontext():
                    if backward:
                        got = pm(share) if isinstance(share, dict) else pm(*share)
                        got.backward()
                    else:
                        got = pm.forward_backward(share)
                loss = got if j == 0 else loss
            norm = pm.clip_grad_norm_(MAX_NORM)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        want = 0.0
        for j, whole in enumerate(group):
            total = 0.0
            for part in micro_losses(ref, whole, m):
                (part / m).backward()
                total += part.item() / m
            want = total if j == 0 else want
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
        ref_opt.step()
        ref_sched.step()
        ref_opt.zero_grad(set_to_none=True)
        res["loss_rel"].append(abs(float(loss) - want) / abs(want))
        res["norm_rel"].append(0.0 if norm is None else abs(float(norm) - float(ref_norm)) / float(ref_norm))
        res["ref_norms"].append(float(ref_norm))
    with torch.no_grad():  # evaluation: the trained model's loss on a batch, no gradient, no step
        share = shares[0]
        got = pm(share) if isinstance(share, dict) else pm(*share)
        want = sum(part.item() for part in micro_losses(ref, group[0], m)) / m
        res["eval_rel"] = abs(float(got) - want) / abs(want)
        res["eval_grads"] = sum(p.grad is not None for p in pm.parameters())
        if isinstance(share, dict):  # its outputs too: logits, whole (from a pipeline's last stage too)
            out, ref_out = pm(share, outputs=True), ref(**group[0])
            res["logits_err"] = (out["logits"] - ref_out.logits).abs().max().item()
            res["outputs_loss_rel"] = abs(float(out["loss"]) - want) / abs(want)
    # half the batch (where it still splits over every layer's dp) and half the sequence: an
    # evaluation, then a last, smaller training step, against one process
    dps = math.lcm(*(lp.dp for lp in pm.plan.layers))
    n = len(_first(group[0]))
    n = n // 2 if (n // 2) % dps == 0 else n
    half = _halved(group[0], n)
    mine = half if not local else tuple(x.chunk(d)[k] for x in half)
    with torch.no_grad():
        got = pm(mine) if isinstance(mine, dict) else pm(*mine)
        want = float(next(iter(micro_losses(ref, half, 1))))
    res["eval_half_rel"] = abs(float(got) - want) / abs(want)
    loss = pm.forward_backward(mine)
    norm = pm.clip_grad_norm_(MAX_NORM)
    opt.step()
    opt.zero_grad(set_to_none=True)
    want_loss = next(iter(micro_losses(ref, half, 1)))
    want_loss.backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
    ref_opt.step()
    ref_opt.zero_grad(set_to_none=True)
    res["half_step_rel"] = [abs(float(loss) - want_loss.item()) / want_loss.item(),
                            abs(float(norm) - float(ref_norm)) / float(ref_norm)]
    res["shapes"] = pm.shape_cache_info()
    res["half_shape"] = [list(x.shape) for x in (half.values() if isinstance(half, dict) else half)]
    sd, ref_sd = pm.state_dict(), ref.state_dict()
    res["param_err"] = max((sd[n] - v).abs().max().item() for n, v in ref_sd.items() if n in sd)
    res["missing"] = sorted(set(ref_sd) - set(sd))
    res["param_moved"] = max((v - model.state_dict()[n]).abs().max().item() for n, v in ref_sd.items())
    if local:  # one rank's share one sample short: refused on every rank, before any collective hangs
        import torch.distributed as dist

        from galvatron_fx.errors import ConfigError

        short = tuple(x[: len(x) - (dist.get_rank() == 1)] for x in shares[0])
        try:
            pm.forward_backward(short)
            res["mismatch"] = "no error"
        except ConfigError as e:
            res["mismatch"] = str(e)
    return res


def _first(batch):
    return next(iter(batch.values())) if isinstance(batch, dict) else batch[0]


def _halved(batch, n: int):
    """The first ``n`` samples of ``batch`` and the first half of their sequence (dim 1)."""
    cut = lambda x: x[:n, : x.shape[1] // 2] if x.ndim >= 2 else x[:n]  # noqa: E731
    return {k: cut(v) for k, v in batch.items()} if isinstance(batch, dict) else tuple(cut(x) for x in batch)


def check_user_loop(results: dict, key: str) -> None:
    """The checks of :func:`compare_user_loop`'s figures, on every rank."""
    for rank, by_case in results.items():
        c = by_case[key]
        assert "error" not in c, f"rank {rank}: {c.get('trace', c.get('error'))}"
        assert max(c["loss_rel"]) <= TOL, f"rank {rank}: losses differ by {c['loss_rel']}"
        assert max(c["norm_rel"]) <= TOL, f"rank {rank}: total norms differ by {c['norm_rel']}"
        assert min(c["ref_norms"]) > MAX_NORM, "a step did not clip: the test cannot see clipping"
        assert c["param_err"] <= PARAM_TOL, f"rank {rank}: parameters differ by {c['param_err']}"
        assert c["param_moved"] > 10 * PARAM_TOL
        assert not c["unknown_names"], f"rank {rank}: pm.named_parameters() names {c['unknown_names'][:4]} " \
                                       "the model does not have"
        assert c["no_decay"] > 0, "no parameter fell in the no-decay group: the groups test nothing"
        assert c["eval_rel"] <= TOL and c["eval_grads"] == 0, f"rank {rank}: eval loss differs by {c['eval_rel']}"
        if "logits_err" in c:
            assert c["logits_err"] <= TOL and c["outputs_loss_rel"] <= TOL, (c["logits_err"], c["outputs_loss_rel"])
        if "shapes" in c:  # another batch and sequence: one capture, kept for the step after the evaluation
            assert c["eval_half_rel"] <= TOL and max(c["half_step_rel"]) <= TOL, (c["eval_half_rel"], c["half_step_rel"])
            assert c["shapes"]["recaptures"] == 1 and c["shapes"]["size"] == 1, c["shapes"]
        if "dp_size" in c:  # inputs="local": the shares really differ, and a misshapen one is refused
            assert c["dp_size"] > 1
            assert "different shapes" in c["mismatch"] and "inputs='local'" in c["mismatch"], c["mismatch"]


def _case(key: str, world: int, cache: dict) -> dict:
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    name, gbs, m, spec = CASES[world][key]
    if (name, gbs // m) not in cache:
        cache[(name, gbs // m)] = build(name, gbs // m)
    model, mg, _ = cache[(name, gbs // m)]
    plan = make_plan(mg, world, spec, gbs=gbs, m=m, name=key)
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    batches = _batches(gbs, STEPS)
    res, ref_step, opt = compare_training(model, pm, batches, m)
    res["option_source"] = pm.option_source
    # the executors run the program lowered before the first step, not a trace of their own
    res["runs_program"] = [ex.lowered is not None and ex.lowered.program is not None for ex in pm.executors]
    res["lowered_layers"] = [lay.name for lay in pm.program.layers]
    # a selective layer's graphs recompute by themselves: no checkpoint around its run
    res["selective_bare"] = [ex.lowered.program.recompute == "selective" and isinstance(run, functools.partial)
                             for ex, run, lp in zip(pm.executors, pm._ckpt, plan.layers)
                             if lp.strategy.recompute == "selective"]
    res["num_params"] = len(list(pm.parameters()))
    res["num_model_params"] = len(list(model.parameters()))
    if key == TIMED and world == 2:
        b = batches[0]
        for label, fn in (("ref_step_s", lambda: ref_step(b)), ("pm_step_s", lambda: pm.train_step(b, opt))):
            fn()
            torch.distributed.barrier()
            t0 = time.perf_counter()
            for _ in range(3):
                fn()
            res[label] = (time.perf_counter() - t0) / 3
        res |= _hoisted_checks(pm, opt, b, m)
    return res


def _hoisted_checks(pm, opt, batch, m) -> dict:
    """The loss layer's token count over dp is all-reduced in its forward (the global count a
    mean divides by), none in its backward; forwards with no backward leave a bounded number of
    hoisted collectives in flight, and a training step leaves none."""
    import torch

    from galvatron_fx.runtime import lowered

    graphs = pm.executors[-1].lowered.graphs
    res = {"hoisted": len(graphs.hoisted), "whole_inputs": list(pm.executors[-1].lowered.whole_inputs),
           "fw_all_reduces": graphs.fw.source.count("_all_reduce_"),
           "bw_all_reduces": graphs.bw.source.count("_all_reduce_")}
    xs = [x.chunk(m)[0] for x in batch]
    for _ in range(lowered._MAX_IN_FLIGHT + 6):
        loss = pm(*xs)  # with grad, never backward
    res["in_flight_after_forwards"] = len(lowered._IN_FLIGHT)
    del loss
    got = pm.train_step(batch, opt)
    res["in_flight_after_step"] = len(lowered._IN_FLIGHT)
    res["step_loss_finite"] = bool(torch.isfinite(torch.tensor(got)))
    return res


def _reshard_case(world: int) -> dict:
    """A (B, T, C) tensor through (dp, tp) layouts over the same ranks and back; the grad of a
    weighted sum equals the weights on every path."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from galvatron_fx.runtime.reshard import reshard

    g = torch.Generator().manual_seed(5)
    full = torch.randn(4, 8, 12, generator=g)
    w = torch.randn(4, 8, 12, generator=g)
    shapes = [(world, 1), (1, world)] + ([(2, 2)] if world == 4 else [])
    meshes = {s: init_device_mesh("cpu", s, mesh_dim_names=("dp", "tp")) for s in shapes}
    layouts = [(Shard(0), Replicate()), (Shard(0), Shard(1)), (Replicate(), Shard(2)), (Shard(0), Shard(2))]
    errs = []
    for s1 in shapes:
        for s2 in shapes:
            for l1 in layouts:
                for l2 in layouts:
                    x = distribute_tensor(full, meshes[s1], l1).detach().requires_grad_()
                    y = reshard(x, meshes[s2], l2)
                    assert tuple(y.placements) == l2 and y.device_mesh is meshes[s2]
                    fwd = (y.full_tensor() - full).abs().max().item()
                    (y * distribute_tensor(w, meshes[s2], l2)).sum().backward()
                    bwd = (x.grad.full_tensor() - w).abs().max().item()
                    errs.append(max(fwd, bwd))
    return {"max_err": max(errs), "num": len(errs)}


def _buckets_case(world: int) -> dict:
    """Bucketed dp sums equal one all-reduce per tensor: unarmed (all after backward) and armed
    (launched from grad hooks during backward), with a parameter that gets no gradient."""
    import torch
    import torch.distributed as dist

    from galvatron_fx.runtime.buckets import GradBucketer, all_reduce_coalesced

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    shapes = [(300,), (17, 5), (1000,), (3, 3), (40000,)]
    res = {}
    ts = [torch.randn(s, generator=g) for s in shapes]
    want = [t.clone() for t in ts]
    for t in want:
        dist.all_reduce(t)
    res["coalesced_calls"] = all_reduce_coalesced(ts, bucket_bytes=8000)
    res["coalesced_err"] = max((a - b).abs().max().item() for a, b in zip(ts, want))
    for armed in (False, True):
        ps = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
        bk = GradBucketer(ps, None, bucket_bytes=8000, first_bucket_bytes=1500)
        if armed:
            bk.arm()
        x = torch.randn(4, generator=g)
        loss = sum((p.sum() * x.sum()) for i, p in enumerate(ps) if i != 1)  # ps[1] gets no grad
        loss.backward()
        launched_in_backward = len(bk._pending)
        total = x.sum().clone()
        dist.all_reduce(total)  # every grad is x.sum() on each rank; their sum is this
        ref = [None if i == 1 else torch.full(s, total.item()) for i, s in enumerate(shapes)]
        res[f"armed{armed}_calls"] = bk.finish()
        res[f"armed{armed}_in_backward"] = launched_in_backward
        res[f"armed{armed}_err"] = max((p.grad - r).abs().max().item() / abs(total.item())
                                       for p, r in zip(ps, ref) if r is not None)
        res[f"armed{armed}_none_kept"] = ps[1].grad is None
        bk.remove()
    # tied copies as one entry: summed locally, reduced once, every copy gets the sum
    for armed in (False, True):
        a, b, c = (torch.nn.Parameter(torch.ones(50)) for _ in range(3))
        bk = GradBucketer([c, [a, b]], None, bucket_bytes=100, first_bucket_bytes=100)
        if armed:
            bk.arm()
        ((a * 2.0).sum() + (b * 3.0).sum() + c.sum()).backward()
        res[f"tied_armed{armed}_in_backward"] = len(bk._pending)
        res[f"tied_armed{armed}_calls"] = bk.finish()
        want = 5.0 * dist.get_world_size()
        res[f"tied_armed{armed}_err"] = max((a.grad - want).abs().max().item(), (b.grad - want).abs().max().item(),
                                          (c.grad - dist.get_world_size()).abs().max().item())
        res[f"tied_armed{armed}_distinct"] = a.grad.data_ptr() != b.grad.data_ptr()
        bk.remove()
    # a loss summed with the last bucket: no collective of its own, whichever bucket launches last
    for armed_grads in (True, False):
        ps = [torch.nn.Parameter(torch.ones(s)) for s in [(300,), (1000,)]]
        bk = GradBucketer(ps, None, bucket_bytes=2000, first_bucket_bytes=1500)
        extra = torch.tensor([float(rank + 1), 2.0])
        bk.arm(extra=extra)
        if armed_grads:
            sum(p.sum() for p in ps).backward()
        res[f"extra{armed_grads}_calls"] = bk.finish()
        want = torch.tensor([sum(r + 1.0 for r in range(dist.get_world_size())), 2.0 * dist.get_world_size()])
        res[f"extra{armed_grads}_err"] = (bk.extra_sum - want).abs().max().item()
        res[f"extra{armed_grads}_grads_ok"] = all(p.grad is None for p in ps) if not armed_grads else \
            all(torch.equal(p.grad, torch.full_like(p, dist.get_world_size())) for p in ps)
        bk.remove()
    # several steps: a gradient the caller holds keeps its values, and gradients accumulated in
    # place into last step's views (zero_grad without set_to_none) are reduced right
    ps = [torch.nn.Parameter(torch.ones(s)) for s in [(300,), (700,), (50,)]]
    bk = GradBucketer(ps, None, bucket_bytes=1 << 20, first_bucket_bytes=1 << 20)  # one bucket
    world = dist.get_world_size()
    held, errs = None, []
    for step, (to_none, keep) in enumerate([(True, False), (True, True), (True, False), (False, False),
                                            (False, False)]):
        if to_none:
            for p in ps:
                p.grad = None
        else:
            for p in ps:
                p.grad.zero_()
        bk.arm(extra=torch.tensor([float(step)]))
        sum((p * (step + 1.0)).sum() for p in ps).backward()
        bk.finish()
        errs.append(max((p.grad - (step + 1.0) * world).abs().max().item() for p in ps))
        errs.append((bk.extra_sum - step * world).abs().max().item())
        if keep:
            held = [p.grad for p in ps]
    res["steps_err"] = max(errs)
    res["held_err"] = max((g - 2.0 * world).abs().max().item() for g in held)
    bk.remove()
    return res


def _errors_case(world: int, cache: dict) -> dict:
    """compile's checks: a plan for another world size; different plans on different ranks."""
    import copy

    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx.api import compile as gfx_compile

    model, mg, inputs = cache.get(("gpt-tiny", 4)) or build("gpt-tiny", 4)
    out = {}
    other_world = make_plan(mg, 2 * world, (2 * world, 1, "none", "none"), gbs=8 * world, m=1)
    try:
        gfx_compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), inputs, global_batch_size=4,
                    plan=other_world)
        out["world"] = "no error"
    except gfx.PlanError as e:
        out["world"] = f"PlanError: {e}"
    rc = "full" if dist.get_rank() == 0 else "none"  # rank 0 holds another plan
    mine = make_plan(mg, world, (world, 1, "none", rc), gbs=4, m=1)
    try:
        gfx_compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), inputs, global_batch_size=4, plan=mine)
        out["hash"] = "no error"
    except gfx.PlanError as e:
        out["hash"] = f"PlanError: {e}"
    dist.barrier()  # nobody is left waiting
    same = make_plan(mg, world, (world, 1, "none", "none"), gbs=4, m=1)
    pm = gfx_compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), inputs, global_batch_size=4, plan=same)
    out["compiled_loss"] = pm(*inputs).item()
    out["ref_loss"] = model(*inputs).item()
    # the planner's own plan, from the example inputs (4 samples) to a global batch of 8
    import torch

    pm = gfx_compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), inputs, global_batch_size=8,
                     search={"pp": (1,)})
    out["planned"] = [f"dp{lp.dp} tp{lp.strategy.tp} {lp.strategy.sp} {lp.strategy.dp_type} {lp.strategy.recompute}"
                      for lp in pm.plan.layers]
    batch = _batches(8, 1)[0]
    got = pm.train_step(batch, torch.optim.AdamW(pm.parameters(), lr=1e-3))
    chunks = [x.chunk(pm.plan.num_microbatches) for x in batch]
    want = sum(model(*(c[i] for c in chunks)).item() for i in range(pm.plan.num_microbatches))
    out["planned_loss_err"] = abs(got - want / pm.plan.num_microbatches)
    return out


def _dumped(directory) -> dict:
    """What compile(dump_dir=) wrote: the files, the summary."""
    import json
    from pathlib import Path

    d = Path(directory)
    if not (d / "summary.json").exists():
        return {"files": sorted(p.name for p in d.iterdir()) if d.exists() else []}
    s = json.loads((d / "summary.json").read_text())
    return {"files": sorted(p.name for p in d.iterdir()), "layers": [lay["name"] for lay in s["layers"]],
            "matches_plan": s["matches_plan"], "differences": s["differences"],
            "graphs": sorted({lay["graphs"] for lay in s["layers"]})}


def _compile_more_case(world: int, cache: dict, tmp: str) -> dict:
    """compile(loss_fn=...) on a model that returns outputs, with dump_dir; compile of a
    pipelined plan, with dump_dir."""
    import copy
    import json
    import os

    import torch
    from torch import nn

    import galvatron_fx as gfx
    from galvatron_fx.api import compile as gfx_compile

    class Block(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.fc, self.proj = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, h):
            return h + self.proj(torch.nn.functional.gelu(self.fc(h)))

    class Net(nn.Module):  # returns predictions, not a loss
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(16, 32), nn.Linear(32, 8)
            self.blocks = nn.ModuleList(Block(32) for _ in range(3))

        def forward(self, x):
            h = self.inp(x)
            for b in self.blocks:
                h = b(h)
            return self.out(h)

    def mse(pred, target):
        return torch.nn.functional.mse_loss(pred, target)

    out = {}
    torch.manual_seed(0)
    net = Net()
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)) for _ in range(3)]
    pm = gfx_compile(copy.deepcopy(net), gfx.Cluster.local_cpu(world), data[0], loss_fn=mse, global_batch_size=8,
                     search={"pp": (1,)}, dump_dir=os.path.join(tmp, "dump_pp1"))
    torch.distributed.barrier()
    out["dump_pp1"] = _dumped(os.path.join(tmp, "dump_pp1"))
    out["pp1_layers"] = [lp.name for lp in pm.plan.layers]
    ref = copy.deepcopy(net)
    opt, ref_opt = torch.optim.AdamW(pm.parameters(), lr=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-3)
    m = pm.plan.num_microbatches
    errs = []
    for x, y in data:
        got = pm.train_step((x, y), opt)
        want = 0.0
        for i in range(m):
            loss = mse(ref(x.chunk(m)[i]), y.chunk(m)[i])
            (loss / m).backward()
            want += loss.item() / m
        ref_opt.step()
        ref_opt.zero_grad()
        errs.append(abs(got - want))
    out["loss_fn_errs"] = errs
    # what trained is what was dumped: each executor ran its layer's graphs of the program, and
    # the files hold those graphs' code (after the steps: nothing rewrote them)
    from pathlib import Path

    from galvatron_fx.passes.dump_program import readable

    dump = Path(tmp) / "dump_pp1"
    stems = {lay["name"]: lay["graphs"] for lay in json.loads((dump / "summary.json").read_text())["layers"]}
    layers = pm.program.layers
    # (layers of one kind and layout share graphs: the first of them wrote their files)
    writer = {id(lay.graphs): next(w for w in layers if w.graphs is lay.graphs) for lay in layers}
    out["dump_is_run"] = [
        (lay.name, str(lay.strategy.recompute), ex.lowered is not None and ex.lowered.program is lay.graphs
         and ex.lowered.graphs is not None,
         readable(writer[id(lay.graphs)]) == {k: (dump / f"{stems[lay.name]}.{k}.txt").read_text() for k in ("fw", "bw")})
        for ex, lay in zip(pm.executors, layers)]
    # a pipelined plan from the planner
    model, mg, inputs = cache.get(("gpt-tiny", 4)) or build("gpt-tiny", 4)
    pm = gfx_compile(copy.deepcopy(model), gfx.Cluster.local_cpu(world), inputs, global_batch_size=8,
                     search={"pp": (2,)}, dump_dir=os.path.join(tmp, "dump_pp2"))
    torch.distributed.barrier()
    out["dump_pp2"] = {s: _dumped(os.path.join(tmp, "dump_pp2", f"stage{s}")) for s in range(pm.plan.pp)}
    out["pp2_stage_layers"] = {s: [lp.name for lp in pm.plan.layers if lp.stage == s] for s in range(pm.plan.pp)}
    out["pp_type"] = type(pm).__name__
    out["pp"] = pm.plan.pp
    batch = _batches(8, 1)[0]
    got = pm.train_step(batch, torch.optim.AdamW(pm.parameters(), lr=1e-3))
    m = pm.plan.num_microbatches
    want = sum(model(*(x.chunk(m)[i] for x in batch)).item() for i in range(m)) / m
    out["pp_loss_err"] = abs(got - want)
    return out


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    cache: dict = {}
    jobs = [("reshard", lambda: _reshard_case(world)), ("buckets", lambda: _buckets_case(world))] if world <= 4 else []
    jobs += [(key, lambda key=key: _case(key, world, cache)) for key in CASES[world]]
    if world == 2:
        jobs.append(("errors", lambda: _errors_case(world, cache)))
        jobs.append(("compile_more", lambda: _compile_more_case(world, cache, tmp)))
    run_jobs(rank, tmp, jobs, only_env="GFX_PM_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("pm2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("pm4"))


def _check_numerics(results: dict, key: str) -> dict:
    r = assert_ok(results, key)
    for rank, by_case in results.items():
        c = by_case[key]
        assert max(c["loss_errs"]) <= TOL, f"rank {rank}: losses differ by {c['loss_errs']}"
        assert c["grad_err"] <= TOL, f"rank {rank}: gradients differ by {c['grad_err']}"
        # (a batch of one leaves more near-zero gradients for Adam to normalise: lr-sized noise)
        tol = 10 * PARAM_TOL if key.endswith("batch1") else PARAM_TOL
        assert c["param_err"] <= tol, f"rank {rank}: parameters after {STEPS} steps differ by {c['param_err']}"
        assert c["grads_compared"] == c["num_ref_params"], "some parameters got no gradient"
        assert c["missing_keys"] == [], f"state_dict lacks {c['missing_keys']}"
    assert r["param_moved"] > 10 * PARAM_TOL, "the optimizer did not move the parameters: the test cannot fail"
    return r


@pytest.mark.parametrize("world", [2, 4])
def test_reshard_between_meshes(world, world2, world4):
    r = assert_ok({2: world2, 4: world4}[world], "reshard")
    assert r["num"] > 0 and r["max_err"] == 0.0


def test_bucketed_dp_sums_equal_per_tensor_all_reduce(world2):
    assert_ok(world2, "buckets")
    for rank in world2:
        r = world2[rank]["buckets"]
        assert r["coalesced_err"] == 0.0 and r["coalesced_calls"] == 2, r  # [0..3] and [4]
        for armed in (False, True):
            assert r[f"armed{armed}_err"] <= 1e-6, r
            assert r[f"armed{armed}_none_kept"], "a parameter without gradient got one"
        assert r["armedFalse_in_backward"] == 0, "unarmed buckets must wait for finish()"
        assert r["armedTrue_in_backward"] >= 2, "armed buckets must launch during backward"
        for armed in (False, True):
            assert r[f"tied_armed{armed}_err"] == 0.0 and r[f"tied_armed{armed}_distinct"], r
            assert r[f"tied_armed{armed}_calls"] == 2, r
        assert r["tied_armedTrue_in_backward"] == 2, "the tied entry's bucket launches once both copies are ready"
        assert r["extraTrue_calls"] == 2 and r["extraTrue_err"] == 0.0 and r["extraTrue_grads_ok"], r
        assert r["extraFalse_calls"] == 1 and r["extraFalse_err"] == 0.0 and r["extraFalse_grads_ok"], r
        assert r["steps_err"] == 0.0 and r["held_err"] == 0.0, r


@pytest.mark.parametrize("key", list(CASES[2]))
def test_world2_trains_like_one_process(world2, key):
    _check_numerics(world2, key)


@pytest.mark.parametrize("key", list(CASES[4]))
def test_world4_trains_like_one_process(world4, key):
    _check_numerics(world4, key)


@pytest.fixture(scope="module")
def world8(tmp_path_factory) -> dict:
    return spawn(_worker, 8, tmp_path_factory.mktemp("pm8"))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CASES[8]))
def test_world8_trains_like_one_process(world8, key):
    _check_numerics(world8, key)


def test_tied_weight_stored_alike_is_one_parameter(world2, world4):
    """Embedding and head that store the tied weight alike share one parameter (as the plain
    model does): one FSDP unit under ZeRO-3, one bucket entry and optimizer tensor under DDP and
    TP; a mixed plan keeps a copy per mesh."""
    for key in ("dp2-zero3-m2", "dp2", "tp2"):
        r = assert_ok(world2, key)
        assert r["num_params"] == r["num_model_params"], (key, r)
    r = assert_ok(world4, "mixed")
    assert r["num_params"] == r["num_model_params"] + 1, r  # embedding on (4, 1), head on (1, 4)


def test_executors_follow_the_saved_plan(world4):
    r = assert_ok(world4, "mixed")
    assert "re-solved" not in r["option_source"]
    assert "plan" in r["option_source"]


@pytest.mark.parametrize("key", list(CASES[2]))
def test_the_runtime_runs_the_lowered_program(world2, key):
    """Every executor runs its layer's program (made by the passes before the first step),
    through training, without tracing its own; a layer under selective recomputation too (its
    backward graph recomputes, tagged; no checkpoint around it)."""
    r = assert_ok(world2, key)
    assert all(r["runs_program"]), (key, r["runs_program"])
    assert len(r["runs_program"]) == len(r["lowered_layers"]), key
    assert all(r["selective_bare"]) and (bool(r["selective_bare"]) == ("selective" in key)), r["selective_bare"]


def test_compile_dumps_the_program_it_runs(world2):
    r = assert_ok(world2, "compile_more")
    assert r["dump_is_run"] and all(ran for _name, _mode, ran, _same in r["dump_is_run"]), r["dump_is_run"]
    assert all(same for *_, same in r["dump_is_run"]), r["dump_is_run"]  # the files hold the graphs that ran
    d = r["dump_pp1"]
    assert d["layers"] == r["pp1_layers"] and "summary.json" in d["files"] and "passes" in d["files"]
    assert all(f"{g}.fw.txt" in d["files"] and f"{g}.bw.txt" in d["files"] for g in d["graphs"]), d
    assert "stage0.txt" in d["files"]
    for s, stage in r["dump_pp2"].items():  # each stage's first rank writes its stage
        assert stage.get("layers") == r["pp2_stage_layers"][s], (s, stage)
        assert any(f.startswith("chunk") for f in stage["files"]), stage  # its chunks' passes


def test_compile_checks_world_size_and_plan_identity(world2):
    for rank, by_case in world2.items():
        r = by_case["errors"]
        assert "error" not in r, r.get("trace")
        assert r["world"].startswith("PlanError") and "world size 4" in r["world"], (rank, r["world"])
        assert r["hash"].startswith("PlanError") and "different plans" in r["hash"], (rank, r["hash"])
        assert abs(r["compiled_loss"] - r["ref_loss"]) <= TOL
        assert r["planned_loss_err"] <= TOL, r["planned"]


def test_loss_token_count_needs_no_collective(world2):
    """The dp mean loss counts its targets over the whole labels every rank holds
    (fold_input_reductions): no all-reduce in its forward or backward."""
    r = assert_ok(world2, TIMED)
    assert r["fw_all_reduces"] == 0 and r["bw_all_reduces"] == 0 and r["hoisted"] == 0, r
    assert r["whole_inputs"] == [1], r  # (logits, labels): the labels whole
    assert r["in_flight_after_forwards"] <= 64, r
    assert r["in_flight_after_step"] == 0 and r["step_loss_finite"], r


def test_step_time_is_recorded(world2):
    r = assert_ok(world2, TIMED)
    assert r["pm_step_s"] > 0 and r["ref_step_s"] > 0
    print(f"train_step, world 2 dp2 gpt-tiny: ParallelModule {r['pm_step_s'] * 1e3:.1f} ms, "
          f"plain model {r['ref_step_s'] * 1e3:.1f} ms")


def test_compile_takes_a_loss_fn_and_runs_pipelined_plans(world2):
    r = assert_ok(world2, "compile_more")
    assert max(r["loss_fn_errs"]) <= TOL, r["loss_fn_errs"]
    assert r["pp_type"] == "PipelineModule" and r["pp"] == 2
    assert r["pp_loss_err"] <= TOL, r


def test_compile_without_process_group_says_how_to_launch():
    import torch.distributed as dist

    import galvatron_fx as gfx
    from galvatron_fx.api import compile as gfx_compile

    assert not dist.is_initialized() or dist.get_backend() == "fake"  # the ILP's stand-in group
    model, _, inputs = build("gpt-tiny", 2)
    with pytest.raises(gfx.PlanError, match="run under torchrun"):
        gfx_compile(model, gfx.Cluster.local_cpu(2), inputs, global_batch_size=2)
