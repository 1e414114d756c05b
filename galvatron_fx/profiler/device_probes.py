"""The hardware profiler's probes of one device: matmul/attention throughput and memory
bandwidth, the host's fixed costs per kernel and per layer call, a CUDA device's memory beside
PyTorch's allocator (context, a communicator's buffers), and the compute/communication overlap
slowdown.

Contract: each probe runs on every rank of the profiling group (those that communicate are
collective), takes the device, a ``sync()`` that waits for it, and repeats; it returns the rows
(or figures) :mod:`galvatron_fx.profiler.hardware` records. A time is the median of
``repeats`` calls after warm-up (:func:`timed`).

Algorithm of the fixed costs: a kernel launch is timed as a chain of one-element in-place adds;
a layer call as a one-weight ``Linear`` run forward and backward through autograd, less its
kernels' launches, halved per direction.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

MiB = 2**20

__all__ = ["measure_comm_buffers", "measure_compute", "measure_fixed_costs", "measure_overlap",
           "outside_allocator_bytes", "timed"]


def timed(fn: Callable[..., Any], warmup: int, repeats: int, sync: Callable[[], None]) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)



def measure_compute(device, sync, matmul_sizes, dtypes, seq_lens, repeats, bar) -> tuple[list[dict[str, Any]], float]:
    import torch
    import torch.nn.functional as F

    rows: list[dict[str, Any]] = []
    for dt_name in dtypes:
        dt = getattr(torch, dt_name)
        for m in matmul_sizes:
            a = torch.randn(m, m, device=device, dtype=dt)
            b = torch.randn(m, m, device=device, dtype=dt)
            t = timed(lambda a=a, b=b: a @ b, 1, repeats, sync)
            rows.append(dict(op="matmul", size=m, dtype=dt_name, time_s=t, flops_s=2 * m**3 / t))
            bar.step(f"matmul {m} {dt_name}")
        for seq in seq_lens:
            heads, d = 8, 64
            q, k, v = (torch.randn(1, heads, seq, d, device=device, dtype=dt) for _ in range(3))
            t = timed(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1, repeats, sync)
            flops = 4 * heads * seq * seq * d // 2  # causal: half the score matrix
            rows.append(dict(op="attention", size=seq, dtype=dt_name, time_s=t, flops_s=flops / t))
            bar.step(f"attention T={seq} {dt_name}")
    x = torch.ones(16 * MiB // 4, device=device)
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), 1, repeats, sync)
    bar.step("memory bandwidth")
    return rows, 2 * x.numel() * 4 / t


def measure_fixed_costs(device, sync, repeats: int) -> list[dict]:
    """The host's fixed costs (see the module doc): seconds per kernel launch, from a chain of
    one-element kernels, and per layer call and direction, from a one-weight layer run forward
    and backward through autograd, less its kernels' launches."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from galvatron_fx.passes.kernel_costs import is_free

    x = torch.zeros(1, device=device)
    chain = 100

    def kernels():
        for _ in range(chain):
            x.add_(1.0)

    kernel_s = timed(kernels, 1, repeats, sync) / chain
    layer = torch.nn.Linear(1, 1, device=device)
    inp = torch.ones(1, 1, device=device)

    def call():
        layer(inp).sum().backward()

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not is_free(func):
                _Count.n += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        call()
    call_s = timed(call, 1, repeats, sync)
    layer_s = max(0.0, call_s - _Count.n * kernel_s) / 2
    return [dict(op="kernel_launch", size=chain, dtype="float32", time_s=kernel_s),
            dict(op="layer_call", size=_Count.n, dtype="float32", time_s=layer_s)]

HOST_COPY_BYTES = 256 * MiB
HOST_OPTIMIZER_NUMEL = 16 * MiB // 4 * 4  # 16M fp32 parameters in 16 tensors


def measure_host_tier(device, sync, repeats: int) -> list[dict]:
    """The host tier CPU offload is priced by (``DeviceSpec.host_*``), measured on every rank at
    once so that each sees its share of the host: the host link's bandwidth (pinned copies of
    :data:`HOST_COPY_BYTES` each way; the slower direction) and the parameter updates per second
    of torch's AdamW stepping fp32 parameters in host memory. Only on GPUs: a CPU process's
    memory is host memory already."""
    import torch

    if device.type != "cuda":
        return []
    n = HOST_COPY_BYTES // 4
    host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(n, dtype=torch.float32, device=device)
    h2d = timed(lambda dev=dev: dev.copy_(host, non_blocking=True), 1, repeats, sync)
    d2h = timed(lambda dev=dev: host.copy_(dev, non_blocking=True), 1, repeats, sync)
    del dev
    params = [torch.nn.Parameter(torch.zeros(HOST_OPTIMIZER_NUMEL // 16)) for _ in range(16)]
    for q in params:
        q.grad = torch.full_like(q, 1e-3)
    opt = torch.optim.AdamW(params, lr=1e-3)
    step_s = timed(opt.step, 1, max(2, repeats // 2), lambda: None)
    return [dict(op="host_link", size=HOST_COPY_BYTES, dtype="float32", time_s=max(h2d, d2h),
                 bytes_s=HOST_COPY_BYTES / max(h2d, d2h)),
            dict(op="host_optimizer", size=HOST_OPTIMIZER_NUMEL, dtype="float32", time_s=step_s,
                 params_s=HOST_OPTIMIZER_NUMEL / step_s)]


def outside_allocator_bytes(device) -> int:
    """Bytes a CUDA device holds beside PyTorch's caching allocator (context, NCCL buffers)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return int(total - free - torch.cuda.memory_reserved(device))


def measure_comm_buffers(device, dist, sync) -> int:
    """CUDA only: the buffers one new communicator holds (a fresh group of every rank, before
    and after its first all-reduce); 0 elsewhere."""
    import torch

    if device.type != "cuda":
        return 0
    sync()
    before = outside_allocator_bytes(device)
    group = dist.new_group(list(range(dist.get_world_size())))
    t = torch.ones(1024, device=device)
    dist.all_reduce(t, group=group)
    sync()
    return max(0, outside_allocator_bytes(device) - before)


def measure_overlap(device, sync, dist, repeats: int) -> dict[str, float]:
    """Compute alone, all-reduce alone, and both at once; slowdown = both / max(alone)."""
    import torch

    buf = torch.ones(4 * MiB // 4, device=device)
    a = torch.randn(256, 256, device=device)
    mm_one = timed(lambda: a @ a, 1, repeats, sync)
    comm = timed(lambda: dist.all_reduce(buf), 1, repeats, sync)
    iters = max(1, round(comm / max(mm_one, 1e-9)))
    iters_all = [0] * dist.get_world_size()
    dist.all_gather_object(iters_all, iters)
    iters = max(iters_all)  # same work on every rank

    def compute():
        for _ in range(iters):
            a @ a

    def both():
        work = dist.all_reduce(buf, async_op=True)
        compute()
        work.wait()

    dist.barrier()
    comp = timed(compute, 1, repeats, sync)
    dist.barrier()
    comm = timed(lambda: dist.all_reduce(buf), 1, repeats, sync)
    dist.barrier()
    together = timed(both, 1, repeats, sync)
    slowdown = min(max(together / max(comp, comm), 1.0), (comp + comm) / max(comp, comm))
    return dict(compute_s=comp, comm_s=comm, together_s=together, slowdown=slowdown)
