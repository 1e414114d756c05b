"""Hugging Face ``Trainer`` users' way in (galvatron_fx.hf.Trainer): a tiny Llama trained at world 2
by ``transformers.Trainer`` under ``DistributedDataParallel`` and by galvatron_fx's ``Trainer``
under its searched plan, with the same arguments — per-device batches from the Trainer's own
data loader, gradient accumulation over two batches, clipping, weight decay, warmup and a cosine
schedule, evaluation with a last batch of another size, saving — give the same losses, gradient
norms, evaluation loss and weights."""

from __future__ import annotations

import pytest
from harness import assert_ok, init_gloo, run_jobs, spawn

pytest.importorskip("accelerate")

STEPS = 4
TOL = 1e-5  # losses and norms, relative (fp32)
PARAM_TOL = 2e-4


class _Tokens:
    """``n`` samples of ``seq`` token ids (a causal LM's input ids and labels), fixed by seed."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(out: str, **kw):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out, use_cpu=True, max_steps=STEPS, per_device_train_batch_size=2, per_device_eval_batch_size=3,
        gradient_accumulation_steps=2, learning_rate=3e-3, weight_decay=0.1, max_grad_norm=0.5,
        lr_scheduler_type="cosine", warmup_steps=1, logging_steps=1, seed=0, report_to="none",
        dataloader_drop_last=True, disable_tqdm=True, **{"save_strategy": "no", **kw})


def _trainer_case(tmp: str) -> dict:
    import copy
    import os

    import hf_tiny
    import torch
    import transformers

    from galvatron_fx.hf import Trainer

    model, _ = hf_tiny.build("llama")
    vocab = model.config.vocab_size
    train, evaluate = _Tokens(32, 16, vocab, seed=1), _Tokens(10, 16, vocab, seed=2)
    res: dict = {}
    runs = {}
    # DDP's Trainer; galvatron_fx's under its searched plan, and under tensor parallelism (dp 1:
    # each process's own samples are still the global batch's, inputs="rank")
    saving = {"save_strategy": "steps", "save_steps": 2}  # (galvatron_fx's run checkpoints, and is resumed)
    for name, cls, kw, args in (("ddp", transformers.Trainer, {}, {}), ("gfx", Trainer, {}, saving),
                                ("gfx-tp2", Trainer, {"search": {"tp": (2,), "pp": (1,)}}, {}),
                                ("resumed", Trainer, {}, saving)):
        m = copy.deepcopy(model)
        transformers.set_seed(0)
        out = os.path.join(tmp, "gfx" if name == "resumed" else name)
        t = cls(model=m, args=_args(out, **args), train_dataset=train, eval_dataset=evaluate, **kw)
        if name == "resumed":  # from the checkpoint at step 2: the last two steps again
            t.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
            logs = [h for h in t.state.log_history if "loss" in h and "grad_norm" in h]
            res["resumed_steps"] = [h["step"] for h in logs]
            res["resumed_rel"] = max(abs(h["loss"] - runs["gfx"]["loss"][h["step"] - 1]) / runs["gfx"]["loss"][h["step"] - 1]
                                     for h in logs)
            res["resumed_param_err"] = max((m.state_dict()[k] - v).abs().max().item()
                                           for k, v in runs["gfx"]["params"].items())
            continue
        t.train()
        logs = [h for h in t.state.log_history if "loss" in h and "grad_norm" in h]
        runs[name] = {"loss": [h["loss"] for h in logs], "grad_norm": [float(h["grad_norm"]) for h in logs],
                      "lr": [h["learning_rate"] for h in logs], "eval": t.evaluate()["eval_loss"]}
        if name != "ddp":
            res[f"plan-{name}"] = t.pm.plan.explain().splitlines()[0]
        if name == "gfx":
            res["shapes"] = t.pm.shape_cache_info()
            t.save_model(os.path.join(tmp, "saved"))
            torch.distributed.barrier()  # (the main process writes it)
            saved = type(model).from_pretrained(os.path.join(tmp, "saved"))
            res["saved_err"] = max((saved.state_dict()[k] - v).abs().max().item() for k, v in m.state_dict().items()
                                   if k in saved.state_dict())
        runs[name]["params"] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        if name == "ddp":
            ref_model = m
    del ref_model
    ddp = runs["ddp"]
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)  # noqa: E731
    res["ddp_norms"] = ddp["grad_norm"]
    res["param_moved"] = max((v - model.state_dict()[k]).abs().max().item() for k, v in ddp["params"].items())
    for name in ("gfx", "gfx-tp2"):
        gfx = runs[name]
        res[name] = {
            "plan": res.pop(f"plan-{name}"), "steps": len(gfx["loss"]),
            "loss_rel": max(rel(a, b) for a, b in zip(gfx["loss"], ddp["loss"])) if len(gfx["loss"]) == len(ddp["loss"])
            else None,
            "norm_rel": max(rel(a, b) for a, b in zip(gfx["grad_norm"], ddp["grad_norm"])),
            "lr_equal": gfx["lr"] == ddp["lr"], "eval_rel": rel(gfx["eval"], ddp["eval"]),
            # the weights the galvatron_fx Trainer wrote back into its model, against DDP's
            "param_err": max((gfx["params"][k] - v).abs().max().item() for k, v in ddp["params"].items())}
    return res


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    import os

    init_gloo(rank, world, port)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world))
    run_jobs(rank, tmp, [("trainer", lambda: _trainer_case(tmp))])


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict:
    return spawn(_worker, 2, tmp_path_factory.mktemp("hf_trainer"))


def test_the_trainer_trains_as_under_ddp(world2):
    for rank, by_case in world2.items():
        c = assert_ok({0: by_case}, "trainer")
        assert min(c["ddp_norms"]) > 0.5, "a step did not clip: the test cannot see clipping"
        assert "tp2" in c["gfx-tp2"]["plan"], c["gfx-tp2"]["plan"]
        for name in ("gfx", "gfx-tp2"):
            g = c[name]
            assert g["steps"] == STEPS, (name, g)
            assert g["loss_rel"] is not None and g["loss_rel"] <= TOL, (rank, name, g)
            assert g["norm_rel"] <= TOL and g["lr_equal"], (rank, name, g)
            assert g["eval_rel"] <= TOL, (rank, name, g)
            assert g["param_err"] <= PARAM_TOL < c["param_moved"], (rank, name, g)
        assert c["saved_err"] == 0.0, c  # save_model wrote the trained weights
        # resumed from its checkpoint at step 2 (the module's shards, the optimizer, the schedule)
        assert c["resumed_steps"] == [1, 2, 3, 4] and c["resumed_rel"] <= TOL and c["resumed_param_err"] <= PARAM_TOL, c
        # the evaluation's last batch (5 samples per process: 3 + 2) ran under the same plan
        assert c["shapes"]["recaptures"] >= 1, c
