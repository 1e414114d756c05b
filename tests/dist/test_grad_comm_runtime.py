"""Gradient communication on real gloo ranks: 16-bit sums and PowerSGD against one process.

One spawn at world 2 and one at world 4 (dp2 × tp2 meshes). bf16 (and, on the zoo model, fp16) sums
(``GradComm(reduce_dtype="bfloat16")``) on plans whose every layer reduces its gradients over dp —
DDP buckets and FSDP2 ZeRO-2/3 units — of a zoo model (gpt-tiny) and a Hugging Face model built from
a config (Llama): every step's loss and the parameters after ``STEPS`` AdamW steps within bf16's
tolerance of the single-process model, the gradients rounded (not equal: the sums really ran in
bf16) but within bf16's relative precision, and stored in fp32.
PowerSGD (rank 2 on gpt-tiny's 128-wide matrices, DDP, AdamW on fresh batches every step) over
``PSGD_STEPS`` steps: the loss curve within ``PSGD_GAP`` of uncompressed sums; with
``powersgd_start_step`` the first steps are the plain ones, bit for bit. Error feedback is
checked on the compressor itself, where it shows plainly: on fixed gradients the running sum of
the compressed sums converges to the true one only with it (without it the same residual is
dropped every step), and a sum of rank ``≤ r`` comes through exact in one step. (On this
noisy-gradient training both curves stay within the gap: the loss does not tell them apart.)
"""

from __future__ import annotations

import hf_tiny
import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn
from test_parallel_module import _batches, build, make_plan

STEPS = 10
BF16_LOSS_TOL = 5e-4  # largest |loss − one process's| over the steps (measured 5e-5; fp32 sums 5e-7)
BF16_PARAM_TOL = 5e-3  # parameters after STEPS AdamW steps at lr 1e-3 (Adam turns a rounded
#                        near-zero gradient into an update of up to lr: ≤ STEPS × lr = 1e-2)
BF16_GRAD_RTOL = 2**-7  # the first step's summed gradient, relative to its largest element
PSGD_STEPS = 50
PSGD_RANK = 2
PSGD_GAP = 0.1  # largest |loss − uncompressed loss| over the 50 steps (loss falls 6.2 → 4.2)
PSGD_FINAL_GAP = 0.02  # |final loss − uncompressed final loss|
K = 100  # fixed-gradient sums
WARMUP = 10  # steps of plain sums before PowerSGD starts (the plan's powersgd_start_step)
# dp2 on every layer: DDP embedding and blocks, ZeRO-3 and ZeRO-2 blocks, DDP head and loss
MIXED = [(2, 1, "none", "none", "ddp"), (2, 1, "none", "none", "ddp"), (2, 1, "none", "none", "zero3"),
         (2, 1, "none", "full", "zero2"), (2, 1, "none", "none", "ddp"), (2, 1, "none", "none", "ddp"),
         (2, 1, "none", "none", "ddp")]


def _with(plan, **grad_comm):
    import dataclasses

    from galvatron_fx.ir.grad_comm import GradComm

    return dataclasses.replace(plan, grad_comm=GradComm(**grad_comm))


def _full_grads(pm) -> dict:
    out = {}
    for ex in pm.executors:
        for key, fqn in ex.fqn_of_key.items():
            g = ex.full_grad(key)
            if g is not None and fqn not in out:
                out[fqn] = g
    return out


