"""``galvatron-fx profile`` (under torchrun): measure collectives, p2p links, matmul/attention
throughput and overlap, fit the cluster model (:func:`galvatron_fx.profiler.hardware.profile_hardware`)
and print a summary on rank 0."""

from __future__ import annotations

import argparse
import os

from galvatron_fx.cost_models.communication import bandwidth_factor
from galvatron_fx.profiler.hardware import profile_hardware
from galvatron_fx.profiler.hardware_profile import cache_path


def run_cli(args: argparse.Namespace) -> int:
    """Run ``galvatron-fx profile`` (under torchrun) and print a summary on rank 0."""
    import torch.distributed as dist

    prof = profile_hardware(
        sizes_bytes=args.sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        group_sizes=args.group_sizes,
        compute=not args.no_compute,
        p2p=not args.no_p2p,
        cache_dir=args.cache_dir,
        out=args.out,
        use_cache=args.reuse_cache,
    )
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    if rank == 0:
        c = prof.cluster
        print(f"fingerprint {prof.fingerprint}  world {c.world_size}  backend {c.backend}")
        print(f"{'tier':<11} {'collective':<15} {'n':>3} {'alpha_us':>9} {'busbw_GB/s':>11}")
        for t in (c.intra_node, c.inter_node):
            for coll, per in sorted(t.fits.items()):
                for n, f in sorted(per.items()):
                    bw = bandwidth_factor(coll, n) / f.beta_s_per_byte / 1e9 if f.beta_s_per_byte else float("inf")
                    print(f"{t.name:<11} {coll:<15} {n:>3} {f.alpha_s * 1e6:>9.1f} {bw:>11.3f}")
        for r in prof.compute:
            if "flops_s" in r:
                print(f"{r['op']:<9} {r['size']:>5} {r['dtype']:<9} {r['flops_s'] / 1e9:8.1f} GFLOP/s")
            elif r["op"] == "device_memory":
                print(f"CUDA context {r['context_bytes'] / 2**20:.0f} MiB, one communicator's buffers "
                      f"{r['comm_buffer_bytes'] / 2**20:.0f} MiB")
            else:
                print(f"{r['op']:<13} {r['time_s'] * 1e6:8.1f} µs" + (" per direction" if r["op"] == "layer_call" else ""))
        print(f"overlap slowdown {c.overlap_slowdown:.2f}; unsupported: {prof.unsupported or 'none'}")
        for msg in prof.slow_links:
            print(msg)
        print(f"saved {cache_path(prof.fingerprint, args.cache_dir)}" + (f" and {args.out}" if args.out else ""))
    return 0
