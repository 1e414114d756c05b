"""Datasheet figures of the GPU cluster presets (:meth:`galvatron_fx.cluster.spec.Cluster.preset`).

Contract: plain numbers only: ``DEVICES`` maps a device kind to its
:class:`~galvatron_fx.cluster.spec.DeviceSpec` fields, ``CLUSTERS`` a preset name to its device kind,
per-tier ``(latency_s, bus bandwidth bytes/s)`` and overlap slowdown; every node has 8 devices,
the backend is NCCL and TF32 matmuls are allowed. :mod:`galvatron_fx.cluster.spec` builds the
clusters. The sources of each figure follow.
"""

from __future__ import annotations

GiB = 2**30
MiB = 2**20

# Figures are dense (no sparsity) datasheet peaks. Bus bandwidths are *achievable* nccl-tests
# all-reduce bus bandwidths, not raw link rates, because the cost model's ring formula already
# accounts for the 2(n-1)/n factor and raw rates overestimate what NCCL reaches by 20-40%.
#
# Sources:
#  - NVIDIA A100 datasheet (80GB SXM): 19.5 TF fp32, 156 TF tf32, 312 TF bf16/fp16, 2,039 GB/s HBM2e;
#    NVLink 3: 600 GB/s per GPU bidirectional = 300 GB/s per direction; nccl-tests all-reduce on
#    DGX A100 reaches ~230-240 GB/s busbw -> 240e9. DGX A100 user guide: 8x 200 Gb/s HDR IB
#    (one per GPU, rail-optimised) = 25 GB/s per GPU; ~90% achievable -> 22.5e9.
#  - NVIDIA H100 datasheet (SXM5 80GB): 67 TF fp32, 494.5 TF tf32, 989 TF bf16/fp16, 3.35 TB/s;
#    NVLink 4: 900 GB/s bidirectional = 450 per direction, ~360 GB/s busbw achievable (80%).
#    DGX H100: 8x 400 Gb/s NDR = 50 GB/s per GPU, ~90% -> 45e9.
#  - NVIDIA H200 datasheet (SXM 141GB): same compute as H100 SXM, 4.8 TB/s HBM3e, NVLink 900 GB/s;
#    141 GB (nvidia-smi reports 143,771 MiB ~ 140 GiB). Inter-node assumed DGX H200's 8x NDR.
#  - RTX 4090 (Ada whitepaper): 82.6 TF fp32, 165.2 TF bf16/fp16 tensor with fp32 accumulate,
#    1,008 GB/s GDDR6X, 24 GB. No NVLink and no peer-to-peer: collectives cross PCIe 4.0 x16
#    (32 GB/s raw, ~25 GB/s achievable) through host memory. Inter-node assumed one 100 Gb/s NIC
#    per 8-GPU node (12.5 GB/s shared by 8 GPUs) -> 1.5e9 per GPU; an assumption, profile it.
# Fixed costs and memory beside the tensors (defaults until the hardware profiler measures them):
#  - kernel launch: ~2-3 µs raw CUDA launch, ~8 µs of host time per eager PyTorch CUDA op -> 5 µs
#    charged per kernel on the host; a layer call adds ~0.1-0.4 ms of host work in eager mode
#    (module call, autograd, allocator; from CUDA-graph speed-ups of eager LLM layers) -> 0.2 ms.
#    The host runs ahead of the GPU: these bind only when a layer's kernels are shorter.
#  - CUDA context with cuBLAS/cuDNN loaded: ~274-400 MiB with lazy module loading, ~636 MiB
#    eager (pytorch#86509, #109888) -> 512 MiB.
#  - NCCL buffers, allocated outside PyTorch's caching allocator, per communicator: 544-688 MB
#    per process group on 4x A100 NVLink (nccl#964) -> 640 MiB; more channels and NVLS buffers on
#    H100 NVSwitch systems (1 GiB NVLS in NCCL 2.19, nccl-tests#216) -> 1 GiB; PCIe-only GPUs
#    use few channels -> 256 MiB (an assumption).
#  - caching allocator: max reserved / max allocated 1.26-1.50 in FSDP LLM runs on A100
#    (llama-cookbook#120, #41, #165) -> 1.25.
# Latencies: NCCL small-message all-reduce ~ 10 µs on NVLink, ~ 20 µs on PCIe, ~ 25 µs over IB.
# Overlap slowdown: communication kernels take SMs and HBM bandwidth from compute; 1.1-1.3 is
# typical for NVLink systems, more on PCIe where collectives stage through the host.