def _bf16_zoo() -> dict:
    """gpt-tiny, the MIXED plan, fp32 and bf16 sums against one process."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs = 8
    model, mg, _ = build("gpt-tiny", gbs)
    plan = make_plan(mg, 2, MIXED, gbs=gbs, m=1, name="gpt-tiny-mixed")
    batches = _batches(gbs, STEPS)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    want, ref_grads = [], None
    for i, (x, y) in enumerate(batches):
        loss = ref(x, y)
        loss.backward()
        if i == 0:
            ref_grads = {k: p.grad.clone() for k, p in ref.named_parameters()}
        want.append(loss.item())
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    ref_sd = ref.state_dict()
    res: dict = {"ref_loss": want}
    for tag, gc in (("fp32", {}), ("bf16", {"reduce_dtype": "bfloat16"}), ("fp16", {"reduce_dtype": "float16"})):
        pm = ParallelModule(copy.deepcopy(model), mg, _with(plan, **gc))
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        x, y = batches[0]
        first = pm(x, y)
        first.backward()  # (the gradient sync runs when backward ends, as under DDP)
        grads = _full_grads(pm)
        scale = max(g.abs().max().item() for g in ref_grads.values())
        res[f"{tag}_grad_err"] = max((grads[k] - g).abs().max().item() for k, g in ref_grads.items()) / scale
        res[f"{tag}_grad_dtypes"] = sorted({str(p.grad.dtype) for p in pm.parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
        got = [first.item()] + [pm.train_step(b, opt) for b in batches[1:]]
        res[f"{tag}_loss_err"] = max(abs(a - b) for a, b in zip(got, want))
        sd = pm.state_dict()
        res[f"{tag}_param_err"] = max((sd[k] - v).abs().max().item() for k, v in ref_sd.items())
        res[f"{tag}_fsdp_reduce"] = sorted({str(ex._get_fsdp_state()._mp_policy.reduce_dtype) for ex in pm.executors
                                           if ex.fsdp})
        res[f"{tag}_bucket_dtypes"] = sorted(str(b.reduce_dtype) for b in pm._bucketers.values())
    return res


def _bf16_hf() -> dict:
    """A Hugging Face Llama from a config: DDP and ZeRO-3 layers, bf16 sums against one process."""
    import copy

    import torch

    import galvatron_fx as gfx
    from galvatron_fx.runtime.parallel_module import ParallelModule

    model, batch = hf_tiny.build("llama")
    mg = gfx.capture(model, (), example_kwargs={k: v[:4] for k, v in batch.items()})
    assert mg.batch_scaling is not None  # (the capture's probe: masks split on dp where read)
    spec = [(2, 1, "none", "none", "zero3" if i % 2 else "ddp") for i in range(len(mg.layers))]
    plan = _with(make_plan(mg, 2, spec, gbs=4, m=1, name="llama-bf16-sums"), reduce_dtype="bfloat16")
    pm = ParallelModule(copy.deepcopy(model), mg, plan)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    errs, losses = [], []
    for i in range(STEPS):
        b = hf_tiny.batch("llama", 4, seed=10 + i % 2)  # two batches, again and again: the loss falls
        got = pm.train_step(b, opt)
        loss = ref(**b).loss
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        errs.append(abs(got - loss.item()))
        losses.append(loss.item())
    sd, ref_sd = pm.state_dict(), ref.state_dict()
    return {"loss_err": max(errs), "ref_loss": losses, "layers": [lp.strategy.dp_type for lp in plan.layers],
            "param_err": max((sd[k] - v).abs().max().item() for k, v in ref_sd.items() if k in sd)}


def _powersgd_curves() -> dict:
    """gpt-tiny, DDP on every layer: uncompressed, PowerSGD, PowerSGD without error feedback."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs = 8
    model, mg, _ = build("gpt-tiny", gbs)
    plan = make_plan(mg, 2, (2, 1, "none", "none", "ddp"), gbs=gbs, m=1, name="gpt-tiny-dp2")
    batches = _batches(gbs, PSGD_STEPS)
    res: dict = {}
    psgd = {"powersgd_rank": PSGD_RANK, "powersgd_start_step": 0}
    for tag, gc, feedback in (("plain", {}, True), ("psgd", psgd, True), ("no_feedback", psgd, False),
                              ("warmup", psgd | {"powersgd_start_step": WARMUP}, True)):
        pm = ParallelModule(copy.deepcopy(model), mg, _with(plan, **gc))
        for bucketer in pm._bucketers.values():
            if bucketer.powersgd is not None:
                bucketer.powersgd.error_feedback = feedback
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        res[tag] = [pm.train_step(b, opt) for b in batches]
        res[f"{tag}_state_bytes"] = sum(b.powersgd.state_bytes() for b in pm._bucketers.values()
                                        if b.powersgd is not None)
    res["ddp_matrix_bytes"] = sum(p.numel() * 4 for p in pm.parameters() if p.ndim == 2)
    return res


def _feedback_on_fixed_grads() -> dict:
    """The compressor alone: each rank's fixed gradients, summed ``K`` times; the running sum of
    what PowerSGD returns against ``K`` times the true sum."""
    import torch
    import torch.distributed as dist

    from galvatron_fx.runtime.powersgd import PowerSGD

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)
    shapes = [(48, 40), (64, 16), (40,)]
    grads = [torch.randn(s, generator=g) for s in shapes]
    true = [t.clone() for t in grads]
    for t in true:
        dist.all_reduce(t)
    out = {}
    # a sum of rank <= 2 (each rank's gradient of rank 1) comes through exact in one step
    u = torch.randn(48, 1, generator=torch.Generator().manual_seed(7 + rank))
    v = torch.randn(1, 40, generator=torch.Generator().manual_seed(17 + rank))
    low = u @ v
    low_sum = low.clone()
    dist.all_reduce(low_sum)
    got = low.clone()
    ps = PowerSGD(2, None)
    ps.finish(ps.start([0], [got]))
    out["low_rank_err"] = ((got - low_sum).norm() / low_sum.norm()).item()
    for tag, feedback in (("feedback", True), ("dropped", False)):
        ps = PowerSGD(2, None, error_feedback=feedback)
        running = [torch.zeros_like(t) for t in grads]
        rel = []
        for k in range(1, K + 1):
            work = [t.clone() for t in grads]
            ps.finish(ps.start(list(range(len(work))), work))
            for r, w in zip(running, work):
                r += w
            num = sum((r - k * t).norm() ** 2 for r, t in zip(running, true)) ** 0.5
            den = sum((k * t).norm() ** 2 for t in true) ** 0.5
            rel.append((num / den).item())
        out[tag] = rel
        out[f"{tag}_vector_err"] = ((running[2] - K * true[2]).norm() / (K * true[2]).norm()).item()
    return out


