"""Train the Hugging Face families of ``tests/dist/test_hf_families.py`` as its test does and tabulate.

Runs the test module's own spawned worker (world 2, and 4 with ``--world 2 4``): every family
under each of its strategies, the search's own plan and the Dynamo backend, each against one
process (3 AdamW steps, fp32). Prints family × case with the largest relative loss difference
over the steps and the largest parameter difference after them, and writes
``benchmarks/results/hf_families_training.json``. The test asserts the tolerances (loss 1e-5
relative, parameters 1e-4); this script reports the figures.

    python benchmarks/hf_families_training.py [--world 2 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "dist"), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
from _common import machine, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", nargs="*", type=int, default=[2])
    args = ap.parse_args()
    import test_hf_families as t
    from harness import spawn

    rows: dict[str, dict] = {}
    print(f"{'world':>5s} {'case':30s} {'loss rel':>9s} {'param err':>9s}  other")
    for world in args.world:
        results = spawn(t._worker, world, Path(tempfile.mkdtemp(prefix="gfx-hf-train-")))
        for key, r in sorted(results[0].items()):
            errors = {rank: by_case[key]["error"] for rank, by_case in results.items() if "error" in by_case[key]}
            row = {"errors": errors} if errors else {k: v for k, v in r.items() if k != "trace"}
            rows[f"world{world}/{key}"] = row
            if errors:
                print(f"{world:5d} {key:30s} {'ERROR':>9s} {'':9s}  {str(errors)[:120]}")
            elif "loss_rel" in r:
                print(f"{world:5d} {key:30s} {max(r['loss_rel']):9.2e} {r['param_err']:9.2e}")
            else:
                other = {k: v for k, v in r.items() if k != "wall_s"}
                print(f"{world:5d} {key:30s} {'':9s} {'':9s}  {str(other)[:120]}")
    write_results("hf_families_training", {"cases": rows, "steps": 3, "optimizer": "AdamW (CLIP: SGD)",
                                           "dtype": "float32", "machine": machine()})


if __name__ == "__main__":
    main()
