"""``galvatron-fx lower``: lower a saved plan for a model and dump the program it runs.

    galvatron-fx lower llama2-7b --plan plan.json --out lowered/

Batch, sequence and precision come from the plan; the model is built on the meta device and
lowered with no process group (a stand-in one: rank 0's program). Writes the graphs, the
stages' step graphs, ``summary.json`` and every pass's dumps under ``passes/``
(:mod:`galvatron_fx.passes.dump_program`). Exits 0 when the program issues the collectives the
plan priced, 1 when it does not (the differences are printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _seq_of(plan) -> int | None:
    inputs = (plan.graph or {}).get("inputs") if isinstance(plan.graph, dict) else None
    if inputs and isinstance(inputs[0], list) and inputs[0] and isinstance(inputs[0][0], list) and inputs[0][0]:
        return int(inputs[0][0][0])
    return None


def run_cli(args: argparse.Namespace) -> int:
    from galvatron_fx.errors import ConfigError, PlanError
    from galvatron_fx.frontend import model_source
    from galvatron_fx.frontend.capture import capture
    from galvatron_fx.ir.plan import ParallelPlan, model_mismatch
    from galvatron_fx.passes.batch_probe import mark_batched
    from galvatron_fx.passes.dump_program import write_program
    from galvatron_fx.passes.lower_program import lower

    out = Path(args.out)  # checked before anything runs: a file, or a directory of other files, is not replaced
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "summary.json").exists())):
        raise ConfigError(f"--out {out}: {'a file' if not out.is_dir() else 'a directory of other files'}; give a new "
                          "directory (or an earlier lower output, which is written over)")
    source = model_source.resolve(zoo_name=args.zoo_name, hf_config=args.hf_config, factory=args.factory)
    plan = ParallelPlan.load(args.plan)
    seq = args.seq or _seq_of(plan)
    if seq is None:
        raise ConfigError(f"{args.plan} records no input shapes: pass --seq")
    micro = plan.global_batch_size // plan.num_microbatches
    t0 = time.perf_counter()

    def captured(batch: int, *, compute: bool = True, annotate: bool = True):
        model, a, kw = model_source.build(source, batch_size=batch, seq_len=seq, device="meta")
        if compute and plan.precision != "fp32":  # the runtime captures a copy in the compute dtype
            from galvatron_fx.runtime.precision import COMPUTE_DTYPES

            model = model.to(COMPUTE_DTYPES[plan.precision])
        return capture(model, a, example_kwargs=kw, name=source.name, annotate=annotate)

    mg = captured(micro)
    if mg.batch_scaling is None:  # (the capture probes at twice its batch itself; this when it could not)
        mark_batched(mg, captured(2 * micro, annotate=False))
    # the plan's hash is of the fp32 model's graph
    problem = model_mismatch(plan, mg if plan.precision == "fp32" else captured(micro, compute=False, annotate=False))
    if problem:
        raise PlanError(f"{args.plan} was made for another model or configuration than {source.name} at "
                        f"sequence {seq}: {problem}")
    t1 = time.perf_counter()
    program = lower(mg, plan, dump_dir=args.out)
    s = write_program(program, args.out)
    t2 = time.perf_counter()
    graphs = len(program.layer_graphs)
    print(f"lowered {source.name} (micro-batch {micro}, seq {seq}, {plan.precision}) for {plan.world_size} devices: "
          f"{len(program.layers)} layers, {graphs} distinct graph pairs; capture {t1 - t0:.1f} s, lowering "
          f"{t2 - t1:.1f} s", file=sys.stderr)
    for lay in s["layers"]:
        st = lay["strategy"]
        fw = ", ".join(f"{c['op']}/{c['group_size']}" for c in lay["fw_collectives"]) or "-"
        bw = ", ".join(f"{c['op']}/{c['group_size']}" for c in lay["bw_collectives"]) or "-"
        print(f"  {lay['name']:<24} tp={st['tp']} sp={st['sp']:<8} {st['dp_type']:<5} dp={lay['dp']:<3} "
              f"rc={st['recompute']:<9} fw[{fw}] bw[{bw}]{'' if lay['matches_plan'] else '  (differs)'}")
    print(f"wrote {args.out}/summary.json: matches_plan={str(s['matches_plan']).lower()}")
    for d in s["differences"]:
        print(f"  {d}")
    return 0 if s["matches_plan"] else 1