def _compiled() -> dict:
    """``compile`` with bf16 sums asked for: searched on rank 0, the choice travels in the plan."""
    import copy

    import torch

    import galvatron_fx as gfx
    from galvatron_fx import zoo

    model, batch = zoo.build("gpt-tiny", batch_size=8, seq_len=16, device="cpu", seed=0)
    pm = gfx.compile(copy.deepcopy(model), gfx.Cluster.local_cpu(2), batch, global_batch_size=8,
                     search={"tp": (1,), "pp": (1,), "reduce_dtypes": ("bfloat16",)})
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    losses = [pm.train_step(batch, opt) for _ in range(5)]
    return {"grad_comm": pm.plan.grad_comm.to_dict(), "losses": losses, "dp": [lp.dp for lp in pm.plan.layers],
            "bucket_dtypes": sorted(str(b.reduce_dtype) for b in pm._bucketers.values()),
            "explain": pm.plan.explain().splitlines()[0]}


def _world4() -> dict:
    """dp2 × tp2 meshes: tensor-parallel shards summed over dp in bf16 (DDP and ZeRO-3 layers)
    against one process; PowerSGD on the shards (each dp group compresses its own) against
    uncompressed sums."""
    import copy

    import torch

    from galvatron_fx.runtime.parallel_module import ParallelModule

    gbs = 8
    model, mg, _ = build("gpt-tiny", gbs)
    spec = [(2, 2, "none", "none", "zero3" if i % 2 else "ddp") for i in range(len(mg.layers))]
    plan = make_plan(mg, 4, spec, gbs=gbs, m=1, name="gpt-tiny-dp2tp2")
    batches = _batches(gbs, STEPS)
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    want = []
    for x, y in batches:
        loss = ref(x, y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append(loss.item())
    pm = ParallelModule(copy.deepcopy(model), mg, _with(plan, reduce_dtype="bfloat16"))
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    got = [pm.train_step(b, opt) for b in batches]
    sd, ref_sd = pm.state_dict(), ref.state_dict()
    res = {"bf16_loss_err": max(abs(a - b) for a, b in zip(got, want)), "ref_loss": want,
           "bf16_param_err": max((sd[k] - v).abs().max().item() for k, v in ref_sd.items())}
    ddp = make_plan(mg, 4, (2, 2, "none", "none", "ddp"), gbs=gbs, m=1, name="gpt-tiny-dp2tp2-ddp")
    for tag, gc in (("plain", {}), ("psgd", {"powersgd_rank": PSGD_RANK, "powersgd_start_step": 0})):
        pm = ParallelModule(copy.deepcopy(model), mg, _with(ddp, **gc))
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
        res[tag] = [pm.train_step(b, opt) for b in batches]
    return res


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    init_gloo(rank, world, port)
    if world == 4:
        jobs = [("world4", _world4)]
    else:
        jobs = [("bf16-zoo", _bf16_zoo), ("bf16-hf", _bf16_hf), ("powersgd", _powersgd_curves),
                ("feedback", _feedback_on_fixed_grads), ("compile", _compiled)]
    run_jobs(rank, tmp, jobs, only_env="GFX_GRAD_COMM_ONLY")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("gradcomm2"))


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict:
    return spawn(_worker, 4, tmp_path_factory.mktemp("gradcomm4"))


