"""``galvatron-fx report PLAN.json [--run DIR] --out R.html``: a plan (and a training run's
measurements) as one self-contained HTML page (:mod:`galvatron_fx.report.html`)."""

from __future__ import annotations

from galvatron_fx.report.html import write


def run_cli(args) -> int:
    """``galvatron-fx report PLAN.json [--run DIR] --out R.html``."""
    from galvatron_fx.ir.plan import ParallelPlan

    plan = ParallelPlan.load(args.plan)
    out = write(plan, args.out, args.run)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): plan {plan.model} on {plan.world_size} devices"
          + (f", measurements from {args.run}" if args.run is not None else ""))
    return 0
