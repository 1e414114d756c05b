"""``galvatron-fx plan``: search a plan for a zoo model on a cluster preset and explain it.

    galvatron-fx plan llama2-7b --cluster dgx-a100-80g --nodes 1 --batch 64 --seq 4096 \\
        [--memory 40] [--precision bf16] [--tp 2] [--out plan.json] [--layer blocks.3]

Exits 0 when a plan fits; otherwise prints the smallest memory that would fit and what to relax,
and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

CLI_HELP = "search a hybrid-parallel plan for a model on a cluster and explain it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a zoo model name (see `galvatron_fx.zoo.names()`)")
    p.add_argument("--cluster", default="dgx-a100-80g",
                   help="cluster preset (dgx-a100-80g, dgx-h100, h200, rtx4090-pcie) or a cluster JSON file")
    p.add_argument("--nodes", type=int, default=1, help="number of nodes of the preset (default 1)")
    p.add_argument("--batch", type=int, default=None, help="global batch size (default: 8 per device)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--memory", type=float, default=None, help="memory budget per device in GiB (default: all)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16", help="training precision")
    p.add_argument("--max-tp", type=int, default=None, help="cap the tensor-parallel degree")
    p.add_argument("--tp", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                   help="only these tensor-parallel degrees, comma-separated (e.g. 2)")
    p.add_argument("--max-pp", type=int, default=None, help="cap the pipeline degree")
    p.add_argument("--no-baselines", action="store_true", help="skip scoring the hand-written baselines")
    p.add_argument("--ilp-prices", action="store_true",
                   help="price tensor-parallel layers by the intra-layer ILP's estimate, not by their lowered "
                        "programs (faster; `galvatron-fx lower` then reports where the program differs)")
    p.add_argument("--out", type=Path, default=None, help="write the plan JSON here")
    p.add_argument("--layer", default=None, help="also explain this layer's choice against its alternatives")


def run_cli(args: argparse.Namespace) -> int:
    from galvatron_fx import zoo
    from galvatron_fx.capture import capture
    from galvatron_fx.cluster import Cluster
    from galvatron_fx.search.candidates import SearchSpace
    from galvatron_fx.search.planner import plan

    cluster = (Cluster.from_json(args.cluster) if args.cluster.endswith(".json") or Path(args.cluster).is_file()
               else Cluster.preset(args.cluster, nodes=args.nodes))
    batch = args.batch or 8 * cluster.world_size
    t0 = time.perf_counter()
    # batch 2: a batch that splits over two data-parallel ranks, so that a loss's own data-parallel
    # collectives can be lowered and priced (search/lowered_prices.py); the plan does not depend on it
    model, inputs = zoo.build(args.model, batch_size=2, seq_len=args.seq, device="meta")
    mg = capture(model, inputs, name=args.model)
    print(f"captured {args.model}: {len(mg.layers)} layers, {len(mg.kinds())} kinds in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    space = SearchSpace(tp=args.tp, max_tp=args.max_tp, max_pp=args.max_pp, lowered_prices=not args.ilp_prices)
    budget = int(args.memory * 2**30) if args.memory is not None else None
    p = plan(mg, cluster, global_batch_size=batch, memory_budget=budget, search=space, precision=args.precision,
             name=args.model, progress=sys.stderr.isatty(), baselines=not args.no_baselines)
    print(p.explain())
    if args.layer:
        print()
        print(p.explain(args.layer))
    if args.out:
        p.save(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