def test_bf16_sums_train_like_one_process_on_a_zoo_model(world2):
    r = assert_ok(world2, "bf16-zoo")
    assert world2[1]["bf16-zoo"]["bf16_loss_err"] == r["bf16_loss_err"], "ranks disagree"
    assert r["fp32_loss_err"] < 1e-5 and r["fp32_grad_err"] < 1e-5, "fp32 sums are exact: the comparison is sound"
    assert r["bf16_bucket_dtypes"] == ["torch.bfloat16"] and r["fp32_bucket_dtypes"] == ["None"]
    assert r["bf16_fsdp_reduce"] == ["torch.bfloat16"] and r["fp32_fsdp_reduce"] == ["None"]
    assert r["bf16_grad_dtypes"] == ["torch.float32"], "gradients are kept in fp32, only the sum is rounded"
    assert 0.0 < r["bf16_grad_err"] <= BF16_GRAD_RTOL, f"bf16 gradient error {r['bf16_grad_err']:.2e}"
    assert r["bf16_loss_err"] <= BF16_LOSS_TOL, f"bf16 sums: loss off by {r['bf16_loss_err']:.2e}"
    assert r["bf16_param_err"] <= BF16_PARAM_TOL, f"bf16 sums: parameters off by {r['bf16_param_err']:.2e}"
    assert r["ref_loss"][-1] < r["ref_loss"][0] - 0.5, "the model did not train: the comparison cannot fail"
    # fp16 sums: 10 bits of mantissa, a finer rounding than bf16's 7 (its range is the risk, not here)
    assert r["fp16_bucket_dtypes"] == ["torch.float16"] and r["fp16_fsdp_reduce"] == ["torch.float16"]
    assert 0.0 < r["fp16_grad_err"] < r["bf16_grad_err"]
    assert r["fp16_loss_err"] <= BF16_LOSS_TOL and r["fp16_param_err"] <= BF16_PARAM_TOL


def test_bf16_sums_train_like_one_process_on_a_hugging_face_model(world2):
    r = assert_ok(world2, "bf16-hf")
    assert {"ddp", "zero3"} <= set(r["layers"])
    assert r["loss_err"] <= BF16_LOSS_TOL, f"bf16 sums: loss off by {r['loss_err']:.2e}"
    assert r["param_err"] <= BF16_PARAM_TOL, f"bf16 sums: parameters off by {r['param_err']:.2e}"
    assert r["ref_loss"][-1] < r["ref_loss"][0], "the model did not train"


def test_powersgd_follows_uncompressed_training_only_with_error_feedback(world2):
    r = assert_ok(world2, "powersgd")
    assert world2[1]["powersgd"]["psgd"] == r["psgd"], "ranks disagree"
    assert r["plain"][-1] < r["plain"][0] - 1.0, "the model did not train: the comparison cannot fail"
    gap = max(abs(a - b) for a, b in zip(r["psgd"], r["plain"]))
    dropped = max(abs(a - b) for a, b in zip(r["no_feedback"], r["plain"]))
    assert 0.0 < gap <= PSGD_GAP, f"PowerSGD's loss differs from uncompressed by up to {gap:.4f}"
    assert abs(r["psgd"][-1] - r["plain"][-1]) <= PSGD_FINAL_GAP
    assert dropped > 0.0 and r["no_feedback"] != r["psgd"], "error feedback changed nothing"
    # the state: an fp32 error per compressed gradient (as large as it) and its Q
    assert r["psgd_state_bytes"] > 0.5 * r["ddp_matrix_bytes"]
    # powersgd_start_step: plain sums (the same losses, bit for bit) until it, compressed after it
    assert r["warmup"][:WARMUP + 1] == r["plain"][:WARMUP + 1] and r["warmup"][WARMUP + 1:] != r["plain"][WARMUP + 1:]


def test_error_feedback_recovers_what_the_rank_drops(world2):
    r = assert_ok(world2, "feedback")
    # with feedback the running sum converges to the true one (what a step drops, a later one sends)...
    assert r["feedback"][-1] < 0.25 * r["feedback"][0], r["feedback"][::10]
    # ...without it each step loses the same residual: the relative error does not shrink
    assert r["dropped"][-1] > 0.8 * r["dropped"][0], r["dropped"][::10]
    assert r["feedback_vector_err"] < 1e-5 and r["dropped_vector_err"] < 1e-5  # vectors are summed whole
    assert r["low_rank_err"] < 1e-5, f"a rank-2 sum came through with error {r['low_rank_err']:.2e}"


def test_compile_carries_the_choice_to_every_rank(world2):
    r = assert_ok(world2, "compile")
    assert world2[1]["compile"]["grad_comm"] == r["grad_comm"] == {"reduce_dtype": "bfloat16", "powersgd_rank": 0}
    assert set(r["dp"]) == {2} and r["bucket_dtypes"] == ["torch.bfloat16"]
    assert "gradient sums bf16" in r["explain"]
    assert r["losses"][-1] < r["losses"][0], r["losses"]


def test_world4_tensor_parallel_shards_sum_in_bf16_and_compress(world4):
    r = assert_ok(world4, "world4")
    assert all(world4[k]["world4"]["bf16_loss_err"] == r["bf16_loss_err"] for k in world4), "ranks disagree"
    assert r["bf16_loss_err"] <= BF16_LOSS_TOL and r["bf16_param_err"] <= BF16_PARAM_TOL, r
    assert r["ref_loss"][-1] < r["ref_loss"][0] - 0.5, "the model did not train"
    gap = max(abs(a - b) for a, b in zip(r["psgd"], r["plain"]))
    assert 0.0 < gap <= PSGD_GAP, f"PowerSGD at dp2 × tp2 differs from uncompressed by up to {gap:.4f}"
