"""``galvatron-fx inspect``: capture a model and show its layers, kinds and costs.

    galvatron-fx inspect gpt2-small --batch 8 --seq 1024 --json out.json --dot out.dot --node-table
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run_cli(args: argparse.Namespace) -> int:
    from galvatron_fx.frontend import model_source

    source = model_source.resolve(zoo_name=args.zoo_name, hf_config=args.hf_config, factory=args.factory)
    t0 = time.perf_counter()
    mg = model_source.capture(source, batch_size=args.batch or 1, seq_len=args.seq, device=args.device)
    print(mg.summary(nodes=args.node_table))
    print(f"(captured and annotated in {time.perf_counter() - t0:.2f} s)")
    if args.json:
        args.json.write_text(json.dumps(mg.to_json_dict(nodes=args.node_table), indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.dot:
        args.dot.write_text(mg.to_dot())
        print(f"wrote {args.dot}", file=sys.stderr)
    return 0