# the host tier (CPU offload). Host memory: DGX A100, DGX H100 and HGX H200 systems ship 2 TiB,
# an 8×RTX 4090 server is taken with 512 GiB; each device's process gets an eighth. Host link:
# pinned copies achieve about 80% of PCIe's per-direction peak (4.0 x16: 32 GB/s -> 25 GB/s;
# 5.0 x16: 64 GB/s -> 50 GB/s). Host optimizer: torch's foreach AdamW on CPU is bound by memory
# traffic (parameter, gradient and two states read, three written: 28 bytes per fp32 parameter,
# in several passes); about 1e9 parameter updates per second on a two-socket host, shared by 8
# devices. Estimates: ``galvatron-fx profile`` measures each on the real machine.
_HOST_PCIE4 = {"host_memory_bytes": 256 * GiB, "host_link_bytes_s": 25e9, "host_optimizer_params_s": 1.25e8}
_HOST_PCIE5 = {"host_memory_bytes": 256 * GiB, "host_link_bytes_s": 50e9, "host_optimizer_params_s": 1.25e8}
_HOST_WORKSTATION = {"host_memory_bytes": 64 * GiB, "host_link_bytes_s": 25e9, "host_optimizer_params_s": 1.25e8}

_FIXED = {"kernel_overhead_s": 5e-6, "layer_overhead_s": 2e-4, "context_bytes": 512 * MiB, "allocator_factor": 1.25}

DEVICES: dict[str, dict] = {
    "A100-SXM-80GB": {
        "memory_bytes": 80 * GiB,
        "peak_flops": {"float32": 19.5e12, "tfloat32": 156e12, "bfloat16": 312e12, "float16": 312e12},
        "memory_bandwidth_bytes_s": 2.039e12, "comm_buffer_bytes": 640 * MiB, **_FIXED, **_HOST_PCIE4,
    },
    "H100-SXM-80GB": {
        "memory_bytes": 80 * GiB,
        "peak_flops": {"float32": 67e12, "tfloat32": 494.5e12, "bfloat16": 989e12, "float16": 989e12},
        "memory_bandwidth_bytes_s": 3.35e12, "comm_buffer_bytes": GiB, **_FIXED, **_HOST_PCIE5,
    },
    "H200-SXM-141GB": {
        "memory_bytes": 143771 * MiB,
        "peak_flops": {"float32": 67e12, "tfloat32": 494.5e12, "bfloat16": 989e12, "float16": 989e12},
        "memory_bandwidth_bytes_s": 4.8e12, "comm_buffer_bytes": GiB, **_FIXED, **_HOST_PCIE5,
    },
    "RTX4090-24GB": {
        "memory_bytes": 24 * GiB,
        "peak_flops": {"float32": 82.6e12, "tfloat32": 82.6e12, "bfloat16": 165.2e12, "float16": 165.2e12},
        "memory_bandwidth_bytes_s": 1.008e12, "comm_buffer_bytes": 256 * MiB, **_FIXED, **_HOST_WORKSTATION,
    },
}

CLUSTERS: dict[str, dict] = {
    "dgx-a100-80g": {"device": "A100-SXM-80GB", "intra": (10e-6, 240e9), "inter": (25e-6, 22.5e9),
                     "overlap_slowdown": 1.2},
    "dgx-h100": {"device": "H100-SXM-80GB", "intra": (10e-6, 360e9), "inter": (25e-6, 45e9), "overlap_slowdown": 1.2},
    "h200": {"device": "H200-SXM-141GB", "intra": (10e-6, 360e9), "inter": (25e-6, 45e9), "overlap_slowdown": 1.2},
    "rtx4090-pcie": {"device": "RTX4090-24GB", "intra": (20e-6, 25e9), "inter": (30e-6, 1.5e9),
                     "overlap_slowdown": 1.4},
}
