"""Published measurements of real GPU training runs of Transformer language models.

The data is ``published_data.json`` beside this file (read, never executed); this module loads it.
Every row is one measured training configuration copied from a public source; the
exact location is in ``cite``.  Numbers were read through the project's search
tools (paper text/markdown conversions in the code index, GitHub READMEs/docs).
Nothing is estimated: fields not stated by the source are ``None`` and the
``notes`` say so.  Simple arithmetic on stated numbers (e.g. dp = GPUs/(tp*pp),
global batch = local batch * dp) is marked "derived" in ``notes``.

Lists
-----
ROWS         whole-run measurements with tp * pp * dp == num_gpus (no context
             parallelism).  Sources: megatron-lm-2021, korthikanti-2022,
             torchtitan, torchtitan-community, mosaicml-llm-foundry,
             nemo-perf-summary, megatron-bridge-perf-summary, bloom-176b.
CP_ROWS      same schema, but runs that also use context parallelism; their
             ``parallel`` dict has an extra key ``cp`` and
             tp * pp * cp * dp == num_gpus.
LAYER_TIMES  per-transformer-layer forward/backward times (Korthikanti Table 4).
UNPINNED     sources/rows looked at but not usable, and why.

Row schema
----------
id, source, cite, notes : str
model    : family ("gpt" = non-gated MLP incl. MPT/BLOOM/Nemotron, "llama" =
           SwiGLU/RMSNorm/RoPE), layers, hidden, heads, kv_heads (== heads for
           MHA), ffn_hidden, vocab, seq_len, params_b (as published, billions).
cluster  : gpu, num_gpus, gpus_per_node, interconnect.
parallel : tp, pp, dp (data-parallel degree incl. FSDP/ZeRO sharding degree),
           virtual_stages (interleaved chunks per device; 1 = not interleaved),
           micro_batch (sequences per microbatch), global_batch (sequences per
           optimizer step), sequence_parallel, recompute ("none" | "selective" |
           "full"), zero ("none" | "zero1" | "zero2" | "zero3" | "fsdp"),
           precision ("bf16" | "fp16" | "fp8").
measured : tflops_per_gpu (as published; see flops_counting), mfu (fraction
           0..1, model FLOPs without recompute, only where the source calls it
           MFU), step_time_s (seconds per optimizer step/iteration),
           tokens_per_s_per_gpu, memory_gib (per GPU; torchtitan rows are
           torch.cuda max *reserved*), flops_counting (how the source counts
           FLOPs - needed to turn TFLOP/s back into time).

FLOP-counting conventions differ by source:
  * megatron-lm-2021: Eq. 3 counts an extra recompute forward (factor 96 =
    4 passes * 24); published "% of peak" is therefore HFU-like -> kept in notes.
  * korthikanti-2022: MFU (Eq. 7, factor 72) and HFU (Eq. 8) both published.
  * torchtitan: 6*(N - N_emb) + 12*L*H*head_dim*S per token (PaLM style).
  * mosaicml: 6*N + 12*L*d*S per token for MFU, 8*N + 16*L*d*S for HFU.
  * nemo / megatron-bridge: "Model TFLOP/sec/GPU" (model FLOPs, no recompute).
  * bloom-176b: hardware TFLOPs with recompute ("4*2" coefficient).
Peaks used by sources: A100 312 TFLOP/s (bf16/fp16 dense), H100 SXM ~989 bf16 /
~1979 fp8 dense.  The torchtitan Grand-Teton H100s are HBM2e 96 GB parts run at
500 W, so they are slower than standard 700 W H100 SXM (gpu label says so).
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads((Path(__file__).with_name("published_data.json")).read_text(encoding="utf-8"))

ROWS: list[dict] = _DATA["ROWS"]
CP_ROWS: list[dict] = _DATA["CP_ROWS"]
LAYER_TIMES: list[dict] = _DATA["LAYER_TIMES"]
UNPINNED: list[str] = _DATA["UNPINNED"]
