"""Hardware profiler: collectives, p2p, matmul/attention throughput, overlap slowdown, slow links.

Contract: run on every rank of a process group (``torchrun``; gloo on CPU, NCCL on GPU). If no
group is initialised, one is made from the torchrun environment (or a single-process gloo group).
Produces a ``HardwareProfile`` whose ``cluster`` carries alpha/beta fits per
(collective, group size, tier); rank 0 writes it as JSON to the cache directory under the
hardware fingerprint (and to ``out``).

Algorithm
---------
For every group size ``n`` that divides the world (>= 2) and every arrangement (contiguous
``[i*n, ..., i*n+n-1]`` and strided ``[i, i+W/n, ...]``), all ``W/n`` groups run the collective at
once (as a plan's data- or tensor-parallel groups would). After ``warmup`` calls per size, it makes
``repeats`` passes over all sizes (interleaved, so a burst of load from other processes spoils one
sample of many sizes rather than every sample of one), each after a world barrier; messages under
8 MiB are timed as the mean of up to 32 back-to-back calls. A call's
time is the fastest rank of each group (the last to arrive sees the pure duration) and the slowest
group; a row keeps the fastest pass, which is robust on shared hosts. Sizes follow the ``nbytes`` convention of
``galvatron_fx.cost_models.communication``. Point-to-point is timed as half a ping-pong for every
rank pair, in round-robin rounds of disjoint pairs. The rows are fitted, and the profile kept
and cached, by :mod:`galvatron_fx.profiler.hardware_profile`.

The device's own probes (:mod:`galvatron_fx.profiler.device_probes`): matmul/attention
throughput, memory bandwidth, the host's fixed costs (rows ``kernel_launch`` and ``layer_call``),
the compute/communication overlap and, on a GPU, the memory beside PyTorch's allocator: the CUDA
context before the first communicator, and one new communicator's buffers (row ``device_memory``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from galvatron_fx.cluster import Collective, TierName
from galvatron_fx.cluster.host import cpu_model, hostname, make_fingerprint
from galvatron_fx.cluster.limits import load_json, read_text
from galvatron_fx.errors import ConfigError
from galvatron_fx.profiler.device_probes import (
    measure_comm_buffers,
    measure_compute,
    measure_fixed_costs,
    measure_host_tier,
    measure_overlap,
    outside_allocator_bytes,
)
from galvatron_fx.profiler.hardware_profile import (
    HardwareProfile,
    NodeDevice,
    build_cluster,
    cache_path,
    current_fingerprint_fields,
    detect_slow_links,
    matmul_peaks,
    node_kinds,
    node_rate,
    profile_from_dict,
    slow_node_links,
)
from galvatron_fx.report.progress import Progress

logger = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(4 * KiB * 4**i for i in range(8))  # 4 KiB .. 64 MiB
_COMM_COLLECTIVES = (
    Collective.ALL_REDUCE,
    Collective.ALL_GATHER,
    Collective.REDUCE_SCATTER,
    Collective.ALL_TO_ALL,
)


# ---------------------------------------------------------------------------- measuring
def _human(nbytes: int) -> str:
    for unit, div in (("MiB", MiB), ("KiB", KiB)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


def _arrangements(world: int, n: int) -> dict[str, list[list[int]]]:
    contiguous = [list(range(i * n, (i + 1) * n)) for i in range(world // n)]
    strided = [list(range(i, world, world // n)) for i in range(world // n)]
    out = {"contiguous": contiguous}
    if strided != contiguous:
        out["strided"] = strided
    return out


def _round_robin(world: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint rank pairs covering every pair once (circle method)."""
    ids = list(range(world)) + ([None] if world % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ids[i], ids[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def _collective_fn(coll: Collective, nbytes: int, n: int, group, device, dist) -> tuple[Callable[[], Any], int]:
    """A closure running ``coll`` once, and the nbytes it really moves (rounded to the group)."""
    import torch

    numel = max(n * n, (nbytes // 4) // (n * n) * (n * n))
    real = numel * 4
    if coll is Collective.ALL_REDUCE:
        t = torch.ones(numel, device=device)
        return (lambda: dist.all_reduce(t, group=group)), real
    if coll is Collective.ALL_GATHER:
        out, inp = torch.empty(numel, device=device), torch.ones(numel // n, device=device)
        op = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: op(out, inp, group=group)), real
    if coll is Collective.REDUCE_SCATTER:
        out, inp = torch.empty(numel // n, device=device), torch.ones(numel, device=device)
        op = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return (lambda: op(out, inp, group=group)), real
    if coll is Collective.ALL_TO_ALL:
        # convention: nbytes is the global tensor; this rank holds nbytes / n
        inp, out = torch.ones(numel // n, device=device), torch.empty(numel // n, device=device)
        return (lambda: dist.all_to_all_single(out, inp, group=group)), real
    raise ValueError(coll)


def _collective_series(coll: Collective, sizes: Sequence[int], n: int, group, device, dist) -> list[tuple[int, Callable[[], Any]]]:
    """(real nbytes, closure) per size; closures share one buffer set sized for the largest."""
    import torch

    numels = [max(n * n, (s // 4) // (n * n) * (n * n)) for s in sizes]
    big = max(numels)
    full = torch.ones(big, device=device)
    part = torch.ones(big // n, device=device)
    part2 = torch.empty(big // n, device=device)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out: list[tuple[int, Callable[..., Any]]] = []
    fn: Callable[..., Any]  # called without arguments; the lambdas bind theirs as defaults
    for m in numels:
        f, p, p2 = full[:m], part[: m // n], part2[: m // n]
        if coll is Collective.ALL_REDUCE:
            fn = lambda f=f: dist.all_reduce(f, group=group)  # noqa: E731
        elif coll is Collective.ALL_GATHER:
            fn = lambda f=f, p=p: ag(f, p, group=group)  # noqa: E731
        elif coll is Collective.REDUCE_SCATTER:
            fn = lambda f=f, p=p: rs(p, f, group=group)  # noqa: E731
        elif coll is Collective.ALL_TO_ALL:
            # convention: nbytes is the global tensor; this rank holds nbytes / n
            fn = lambda p=p, p2=p2: dist.all_to_all_single(p2, p, group=group)  # noqa: E731
        else:
            raise ValueError(coll)
        out.append((m * 4, fn))
    return out


def _p2p_series(rank: int, other: int | None, sizes: Sequence[int], device, dist) -> list[tuple[int, Callable[[], Any]]]:
    """Ping-pong closures with ``other`` (no-ops for a rank without a partner this round)."""
    import torch

    numels = [max(1, s // 4) for s in sizes]
    buf = torch.ones(max(numels), device=device)
    out = []
    for m in numels:
        b = buf[:m]
        if other is None:
            fn = lambda: None  # noqa: E731
        elif rank < other:
            def fn(b=b):
                dist.send(b, other)
                dist.recv(b, other)
        else:
            def fn(b=b):
                dist.recv(b, other)
                dist.send(b, other)
        out.append((m * 4, fn))
    return out


def _interleaved(series, warmup: int, repeats: int, sync, barrier, bar, label: str) -> list[list[float]]:
    """Times of every closure, ``repeats`` passes over all sizes, a barrier before each call.

    Passes (rather than all repeats of one size in a row) spread a burst of interference from
    other processes over many sizes instead of spoiling one.
    """
    for _, fn in series:
        for _ in range(warmup):
            fn()
    sync()
    times: list[list[float]] = [[] for _ in series]
    # small messages: time a few back-to-back calls (the same count on every rank, from the
    # size alone) so that one scheduler hiccup is averaged out rather than measured
    inner = [min(32, max(1, 8 * MiB // max(real, 1))) for real, _ in series]
    for _ in range(repeats):
        for i, (_, fn) in enumerate(series):
            barrier()
            t0 = time.perf_counter()
            for _ in range(inner[i]):
                fn()
            sync()
            times[i].append((time.perf_counter() - t0) / inner[i])
    for real, _ in series:
        bar.step(f"{label} {_human(real)}")
    return times


def _combine(per_rank: list[dict[tuple, tuple[int, list[float]]]]) -> dict[tuple, float]:
    """One time per key: per repeat, the fastest rank of each group (the last to arrive sees the
    pure duration; the others include waiting) and the slowest group; then the fastest repeat."""
    by_key: dict[tuple, dict[int, list[list[float]]]] = {}
    for local in per_rank:
        for key, (gid, ts) in local.items():
            by_key.setdefault(key, {}).setdefault(gid, []).append(ts)
    out = {}
    for key, groups in by_key.items():
        per_rep = [
            max(min(ts[i] for ts in rank_ts) for rank_ts in groups.values())
            for i in range(min(len(ts) for rank_ts in groups.values() for ts in rank_ts))
        ]
        out[key] = min(per_rep)
    return out


def _probe(coll: Collective, group, device, dist, n: int) -> bool:
    try:
        fn, _ = _collective_fn(coll, 4 * n * n, n, group, device, dist)
        fn()
        return True
    except (RuntimeError, NotImplementedError, ValueError) as e:
        logger.info("%s not supported by this backend (%s); skipped", coll, str(e).splitlines()[0][:100])
        return False


def _ensure_group(backend: str | None):
    """Initialise a process group from the torchrun environment if none exists; returns (dist, created)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist, False
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    else:
        logger.warning("no torchrun environment: profiling one process (no collectives); use torchrun --nproc-per-node N")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist, True


def profile_hardware(
    *,
    sizes_bytes: Sequence[int] | None = None,
    repeats: int = 3,
    warmup: int = 1,
    collectives: Sequence[Collective | str] | None = None,
    group_sizes: Sequence[int] | None = None,
    p2p: bool = True,
    compute: bool = True,
    matmul_sizes: Sequence[int] = (256, 512, 1024),
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    attention_seq_lens: Sequence[int] = (256, 512),
    overlap: bool = True,
    cache_dir: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    use_cache: bool = False,
    progress: bool = True,
    backend: str | None = None,
) -> HardwareProfile:
    """Profile this machine; call on every rank. Returns the same profile on every rank.

    ``sizes_bytes`` default to 4 KiB .. 64 MiB (×4 steps). ``group_sizes`` default to every
    divisor >= 2 of the world size. With ``use_cache`` a cached profile with this fingerprint is
    returned without measuring. Rank 0 writes ``cache_dir/hardware-<fingerprint>.json`` and ``out``.
    """
    import torch

    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    sizes = sorted(set(int(s) for s in (sizes_bytes or DEFAULT_SIZES_BYTES)))
    if not sizes or sizes[0] <= 0:
        raise ConfigError(f"sizes_bytes must be positive, got {sizes_bytes}")
    dist, created = _ensure_group(backend)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        be = str(dist.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if be == "nccl" else torch.device("cpu")
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        # the CUDA context (with cuBLAS loaded) before this rank's first collective makes a communicator
        if device.type == "cuda":
            torch.ones(8, 8, device=device) @ torch.ones(8, 8, device=device)
            sync()
        context_bytes = outside_allocator_bytes(device) if device.type == "cuda" else 0

        named: list[Any] = [None] * world
        dist.all_gather_object(named, (node_name(), hostname()))
        hosts = [n for n, _ in named]  # the nodes: hosts, or torchrun's agents where one host runs several
        host_order = list(dict.fromkeys(hosts))
        node_of_rank = [host_order.index(h) for h in hosts]
        per_host = [node_of_rank.count(i) for i in range(len(host_order))]
        fields = current_fingerprint_fields(backend=be, world_size=world, num_hosts=len({h for _, h in named}))
        fp = make_fingerprint(fields)
        cpath = cache_path(fp, cache_dir)
        # rank 0 decides and shares the cached text (other hosts may not see its disk)
        cached = [_trusted_cache(cpath) if rank == 0 and use_cache and cpath.exists() else None]
        if use_cache and world > 1:
            dist.broadcast_object_list(cached, src=0)
        if cached[0] is not None:
            prof = profile_from_dict(load_json(cached[0], f"hardware profile {str(cpath)!r}"), source=str(cpath),
                                      check_fingerprint=True)
            logger.info("using cached hardware profile %s", cpath)
            if rank == 0 and out is not None:
                prof.save(out)
            return prof

        local_idx = [hosts[: r + 1].count(hosts[r]) - 1 for r in range(world)]
        rank_names = [f"{hosts[r]}:{local_idx[r]}" for r in range(world)]
        sizes_n = sorted(set(group_sizes or [n for n in range(2, world + 1) if world % n == 0]))
        for n in sizes_n:
            if n < 2 or world % n:
                raise ConfigError(f"group size {n} must be >= 2 and divide the world size {world}")
        colls = [Collective(c) for c in (collectives or _COMM_COLLECTIVES) if Collective(c) is not Collective.P2P]
        arrangements = {n: _arrangements(world, n) for n in sizes_n}
        # every rank must create every group, in the same order
        groups: dict[tuple[int, str], tuple[Any, list[int]]] = {}
        for n in sizes_n:
            for arr, parts in arrangements[n].items():
                mine: Any = None
                for ranks in parts:
                    g = dist.new_group(ranks) if n < world else dist.group.WORLD
                    if rank in ranks:
                        mine = (g, ranks)
                groups[(n, arr)] = mine
        unsupported: list[str] = []
        if sizes_n:
            g0 = groups[(sizes_n[0], "contiguous")][0]
            for c in list(colls):
                if not _probe(c, g0, device, dist, sizes_n[0]):
                    colls.remove(c)
                    unsupported.append(str(c))
        rounds = _round_robin(world) if p2p and world > 1 else []
        total = (
            sum(len(arrangements[n]) for n in sizes_n) * len(colls) * len(sizes)
            + len(rounds) * len(sizes)
            + (len(matmul_sizes) * len(dtypes) + len(attention_seq_lens) * len(dtypes) + 1 if compute else 0)
            + (1 if overlap and world > 1 else 0)
        )
        bar = Progress(total, progress and rank == 0)

        # key -> (group id, this rank's time per repeat)
        local: dict[tuple, tuple[int, list[float]]] = {}
        for n in sizes_n:
            for arr in arrangements[n]:
                g, ranks = groups[(n, arr)]
                gid = arrangements[n][arr].index(ranks)
                for c in colls:
                    series = _collective_series(c, sizes, n, g, device, dist)
                    times = _interleaved(series, warmup, repeats, sync, dist.barrier, bar, f"{c} n={n} {arr}")
                    for real, ts in zip((r for r, _ in series), times):
                        local[("coll", str(c), n, arr, real)] = (gid, ts)
        for i, rnd in enumerate(rounds):
            partner = {a: b for a, b in rnd} | {b: a for a, b in rnd}
            series = _p2p_series(rank, partner.get(rank), sizes, device, dist)
            times = _interleaved(series, warmup, repeats, sync, dist.barrier, bar, f"p2p round {i + 1}/{len(rounds)}")
            if rank in partner:
                a, b = sorted((rank, partner[rank]))
                for real, ts in zip((r for r, _ in series), times):
                    local[("p2p", a, b, real)] = (0, [t / 2 for t in ts])  # half a ping-pong

        compute_rows: list[dict[str, Any]] = []
        mem_bw = 0.0
        if compute:
            compute_rows, mem_bw = measure_compute(device, sync, matmul_sizes, dtypes, attention_seq_lens, repeats, bar)
            compute_rows += measure_fixed_costs(device, sync, repeats)
            compute_rows += measure_host_tier(device, sync, repeats)
            if device.type == "cuda":
                compute_rows.append(dict(op="device_memory", size=0, dtype="", time_s=0.0, context_bytes=context_bytes,
                                         comm_buffer_bytes=measure_comm_buffers(device, dist, sync)))
        overlap_info: dict[str, float] = {}
        if overlap and world > 1:
            overlap_info = measure_overlap(device, sync, dist, repeats)
            bar.step("overlap")

        gathered: list[Any] = [None] * world
        dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu:{cpu_model()}"[:80]
        dev_mem = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
        dist.all_gather_object(gathered, (local, compute_rows, mem_bw, overlap_info, dev_name, dev_mem))

        # ------------------------------------------------------------------ combine on every rank
        node_of = lambda r: node_of_rank[r]  # noqa: E731
        coll_t = _combine([g[0] for g in gathered])
        pair_t = {k: v for k, v in coll_t.items() if k[0] == "p2p"}
        coll_t = {k: v for k, v in coll_t.items() if k[0] == "coll"}
        dpn = max(per_host)
        rows: list[dict[str, Any]] = []
        for (_, c, n, arr, real), t in sorted(coll_t.items()):
            parts = arrangements[n][arr]
            spans = any(len({node_of(r) for r in p}) > 1 for p in parts)
            rows.append(dict(collective=c, group_size=n, arrangement=arr, tier=str(TierName.INTER_NODE if spans else TierName.INTRA_NODE), nbytes=real, time_s=t))
        pair_bw: dict[tuple[int, int], float] = {}
        for (_, a, b, real), t in sorted(pair_t.items()):
            tier = TierName.INTRA_NODE if node_of(a) == node_of(b) else TierName.INTER_NODE
            rows.append(dict(collective=str(Collective.P2P), group_size=2, arrangement=f"{a}-{b}", tier=str(tier), nbytes=real, time_s=t))
            if real == max(r for (_, x, y, r) in pair_t if (x, y) == (a, b)):
                pair_bw[(a, b)] = real / t
        slow = detect_slow_links(pair_bw, rank_names, node_of)
        for msg in slow if rank == 0 else []:
            logger.warning(msg)

        nodes = _node_devices(gathered, node_of_rank, len(host_order)) if compute else None
        for msg in _slow_node_lines(nodes, host_order) if rank == 0 and nodes else []:
            logger.warning(msg)
        compute_rows = gathered[0][1]
        mem_bw = max(g[2] for g in gathered)
        overlap_info = gathered[0][3]
        cluster = build_cluster(
            rows, compute_rows, mem_bw, overlap_info, backend=be, device=device, num_nodes=len(host_order), dpn=dpn,
            fingerprint=fp, hosts=host_order, colls_supported=colls, nodes=nodes,
        )
        # node pairs whose measured link is slow: the planner lays stages off them
        cluster = dataclasses.replace(cluster, slow_links=slow_node_links(pair_bw, node_of))
        prof = HardwareProfile(
            fingerprint=fp,
            fingerprint_fields=fields,
            cluster=cluster,
            hosts=hosts,
            measurements=rows,
            compute=compute_rows,
            overlap=overlap_info,
            p2p_bandwidth=[dict(src=a, dst=b, bytes_s=bw) for (a, b), bw in sorted(pair_bw.items())],
            slow_links=slow,
            unsupported=unsupported,
        )
        if rank == 0:
            prof.save(cpath)
            logger.info("hardware profile cached at %s", cpath)
            if out is not None:
                prof.save(out)
        dist.barrier()  # every rank returns once the files exist
        return prof
    finally:
        if created:
            dist.destroy_process_group()


def _trusted_cache(path) -> str | None:
    """The cached profile's text when it is one of this machine (read bounded, its recorded
    machine fields this machine's: :func:`~galvatron_fx.profiler.hardware_profile.profile_from_dict`),
    else None, saying why once: then the profile is measured again."""
    try:
        text = read_text(path, what="hardware profile")
        profile_from_dict(load_json(text, f"hardware profile {str(path)!r}"), source=str(path), check_fingerprint=True)
        return text
    except (ConfigError, OSError, KeyError, TypeError, ValueError) as e:
        logger.warning("not using the cached hardware profile %s (%s): measuring again", path, e)
        return None


def node_name() -> str:
    """This rank's node: its host, and under torchrun its agent (``GROUP_RANK``; several agents
    on one host are several nodes, as torchrun numbers them). ``GFX_NODE_BY_HOST=1``: the host
    alone (agents of one host are one node)."""
    group = os.environ.get("GROUP_RANK")
    return hostname() if group is None or os.environ.get("GFX_NODE_BY_HOST") else f"{hostname()}#{group}"


def _node_devices(gathered, node_of_rank: Sequence[int], num_nodes: int) -> list[NodeDevice]:
    """Per node, its ranks' device name and memory and the medians of their matmul peaks, memory
    bandwidths and fixed costs (``gathered``: each rank's ``(..., compute rows, bandwidth, ..., name, memory)``)."""
    out = []
    for i in range(num_nodes):
        mine = [g for r, g in enumerate(gathered) if node_of_rank[r] == i]
        peaks = [matmul_peaks(g[1]) for g in mine]
        dtypes = sorted({d for p in peaks for d in p})
        fixed = [{r["op"]: r["time_s"] for r in g[1] if r["op"] in ("kernel_launch", "layer_call")} for g in mine]
        out.append(NodeDevice(name=mine[0][4], memory_bytes=int(min(g[5] for g in mine)),
                              peak_flops={d: statistics.median(p[d] for p in peaks if d in p) for d in dtypes},
                              memory_bandwidth_bytes_s=statistics.median(g[2] for g in mine),
                              kernel_s=statistics.median(f.get("kernel_launch", 0.0) for f in fixed),
                              layer_s=statistics.median(f.get("layer_call", 0.0) for f in fixed)))
    return out


def _slow_node_lines(nodes: Sequence[NodeDevice], names: Sequence[str]) -> list[str]:
    """A warning per node profiled as its own kind for its speed (its device's fastest node is
    always of the device's own kind)."""
    kinds, ref = node_kinds(nodes)
    return [f"node {i} ({names[i]}) multiplies matrices at {node_rate(n) / max(node_rate(ref[n.name]), 1e-9):.2f}× "
            f"its fastest peer's rate: profiled as its own device kind {k!r}; the planner gives it less work"
            for i, (k, n) in enumerate(zip(kinds, nodes)) if k != n.name]
