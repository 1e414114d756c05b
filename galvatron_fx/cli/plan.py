"""``galvatron-fx plan``: search a plan for a model on a cluster and explain it.

    galvatron-fx plan llama2-7b --cluster dgx-a100-80g --nodes 1 --batch 64 --seq 4096 \\
        [--memory 40] [--precision bf16] [--tp 2] [--out plan.json] [--layer blocks.3]
        [--reduce-dtypes float32,bfloat16] [--powersgd-ranks 0,4] [--offload auto|never|all] [--host-memory 512]
    galvatron-fx plan --hf-config path/to/config.json --batch 64 --seq 4096
    galvatron-fx plan --model mypkg.models:build --batch 32
    galvatron-fx plan gpt2-small --cluster rtx4090-pcie --batch auto      # or --batch 16:256, --tokens-per-step 131072

Exits 0 when a plan fits; otherwise prints the smallest memory that would fit and what to relax,
and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time


def run_cli(args: argparse.Namespace) -> int:
    from galvatron_fx.cli.commands import default_precision, offload_space
    from galvatron_fx.cluster import Cluster
    from galvatron_fx.frontend import model_source
    from galvatron_fx.search.auto_batch import AutoBatch
    from galvatron_fx.search.candidates import SearchSpace
    from galvatron_fx.search.planner import plan

    source = model_source.resolve(zoo_name=args.zoo_name, hf_config=args.hf_config, factory=args.factory)
    cluster = Cluster.from_spec(args.cluster, args.nodes)
    batch = AutoBatch.parse(args.batch, args.tokens_per_step) or 8 * cluster.world_size
    t0 = time.perf_counter()
    # batch 2: a batch that splits over two data-parallel ranks, so that a loss's own data-parallel
    # collectives can be lowered and priced (search/lowered_prices.py); the plan does not depend on it
    mg = model_source.capture(source, batch_size=2, seq_len=args.seq, device="meta")
    print(f"captured {source.name}: {len(mg.layers)} layers, {len(mg.kinds())} kinds in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    space = SearchSpace(tp=args.tp, max_tp=args.max_tp, pp=args.pp, max_pp=args.max_pp, lowered_prices=not args.ilp_prices,
                        reduce_dtypes=args.reduce_dtypes or ("float32",), powersgd_ranks=args.powersgd_ranks or (0,),
                        offload=offload_space(args.offload),
                        host_memory_budget=int(args.host_memory * 2**30) if args.host_memory is not None else None)
    budget = int(args.memory * 2**30) if args.memory is not None else None
    precision = args.precision
    if precision is None:
        precision, line = default_precision(cluster)
        print(line, file=sys.stderr)
    p = plan(mg, cluster, global_batch_size=batch, memory_budget=budget, search=space, precision=precision,
             name=source.name, progress=sys.stderr.isatty(), baselines=not args.no_baselines)
    print(p.explain())
    if args.layer:
        print()
        print(p.explain(args.layer))
    if args.out:
        p.save(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def explain_cli(args) -> int:
    """``galvatron-fx explain PLAN.json [--layer L [--alternative A]]``: the plan's report (no
    model, no search: the plan file alone)."""
    from galvatron_fx.errors import ConfigError
    from galvatron_fx.ir.plan import ParallelPlan

    plan = ParallelPlan.load(args.plan)
    if args.alternative is not None and args.layer is None:
        raise ConfigError("--alternative needs --layer: galvatron-fx explain PLAN.json --layer blocks.3 "
                          "--alternative tp4.zero3")
    if args.layer is not None and args.layer not in {lp.name for lp in plan.layers}:
        names = [lp.name for lp in plan.layers]
        raise ConfigError(f"--layer {args.layer!r}: the plan has no such layer; its layers are "
                          f"{', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
    print(plan.explain())
    if args.layer is not None:
        print()
        print(plan.explain(args.layer, args.alternative))
    return 0
