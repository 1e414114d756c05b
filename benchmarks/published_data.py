"""Published measurements of real GPU training runs of Transformer language models.

Research/data-entry module for the galvatron_fx benchmark (plain data, no logic).
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

ROWS: list[dict] = [{'id': 'megatron21-t1-1p7b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 2304,
            'heads': 24,
            'kv_heads': 24,
            'ffn_hidden': 9216,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 1.7},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 32,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 137.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 44% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 4.4 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h (standard '
           'GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether recompute '
           'was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs bf16 not '
           'pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; step time '
           'recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-3p6b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 30,
            'hidden': 3072,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 12288,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 3.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 2,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 138.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 44% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 8.8 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h (standard '
           'GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether recompute '
           'was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs bf16 not '
           'pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; step time '
           'recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-7p5b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 36,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 7.5},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 4,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 142.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 46% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 18.2 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h (standard '
           'GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether recompute '
           'was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs bf16 not '
           'pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; step time '
           'recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-18p4b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 6144,
            'heads': 48,
            'kv_heads': 48,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 18.4},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 1024,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 135.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 43% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 34.6 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h (standard '
           'GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether recompute '
           'was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs bf16 not '
           'pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; step time '
           'recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-39p1b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 39.1},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 2,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 138.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 44% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 70.8 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h (standard '
           'GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether recompute '
           'was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs bf16 not '
           'pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; step time '
           'recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-76p1b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 60,
            'hidden': 10240,
            'heads': 80,
            'kv_heads': 80,
            'ffn_hidden': 40960,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 76.1},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1024,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 4,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 1792,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 140.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 45% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 143.8 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h '
           '(standard GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether '
           'recompute was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs '
           'bf16 not pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; '
           'step time recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-145p6b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 145.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1536,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 24,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 2304,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 148.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 47% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 227.1 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h '
           '(standard GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether '
           'recompute was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs '
           'bf16 not pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; '
           'step time recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-310p1b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 65536,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 310.1},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1920,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 16,
               'dp': 15,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 2160,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 155.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 50% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 297.4 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h '
           '(standard GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether '
           'recompute was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs '
           'bf16 not pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; '
           'step time recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-529p6b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 2520,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 9,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 2520,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 163.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 52% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 410.2 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h '
           '(standard GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether '
           'recompute was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs '
           'bf16 not pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; '
           'step time recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t1-1008b',
  'source': 'megatron-lm-2021',
  'cite': "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
          "Megatron-LM', arXiv:2104.04473 (SC'21), Table 1 (weak scaling 1.7B..1T). Read via transcriptions: "
          'github SotaroKaneda/MLCarbon data/megatron_table.csv and a deep-dive markdown in the code index '
          '(both identical); corroborated by course notes (TP 1,2,4,8; DP 32..6; 137->163 TFLOP/s)',
  'model': {'family': 'gpt',
            'layers': 128,
            'hidden': 25600,
            'heads': 160,
            'kv_heads': 160,
            'ffn_hidden': 102400,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 1008.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 3072,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 64,
               'dp': 6,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 3072,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 163.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Table 1 gives heads/hidden/layers/t/p/GPUs/batch/TFLOP/s; dp = GPUs/(t*p) (derived). Published % '
           'of theoretical peak = 52% (TFLOP/s/312, recompute FLOPs counted, so HFU-like, not MFU; mfu left '
           'None). Aggregate 502.0 PFLOP/s. Vocab 51,200 and seq 2048 stated for all models; ffn=4h '
           '(standard GPT, not in the table). Micro-batch size, interleaving (virtual stages), and whether '
           'recompute was on are not in Table 1 (Eq. 3 assumes recompute). Precision: mixed 16-bit; fp16 vs '
           'bf16 not pinned in what we read. End-to-end throughput incl. data loading/optimizer/logging; '
           'step time recoverable as F/(n*X) with F from Eq. 3.'},
 {'id': 'megatron21-t2-zero3-175b-384gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 384,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 384,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 144.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. ZeRO-3 (DeepSpeed) with no tensor/pipeline '
           'parallelism, dp = GPUs. Published est. training time for 300B tokens: 90 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-zero3-175b-768gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 768,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 768,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 88.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. ZeRO-3 (DeepSpeed) with no tensor/pipeline '
           'parallelism, dp = GPUs. Published est. training time for 300B tokens: 74 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-zero3-175b-1536gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1536,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 1536,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 44.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. ZeRO-3 (DeepSpeed) with no tensor/pipeline '
           'parallelism, dp = GPUs. Published est. training time for 300B tokens: 74 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-zero3-530b-640gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 640,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 640,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 2560,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 138.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). ZeRO-3 (DeepSpeed) '
           'with no tensor/pipeline parallelism, dp = GPUs. Published est. training time for 300B tokens: '
           '169 days. Starred row in the paper: the 530B model did not fit on 560 GPUs with ZeRO-3 at '
           'micro-batch 4, so 640 GPUs and batch 2560 were used. Recompute/precision not stated in the '
           'table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-zero3-530b-1120gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1120,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 1120,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 98.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). ZeRO-3 (DeepSpeed) '
           'with no tensor/pipeline parallelism, dp = GPUs. Published est. training time for 300B tokens: '
           '137 days. Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-zero3-530b-2240gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 2240,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 2240,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'zero3',
               'precision': None},
  'measured': {'tflops_per_gpu': 48.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). ZeRO-3 (DeepSpeed) '
           'with no tensor/pipeline parallelism, dp = GPUs. Published est. training time for 300B tokens: '
           '140 days. Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-175b-384gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 384,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 4,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 153.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. PTD-P: paper gives only model-parallel size '
           't*p = 96 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 for the 529.6B model, and '
           'a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). dp = GPUs/96 (derived). '
           'Published est. training time for 300B tokens: 84 days. Recompute/precision not stated in the '
           'table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-175b-768gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 768,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 149.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. PTD-P: paper gives only model-parallel size '
           't*p = 96 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 for the 529.6B model, and '
           'a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). dp = GPUs/96 (derived). '
           'Published est. training time for 300B tokens: 43 days. Recompute/precision not stated in the '
           'table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-175b-1536gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 174.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1536,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 16,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 141.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture taken as GPT-3 175B (96 layers, h=12288, 96 heads), which the paper uses for this '
           'comparison; Table 2 itself lists only 174.6B params. PTD-P: paper gives only model-parallel size '
           't*p = 96 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 for the 529.6B model, and '
           'a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). dp = GPUs/96 (derived). '
           'Published est. training time for 300B tokens: 23 days. Recompute/precision not stated in the '
           'table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-530b-560gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 560,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 2,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 171.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). PTD-P: paper gives '
           'only model-parallel size t*p = 280 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 '
           'for the 529.6B model, and a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). '
           'dp = GPUs/280 (derived). Published est. training time for 300B tokens: 156 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-530b-1120gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 1120,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 4,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 167.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). PTD-P: paper gives '
           'only model-parallel size t*p = 280 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 '
           'for the 529.6B model, and a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). '
           'dp = GPUs/280 (derived). Published est. training time for 300B tokens: 80 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'megatron21-t2-ptdp-530b-2240gpu',
  'source': 'megatron-lm-2021',
  'cite': 'Narayanan et al., arXiv:2104.04473, Table 2 (PTD-P vs ZeRO-3 without model parallelism; also '
          'plotted in Fig. 10). Read via a deep-dive markdown transcription in the code index and an '
          'image-description note of Table 2 (values 153/149/141 and 144/88/44 agree)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 529.6},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 2240,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': None,
               'pp': None,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': None,
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': 159.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Narayanan et al. Eq. 3: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs '
                                 'per iteration; counts fwd + 2x bwd + one recompute fwd (full activation '
                                 'recomputation), i.e. hardware-FLOPs-like; TFLOP/s per GPU = F / '
                                 '(iteration_time * n_gpus); % of peak uses A100 312 TFLOP/s'},
  'notes': 'Architecture = the 529.6B model of Table 1 (105 layers, h=20480, 128 heads). PTD-P: paper gives '
           'only model-parallel size t*p = 280 (tp/pp split not in Table 2, left None; Table 1 uses t=8,p=35 '
           'for the 529.6B model, and a third-party reproduction (llm-analysis) uses t=8,p=12 for 174.6B). '
           'dp = GPUs/280 (derived). Published est. training time for 300B tokens: 42 days. '
           'Recompute/precision not stated in the table; same FLOP counting as Table 1 (Eq. 3).'},
 {'id': 'korthikanti22-22b-selective-sp',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.415,
               'step_time_s': 1.1,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaving not '
           'stated for this model (paper says it is used for 175B and 530B). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           "'Present work' = sequence parallelism + selective activation recomputation. HFU = 43.7%. "
           'Throughput increase over full recompute: see paired row.'},
 {'id': 'korthikanti22-22b-full-recompute',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': 1.42,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaving not '
           'stated for this model (paper says it is used for 175B and 530B). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           'Baseline: full activation recomputation without sequence parallelism. MFU not published for this '
           "row (model FLOPs equal the paired row's, so MFU = 41.5% * 1.10/1.42 if needed - derived, not "
           'published).'},
 {'id': 'korthikanti22-175b-selective-sp',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 175.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 64,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.514,
               'step_time_s': 13.75,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaved schedule '
           'with 3 stages per device for the 175B and 530B models (stated). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           "'Present work' = sequence parallelism + selective activation recomputation. HFU = 52.8%. "
           'Throughput increase over full recompute: see paired row.'},
 {'id': 'korthikanti22-175b-full-recompute',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 175.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 64,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': 18.13,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaved schedule '
           'with 3 stages per device for the 175B and 530B models (stated). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           'Baseline: full activation recomputation without sequence parallelism. MFU not published for this '
           "row (model FLOPs equal the paired row's, so MFU = 51.4% * 13.75/18.13 if needed - derived, not "
           'published).'},
 {'id': 'korthikanti22-530b-selective-sp',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 530.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 280,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 280,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.56,
               'step_time_s': 37.83,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaved schedule '
           'with 3 stages per device for the 175B and 530B models (stated). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           "'Present work' = sequence parallelism + selective activation recomputation. HFU = 57.0%. "
           'Throughput increase over full recompute: see paired row.'},
 {'id': 'korthikanti22-530b-full-recompute',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 530.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 280,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 280,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': 49.05,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaved schedule '
           'with 3 stages per device for the 175B and 530B models (stated). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           'Baseline: full activation recomputation without sequence parallelism. MFU not published for this '
           "row (model FLOPs equal the paired row's, so MFU = 56.0% * 37.83/49.05 if needed - derived, not "
           'published).'},
 {'id': 'korthikanti22-1t-selective-sp',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 128,
            'hidden': 25600,
            'heads': 160,
            'kv_heads': 160,
            'ffn_hidden': 102400,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 1000.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 64,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.563,
               'step_time_s': 71.49,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaving not '
           'stated for this model (paper says it is used for 175B and 530B). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           "'Present work' = sequence parallelism + selective activation recomputation. HFU = 57.0%. "
           'Throughput increase over full recompute: see paired row.'},
 {'id': 'korthikanti22-1t-full-recompute',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
          "arXiv:2205.05198 (MLSys'23), Table 3 (configs) + Table 5 (end-to-end iteration time, MFU, HFU). "
          'Read from a markdown conversion of the paper in the code index; MFU/HFU also in the 2022 '
          'NVIDIA/Megatron-LM README table',
  'model': {'family': 'gpt',
            'layers': 128,
            'hidden': 25600,
            'heads': 160,
            'kv_heads': 160,
            'ffn_hidden': 102400,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 1000.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 64,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': 94.42,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'No data parallelism (dp=1), so batch is much smaller than real training (stated). Seq 2048, '
           'vocab 51,200, mixed precision on Selene 80GB A100s (fp16/bf16 not pinned). Interleaving not '
           'stated for this model (paper says it is used for 175B and 530B). Output-tensor-deallocation '
           'pipeline memory optimization used in all results (App. B). ffn=4h assumed (GPT-3 style). '
           'Baseline: full activation recomputation without sequence parallelism. MFU not published for this '
           "row (model FLOPs equal the paired row's, so MFU = 56.3% * 71.49/94.42 if needed - derived, not "
           'published).'},
 {'id': 'korthikanti22-530b-selective-sp-dp8',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Section 6.3 text after Table 5 (and abstract)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 530.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 2240,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 8,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.542,
               'step_time_s': 39.15,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': '530B config of Table 3 scaled to 8-way data parallelism (2240 GPUs), batch per model instance '
           'kept (so global batch 280*8=2240, derived). Iteration time 37.83 s -> 39.15 s, MFU 56.0% -> '
           '54.2% (stated). No overlap of gradient all-reduce with backprop (stated). Interleaving v=3 '
           'carried over from the 530B setup.'},
 {'id': 'korthikanti22-530b-full-recompute-dp8',
  'source': 'korthikanti-2022',
  'cite': "Korthikanti et al., arXiv:2205.05198, abstract ('42.1% we achieve using recomputation')",
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 530.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 2240,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 8,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 2240,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.421,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'Abstract: 530B on 2240 A100s reaches 54.2% MFU with the new techniques, 29% faster than the '
           '42.1% MFU obtained with (full) recomputation. Iteration time not published; configuration '
           'assumed identical to the DP=8 row above (tp/pp/v/batch not restated in the abstract).'},
 {'id': 'korthikanti22-175b-microbatch-level-recompute',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Appendix C (microbatch-level activation recomputation)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 175.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 64,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.523,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'Table 3 config + SP + selective recompute + skipping checkpointing for as many in-flight '
           'microbatches as memory allows. Paper says MFU 52.3% (+0.7% over baseline); note 51.4+0.7 != 52.3 '
           'for 175B, so the +delta or the value has a small inconsistency in the paper. Iteration time not '
           'published.'},
 {'id': 'korthikanti22-530b-microbatch-level-recompute',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Appendix C (microbatch-level activation recomputation)',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': 128,
            'ffn_hidden': 81920,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 530.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 280,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 35,
               'dp': 1,
               'virtual_stages': 3,
               'micro_batch': 1,
               'global_batch': 280,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.564,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Korthikanti Appendix A: model FLOPs per iteration = 72*B*L*s*h^2*(1 + '
                                 's/(6h) + v/(12*h*L)) (Eq. 7, no recompute); hardware FLOPs (Eq. 8) add the '
                                 'selective-recompute attention FLOPs -> 72*B*L*s*h^2*(1 + s/(3h) + '
                                 'v/(12hL)); MFU/HFU = FLOPs/iteration_time/peak, A100 peak 312 TFLOP/s'},
  'notes': 'Table 3 config + SP + selective recompute + skipping checkpointing for as many in-flight '
           'microbatches as memory allows. Paper says MFU 56.4% (+0.4% over baseline); note 51.4+0.7 != 52.3 '
           'for 175B, so the +delta or the value has a small inconsistency in the paper. Iteration time not '
           'published.'},
 {'id': 'torchtitan-dec24-t1-8b-8gpu-fsdp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 1 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 16,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5762.0,
               'memory_gib': 82.4,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP. Selective AC (op '
           'vs layer not specified). bf16 = FSDP2 mixed precision default (not restated); fp8 = Float8 on '
           'nn.Linear (torchao).'},
 {'id': 'torchtitan-dec24-t1-8b-8gpu-compile',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 1 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 16,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 6667.0,
               'memory_gib': 77.0,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP + torch.compile. '
           'Selective AC (op vs layer not specified). bf16 = FSDP2 mixed precision default (not restated); '
           'fp8 = Float8 on nn.Linear (torchao).'},
 {'id': 'torchtitan-dec24-t1-8b-8gpu-compile-fp8',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 1 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 16,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 8532.0,
               'memory_gib': 76.8,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP + torch.compile + '
           'Float8. Selective AC (op vs layer not specified). bf16 = FSDP2 mixed precision default (not '
           'restated); fp8 = Float8 on nn.Linear (torchao).'},
 {'id': 'torchtitan-dec24-t3-8b-128gpu-fsdp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 3 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 256,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5605.0,
               'memory_gib': 67.0,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP. Selective AC (op '
           'vs layer not specified).'},
 {'id': 'torchtitan-dec24-t3-8b-128gpu-compile',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 3 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 256,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 6514.0,
               'memory_gib': 62.0,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP + torch.compile. '
           'Selective AC (op vs layer not specified).'},
 {'id': 'torchtitan-dec24-t3-8b-128gpu-compile-fp8',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 3 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 256,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 8380.0,
               'memory_gib': 61.8,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 2 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. Technique: FSDP + torch.compile + '
           'Float8. Selective AC (op vs layer not specified).'},
 {'id': 'torchtitan-dec24-t4-70b-256gpu-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 4 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 829.0,
               'memory_gib': 71.9,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 16 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. FSDP 32 x TP 8, torch.compile + '
           'Float8, full AC. Technique: 2D. TP in torchtitan always includes sequence parallelism and loss '
           'parallel.'},
 {'id': 'torchtitan-dec24-t4-70b-256gpu-asynctp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 4 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 876.0,
               'memory_gib': 67.6,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 16 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. FSDP 32 x TP 8, torch.compile + '
           'Float8, full AC. Technique: 2D + AsyncTP. TP in torchtitan always includes sequence parallelism '
           'and loss parallel.'},
 {'id': 'torchtitan-dec24-t5-405b-512gpu-1f1b',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 5 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 256,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 100.0,
               'memory_gib': 82.5,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 32 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. FSDP 8 x TP 8 x PP 8, '
           'torch.compile + Float8 + AsyncTP, full AC. Schedule: 1F1B (number of virtual stages and pipeline '
           'micro-batch size not stated). Memory is max across all GPUs (PP ranks differ). Local batch 32 '
           'with global 256 as published.'},
 {'id': 'torchtitan-dec24-t5-405b-512gpu-interleaved',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 5 (Dec-2024 H100 '
          'numbers; same tables in '
          'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md)',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 256,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 128.0,
               'memory_gib': 72.7,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). Local '
           'batch 32 per DP rank. TPS read at iteration 90; memory stable across training. H100s are HBM2e '
           '96GB SXM at 500 W power limit (lower than standard 700 W SXM). MFU not reported (Float8 makes it '
           'ill-defined); page notes 33-39% MFU for 1D 8B without Float8. FSDP 8 x TP 8 x PP 8, '
           'torch.compile + Float8 + AsyncTP, full AC. Schedule: Interleaved 1F1B (number of virtual stages '
           'and pipeline micro-batch size not stated). Memory is max across all GPUs (PP ranks differ). '
           'Local batch 32 with global 256 as published.'},
 {'id': 'torchtitan-2024-405b-128gpu-bf16',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (2024 version, section 'Llama "
          "3.1 performance numbers'; seen via the code-search index)",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-94GB', 'num_gpus': 128, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 16,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 32,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.29,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 109.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). 2D '
           "FSDP2 x TP 8 (FSDP ranks = 16, stated via 'global batch = 2 * 16 = 32'), local batch 2, full AC; "
           "1D FSDP OOMed. Optimizations: None. seq 8192 per llama3_405b.toml ('preset for 128 H100'). MFU "
           'column has footnotes whose text we could not read (likely about which peak is used for Float8); '
           'WPS = tokens/s per GPU. Interconnect not stated.'},
 {'id': 'torchtitan-2024-405b-128gpu-fp8',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (2024 version, section 'Llama "
          "3.1 performance numbers'; seen via the code-search index)",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-94GB', 'num_gpus': 128, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 16,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 32,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.2346,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 177.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). 2D '
           "FSDP2 x TP 8 (FSDP ranks = 16, stated via 'global batch = 2 * 16 = 32'), local batch 2, full AC; "
           "1D FSDP OOMed. Optimizations: Float8. seq 8192 per llama3_405b.toml ('preset for 128 H100'). MFU "
           'column has footnotes whose text we could not read (likely about which peak is used for Float8); '
           'WPS = tokens/s per GPU. Interconnect not stated.'},
 {'id': 'torchtitan-2024-405b-128gpu-fp8-asynctp',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (2024 version, section 'Llama "
          "3.1 performance numbers'; seen via the code-search index)",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-94GB', 'num_gpus': 128, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 16,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 32,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.2452,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 185.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). 2D '
           "FSDP2 x TP 8 (FSDP ranks = 16, stated via 'global batch = 2 * 16 = 32'), local batch 2, full AC; "
           "1D FSDP OOMed. Optimizations: Float8 + Async TP. seq 8192 per llama3_405b.toml ('preset for 128 "
           "H100'). MFU column has footnotes whose text we could not read (likely about which peak is used "
           'for Float8); WPS = tokens/s per GPU. Interconnect not stated.'},
 {'id': 'torchtitan-a100-l3-8b-sel-layer',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 3 "
          "performance numbers' table; torchtitan commit 0413364...)",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.568,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2904.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'Llama 3 (not 3.1) naming on this page. FSDP2 1D on 64 A100, local batch 1, global 64; AC: '
           "selective layer. seq 8192 from the llama3 tomls ('preset for 64 A100'). bf16 assumed from FSDP2 "
           'mixed-precision default (not stated). Nodes/interconnect not stated. A100 peak 312 TFLOP/s for '
           'MFU.'},
 {'id': 'torchtitan-a100-l3-8b-sel-op',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 3 "
          "performance numbers' table; torchtitan commit 0413364...)",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5820000000000001,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2973.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'Llama 3 (not 3.1) naming on this page. FSDP2 1D on 64 A100, local batch 1, global 64; AC: '
           "selective op. seq 8192 from the llama3 tomls ('preset for 64 A100'). bf16 assumed from FSDP2 "
           'mixed-precision default (not stated). Nodes/interconnect not stated. A100 peak 312 TFLOP/s for '
           'MFU.'},
 {'id': 'torchtitan-a100-l3-70b-full',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 3 "
          "performance numbers' table; torchtitan commit 0413364...)",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.517,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 331.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'Llama 3 (not 3.1) naming on this page. FSDP2 1D on 64 A100, local batch 1, global 64; AC: full. '
           "seq 8192 from the llama3 tomls ('preset for 64 A100'). bf16 assumed from FSDP2 mixed-precision "
           'default (not stated). Nodes/interconnect not stated. A100 peak 312 TFLOP/s for MFU.'},
 {'id': 'torchtitan-a100-l2-13b-noac',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 2 "
          "performance numbers' table)",
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 13824,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 13.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.611,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2162.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Llama 2 dims from torchtitan llama2_configs (13B: 5120/40 layers/40 heads, MHA; 70B: 8192/80/64 '
           'heads/8 kv); ffn from torchtitan multiple_of rule (13824 / 28672); vocab 32000 (Llama 2 '
           'tokenizer, not stated on page). seq 4096 (stated: Llama 2 default). FSDP2 on 64 A100, local '
           'batch 2, global 128. AC: no. bf16 assumed (FSDP2 default, not stated). 70B lbs 1 reported '
           'because lbs 2 OOMs with selective AC; page adds that 70B full AC can reach 54% MFU at larger '
           'local batch.'},
 {'id': 'torchtitan-a100-l2-13b-sel-layer',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 2 "
          "performance numbers' table)",
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 13824,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 13.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.541,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1914.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Llama 2 dims from torchtitan llama2_configs (13B: 5120/40 layers/40 heads, MHA; 70B: 8192/80/64 '
           'heads/8 kv); ffn from torchtitan multiple_of rule (13824 / 28672); vocab 32000 (Llama 2 '
           'tokenizer, not stated on page). seq 4096 (stated: Llama 2 default). FSDP2 on 64 A100, local '
           'batch 2, global 128. AC: selective layer. bf16 assumed (FSDP2 default, not stated). 70B lbs 1 '
           'reported because lbs 2 OOMs with selective AC; page adds that 70B full AC can reach 54% MFU at '
           'larger local batch.'},
 {'id': 'torchtitan-a100-l2-13b-sel-op',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 2 "
          "performance numbers' table)",
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 13824,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 13.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5379999999999999,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1904.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Llama 2 dims from torchtitan llama2_configs (13B: 5120/40 layers/40 heads, MHA; 70B: 8192/80/64 '
           'heads/8 kv); ffn from torchtitan multiple_of rule (13824 / 28672); vocab 32000 (Llama 2 '
           'tokenizer, not stated on page). seq 4096 (stated: Llama 2 default). FSDP2 on 64 A100, local '
           'batch 2, global 128. AC: selective op. bf16 assumed (FSDP2 default, not stated). 70B lbs 1 '
           'reported because lbs 2 OOMs with selective AC; page adds that 70B full AC can reach 54% MFU at '
           'larger local batch.'},
 {'id': 'torchtitan-a100-l2-70b-sel-op-lb1',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 2 "
          "performance numbers' table)",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 70.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.508,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 355.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Llama 2 dims from torchtitan llama2_configs (13B: 5120/40 layers/40 heads, MHA; 70B: 8192/80/64 '
           'heads/8 kv); ffn from torchtitan multiple_of rule (13824 / 28672); vocab 32000 (Llama 2 '
           'tokenizer, not stated on page). seq 4096 (stated: Llama 2 default). FSDP2 on 64 A100, local '
           'batch 1, global 64. AC: selective op. bf16 assumed (FSDP2 default, not stated). 70B lbs 1 '
           'reported because lbs 2 OOMs with selective AC; page adds that 70B full AC can reach 54% MFU at '
           'larger local batch.'},
 {'id': 'torchtitan-a100-l2-70b-full-lb2',
  'source': 'torchtitan',
  'cite': "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (early-2024 version, 'Llama 2 "
          "performance numbers' table)",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 70.0},
  'cluster': {'gpu': 'A100-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.505,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 353.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Llama 2 dims from torchtitan llama2_configs (13B: 5120/40 layers/40 heads, MHA; 70B: 8192/80/64 '
           'heads/8 kv); ffn from torchtitan multiple_of rule (13824 / 28672); vocab 32000 (Llama 2 '
           'tokenizer, not stated on page). seq 4096 (stated: Llama 2 default). FSDP2 on 64 A100, local '
           'batch 2, global 128. AC: full. bf16 assumed (FSDP2 default, not stated). 70B lbs 1 reported '
           'because lbs 2 OOMs with selective AC; page adds that 70B full AC can reach 54% MFU at larger '
           'local batch.'},
 {'id': 'torchtitan-asynctp25-70b-bf16-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 597.3,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: bf16; '
           "vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with the "
           'Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-70b-bf16-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 652.4,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: bf16; '
           "async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with the Dec-2024 "
           '70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-70b-fp8-tensorwise-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 809.8,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: '
           "fp8-tensorwise; vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-70b-fp8-tensorwise-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 942.4,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: '
           "fp8-tensorwise; async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-70b-fp8-rowwise-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 599.6,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: '
           "fp8-rowwise; vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-70b-fp8-rowwise-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 256,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 512,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 624.8,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 32 '
           'x TP 8, torch.compile, AC full, local batch 16 (global = 512, derived). Quantization: '
           "fp8-rowwise; async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with "
           'the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-bf16-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4378.0,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "bf16; vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with the "
           'Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-bf16-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4809.4,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "bf16; async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with the "
           'Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-fp8-tensorwise-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5078.1,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "fp8-tensorwise; vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-fp8-tensorwise-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5570.1,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "fp8-tensorwise; async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-fp8-rowwise-vanilla-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3708.5,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "fp8-rowwise; vanilla tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent "
           'with the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-asynctp25-8b-fp8-rowwise-async-tp',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md '
          '(text-table version seen via code search; current version shows the same table as an image)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 96,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3914.9,
               'memory_gib': None,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). FSDP 8 '
           'x TP 8, torch.compile, AC per-op selective, local batch 12 (global = 96, derived). Quantization: '
           "fp8-rowwise; async tp. Column is 'tokens/sec' - read as torchtitan per-GPU TPS (consistent with "
           'the Dec-2024 70B table, 829 TPS). Memory not reported.'},
 {'id': 'torchtitan-trainy-h200-8b-32gpu',
  'source': 'torchtitan-community',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H200-141GB',
              'num_gpus': 32,
              'gpus_per_node': 8,
              'interconnect': 'NVLink intra-host; 400 Gb/s per GPU RDMA (Mellanox CX-7)'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 10938.0,
               'memory_gib': 47.96,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). '
           'Third-party (Trainy on WhiteFiber) run of torchtitan llama3_8b.toml, 4 nodes, local batch 2 '
           '(global 64, derived), torch.compile, Float8 with FSDP float8 all-gather and precomputed scales. '
           'AC not passed on the command line; the toml default in the versions we read is selective (op) - '
           'not pinned, recompute left None. TPS/memory sampled at iteration 100.'},
 {'id': 'torchtitan-trainy-h200-8b-64gpu',
  'source': 'torchtitan-community',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H200-141GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'NVLink intra-host; 400 Gb/s per GPU RDMA (Mellanox CX-7)'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 10753.0,
               'memory_gib': 46.97,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'seq_len 8192 from torchtitan llama3 train_configs tomls (not restated on the perf page). '
           'Third-party (Trainy on WhiteFiber) run of torchtitan llama3_8b.toml, 8 nodes, local batch 2 '
           '(global 128, derived), torch.compile, Float8 with FSDP float8 all-gather and precomputed scales. '
           'AC not passed on the command line; the toml default in the versions we read is selective (op) - '
           'not pinned, recompute left None. TPS/memory sampled at iteration 100.'},
 {'id': 'mosaicml-h100-80gb-70b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 8,
               'global_batch': 2048,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 421.26,
               'mfu': 0.4257,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1039.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 8 x grad-accum '
           '4 x 64 GPUs = global 2048 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 56.76%). 'Model TFLOP' column = 4.212583e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-70b-seq2048-32gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 32, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 1024,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 357.69,
               'mfu': 0.3615,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 882.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 2 x grad-accum '
           '16 x 32 GPUs = global 1024 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 48.20%). 'Model TFLOP' column = 3.576911e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-30b-seq2048-32gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 29.975},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 32, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': 14,
               'global_batch': 1344,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 434.64,
               'mfu': 0.43920000000000003,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2308.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 14 x grad-accum '
           '3 x 32 GPUs = global 1344 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 58.57%). 'Model TFLOP' column = 4.346371e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-30b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 29.975},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 3,
               'global_batch': 504,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 377.14,
               'mfu': 0.3811,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2002.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 3 x grad-accum '
           '21 x 8 GPUs = global 504 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 50.82%). 'Model TFLOP' column = 3.771361e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-30b-seq8192-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 8192,
            'params_b': 30.019},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 168,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 296.11,
               'mfu': 0.2992,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1384.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 1 x grad-accum '
           '21 x 8 GPUs = global 168 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 39.90%). 'Model TFLOP' column = 2.961077e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-13b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 12.854},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 128,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 394.37,
               'mfu': 0.3986,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4800.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 2 x grad-accum '
           '1 x 64 GPUs = global 128 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 39.86%). 'Model TFLOP' column = 3.943653e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-13b-seq4096-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 4096,
            'params_b': 12.864},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 10,
               'global_batch': 240,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 411.62,
               'mfu': 0.41600000000000004,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4717.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 10 x grad-accum '
           '3 x 8 GPUs = global 240 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 55.47%). 'Model TFLOP' column = 4.116250e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-7b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 6.659},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 6,
               'global_batch': 48,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 459.51,
               'mfu': 0.4644,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 10643.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 6 x grad-accum '
           '1 x 8 GPUs = global 48 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 46.44%). 'Model TFLOP' column = 4.595096e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-7b-seq8192-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 8192,
            'params_b': 6.684},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 8,
               'global_batch': 128,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 367.49,
               'mfu': 0.3714,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 6935.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 8 x grad-accum '
           '2 x 8 GPUs = global 128 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 49.52%). 'Model TFLOP' column = 3.674893e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-3b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 2560,
            'heads': 20,
            'kv_heads': 20,
            'ffn_hidden': 10240,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 2.652},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 6,
               'global_batch': 1152,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 403.76,
               'mfu': 0.408,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 22525.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-3b.yaml (d_model 2560, 20 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 6 x grad-accum '
           '3 x 64 GPUs = global 1152 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 40.80%). 'Model TFLOP' column = 4.037625e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-1b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB BF16'",
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 2048,
            'heads': 16,
            'kv_heads': 16,
            'ffn_hidden': 8192,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 1.316},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 20,
               'global_batch': 1280,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 404.22,
               'mfu': 0.40850000000000003,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 44402.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-1b.yaml (d_model 2048, 16 heads, 24 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 20 x grad-accum '
           '1 x 64 GPUs = global 1280 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 40.85%). 'Model TFLOP' column = 4.042246e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-h100-80gb-3b-seq2048-8gpu-fp8',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'H100 80GB FP8'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 2560,
            'heads': 20,
            'kv_heads': 20,
            'ffn_hidden': 10240,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 2.652},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 10,
               'global_batch': 480,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 548.24,
               'mfu': 0.27699999999999997,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 30586.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-3b.yaml (d_model 2560, 20 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 10 x grad-accum '
           '6 x 8 GPUs = global 480 sequences. Precision amp_fp8, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 27.70%). 'Model TFLOP' column = 5.482421e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README). FP8 row: MFU/HFU are relative to the H100 FP8 peak (~1979 '
           'TFLOP/s implied by Model TFLOP / MFU), not the bf16 peak.'},
 {'id': 'mosaicml-a100-80gb-70b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 64,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 8,
               'global_batch': 2048,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5333,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 410.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 8 x grad-accum '
           '4 x 64 GPUs = global 2048 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 71.10%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-80gb-70b-seq2048-32gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 32,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 1024,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.48560000000000003,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 373.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 2 x grad-accum '
           '16 x 32 GPUs = global 1024 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 64.75%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-80gb-30b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 29.975},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 3,
               'global_batch': 504,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 172.54,
               'mfu': 0.5529999999999999,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 916.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 3 x grad-accum '
           '21 x 8 GPUs = global 504 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 73.74%). 'Model TFLOP' column = 1.725420e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-13b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 12.854},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 48,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 185.86,
               'mfu': 0.5957,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2262.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 2 x grad-accum '
           '3 x 8 GPUs = global 48 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 59.57%). 'Model TFLOP' column = 1.858556e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-13b-seq8192-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 8192,
            'params_b': 12.885},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 5,
               'global_batch': 120,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 174.95,
               'mfu': 0.5607,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1795.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 5 x grad-accum '
           '3 x 8 GPUs = global 120 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 74.76%). 'Model TFLOP' column = 1.749500e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-7b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 6.659},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 6,
               'global_batch': 96,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 200.38,
               'mfu': 0.6423000000000001,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4641.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 6 x grad-accum '
           '2 x 8 GPUs = global 96 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 64.23%). 'Model TFLOP' column = 2.003836e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-7b-seq8192-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 8192,
            'params_b': 6.684},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 8,
               'global_batch': 128,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 169.93,
               'mfu': 0.5447,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3206.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 8 x grad-accum '
           '2 x 8 GPUs = global 128 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing on (HFU 72.62%). 'Model TFLOP' column = 1.699318e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-3b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 2560,
            'heads': 20,
            'kv_heads': 20,
            'ffn_hidden': 10240,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 2.652},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 10,
               'global_batch': 160,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 193.79,
               'mfu': 0.6211,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 10811.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-3b.yaml (d_model 2560, 20 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 10 x grad-accum '
           '2 x 8 GPUs = global 160 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 62.11%). 'Model TFLOP' column = 1.937863e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-80gb-1b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 2048,
            'heads': 16,
            'kv_heads': 16,
            'ffn_hidden': 8192,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 1.316},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 14,
               'global_batch': 448,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 186.75,
               'mfu': 0.5986,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 20513.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-1b.yaml (d_model 2048, 16 heads, 24 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 14 x grad-accum '
           '4 x 8 GPUs = global 448 sequences. Precision amp_bf16, FSDP mixed-precision mode DEFAULT. '
           "Activation checkpointing off (HFU 59.86%). 'Model TFLOP' column = 1.867501e+14 FLOP/s per GPU "
           '(model FLOPs). MPT uses ALiBi and FlashAttention/Triton attention (non-gated GELU MLP -> family '
           "'gpt'). gpus_per_node=8 assumed from the MosaicML platform, not stated. Throughput measured over "
           'a short run (~12 steps per README).'},
 {'id': 'mosaicml-a100-40gb-70b-seq2048-128gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 128,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.4891,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 376.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 4 x grad-accum '
           '1 x 128 GPUs = global 512 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 65.21%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-70b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 32768,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 64.862},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 64,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 128,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.35869999999999996,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 276.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-70b.yaml (d_model 8192, 64 heads, 80 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 2 x grad-accum '
           '1 x 64 GPUs = global 128 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 47.82%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-30b-seq2048-128gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 29.975},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 128,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': 6,
               'global_batch': 768,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5225,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 865.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 6 x grad-accum '
           '1 x 128 GPUs = global 768 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 69.66%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-30b-seq2048-32gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': 56,
            'ffn_hidden': 28672,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 29.975},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 32,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 32,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 128,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5174,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 857.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-30b.yaml (d_model 7168, 56 heads, 48 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 4 x grad-accum '
           '1 x 32 GPUs = global 128 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 68.98%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-13b-seq2048-64gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 12.854},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 64,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 16,
               'global_batch': 1024,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5204,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1976.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 16 x grad-accum '
           '1 x 64 GPUs = global 1024 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 69.39%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-13b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 20480,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 12.854},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 512,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.43939999999999996,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1668.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-13b.yaml (d_model 5120, 40 heads, 40 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 4 x grad-accum '
           '16 x 8 GPUs = global 512 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 58.58%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-7b-seq2048-128gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 6.659},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 128,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 128,
               'virtual_stages': None,
               'micro_batch': 18,
               'global_batch': 2304,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5014,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3623.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 18 x grad-accum '
           '1 x 128 GPUs = global 2304 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 66.85%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'mosaicml-a100-40gb-7b-seq2048-8gpu',
  'source': 'mosaicml-llm-foundry',
  'cite': 'https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md, section '
          "'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'",
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': 50368,
            'seq_len': 2048,
            'params_b': 6.659},
  'cluster': {'gpu': 'A100-40GB',
              'num_gpus': 8,
              'gpus_per_node': None,
              'interconnect': '1600 Gbps node-node RoCE'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 12,
               'global_batch': 384,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': None,
               'mfu': 0.5092,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3679.0,
               'memory_gib': None,
               'flops_counting': 'llm-foundry: MFU = (3*flops_per_seq + '
                                 '3*attn_flops_per_seq)*seq_per_s/(n_gpu*peak), flops_per_seq = 2*N*seq (N = '
                                 'NumParams column), attn_flops_per_seq = n_layers*2*2*d_model*seq^2; HFU '
                                 'uses 4 instead of 3 (one recompute fwd) when activation checkpointing is '
                                 'on; excludes norm/activation/residual FLOPs. Implied peaks: A100 312, H100 '
                                 'bf16 ~989, H100 fp8 ~1979 TFLOP/s'},
  'notes': 'MPT dims from llm-foundry scripts/train/yamls/pretrain/mpt-7b.yaml (d_model 4096, 32 heads, 32 '
           'layers, expansion 4, vocab 50368). params_b from the NumParams column (varies slightly with seq '
           'len). Composer FSDP FULL_SHARD over all GPUs (dp = #GPUs), no TP/PP; micro-batch 12 x grad-accum '
           '4 x 8 GPUs = global 384 sequences. Precision bf16, FSDP mixed-precision mode PURE. Activation '
           "checkpointing on (HFU 67.89%). 'Model TFLOP' column for this row is ~1e16, i.e. off by ~100x vs "
           'MFU*peak (a units bug in the table), so tflops_per_gpu left None. MPT uses ALiBi and '
           "FlashAttention/Triton attention (non-gated GELU MLP -> family 'gpt'). gpus_per_node=8 assumed "
           'from the MosaicML platform, not stated. Throughput measured over a short run (~12 steps per '
           'README).'},
 {'id': 'nemo2407-h100-fp8-gpt3-5b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': None,
            'seq_len': 2048,
            'params_b': 5.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': 1,
               'micro_batch': 4,
               'global_batch': 2048,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 736.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 22521.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 1 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-gpt3-20b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 44,
            'hidden': 6144,
            'heads': 48,
            'kv_heads': 48,
            'ffn_hidden': 24576,
            'vocab': None,
            'seq_len': 2048,
            'params_b': 20.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 2,
               'pp': 1,
               'dp': 32,
               'virtual_stages': 1,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 750.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5851.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 1 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-gpt3-175b-128gpu',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': None,
            'seq_len': 2048,
            'params_b': 175.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 4,
               'virtual_stages': 6,
               'micro_batch': 1,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 782.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 726.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 6 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-gpt3-175b-512gpu',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': 96,
            'ffn_hidden': 49152,
            'vocab': None,
            'seq_len': 2048,
            'params_b': 175.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 16,
               'virtual_stages': 6,
               'micro_batch': 2,
               'global_batch': 2048,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 842.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 782.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'The 842 TFLOP/s cell links to MLCommons (MLPerf Training) results. Pre-training table row; CP=1. '
           'dp = GPUs/(TP*PP) (derived). VP column given as 6 (1 = no interleaving). Sequence parallelism, '
           'activation recomputation, distributed optimizer and the exact FP8 recipe are not stated on the '
           'page (NeMo recipes typically enable SP with TP>1 - not pinned). Model dims from NeMo '
           'GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab not pinned for '
           'GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-llama2-7b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 11008,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 7.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': 1,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 776.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 16847.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 1 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-llama2-13b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': 40,
            'ffn_hidden': 13824,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 13.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 16,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 1,
               'pp': 4,
               'dp': 4,
               'virtual_stages': 10,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 754.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 8646.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 10 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-llama2-70b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 32000,
            'seq_len': 4096,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 4,
               'pp': 4,
               'dp': 4,
               'virtual_stages': 20,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 759.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1707.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 20 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-nemotron-8b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 32,
            'ffn_hidden': 16384,
            'vocab': None,
            'seq_len': 4096,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 2,
               'pp': 1,
               'dp': 32,
               'virtual_stages': 1,
               'micro_batch': 4,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 653.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 12701.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': "Nemotron (squared-ReLU non-gated MLP, RoPE) mapped to family 'gpt'; dims from NeMo "
           'Nemotron3Config8B. Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as '
           '1 (1 = no interleaving). Sequence parallelism, activation recomputation, distributed optimizer '
           'and the exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 '
           '- not pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; '
           'vocab not pinned for GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-nemotron-22b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 6144,
            'heads': 48,
            'kv_heads': 48,
            'ffn_hidden': 24576,
            'vocab': None,
            'seq_len': 4096,
            'params_b': 22.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 2,
               'pp': 4,
               'dp': 8,
               'virtual_stages': 10,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 554.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4256.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': "Nemotron mapped to family 'gpt'; dims from NeMo Nemotron3Config22B. Pre-training table row; "
           'CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 10 (1 = no interleaving). Sequence '
           'parallelism, activation recomputation, distributed optimizer and the exact FP8 recipe are not '
           'stated on the page (NeMo recipes typically enable SP with TP>1 - not pinned). Model dims from '
           'NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab not pinned for '
           'GPT3/Nemotron.'},
 {'id': 'nemo2407-h100-fp8-nemotron-340b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 18432,
            'heads': 96,
            'kv_heads': 8,
            'ffn_hidden': 73728,
            'vocab': None,
            'seq_len': 4096,
            'params_b': 340.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 128,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 2,
               'virtual_stages': 12,
               'micro_batch': 1,
               'global_batch': 32,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 678.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 322.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': "Nemotron-4 340B (GQA 8 groups) mapped to family 'gpt'; dims from NeMo Nemotron4Config340B. "
           'Pre-training table row; CP=1. dp = GPUs/(TP*PP) (derived). VP column given as 12 (1 = no '
           'interleaving). Sequence parallelism, activation recomputation, distributed optimizer and the '
           'exact FP8 recipe are not stated on the page (NeMo recipes typically enable SP with TP>1 - not '
           'pinned). Model dims from NeMo GPTConfig5B/20B/175B and Llama2Config7B/13B/70B dataclasses; vocab '
           'not pinned for GPT3/Nemotron.'},
 {'id': 'mbridge2602-h100-l3-70b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02 NeMo container, Model: LLAMA3_70B'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 2,
               'virtual_stages': 5,
               'micro_batch': 1,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 728.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1621.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 2 '
           "(derived), grad-accum 128. VP 5. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None).  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2602-gb300-l3-70b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02 NeMo container, Model: LLAMA3_70B'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'GB300', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 2248.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 5003.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB300. FSDP column on this page = 64 (Megatron-FSDP over the DP group; the archive page '
           'writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 64 (derived), '
           "grad-accum 2. VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). Recompute, "
           'sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge performance '
           'recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs per compute '
           'tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: 32x4096, 32 '
           'heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab '
           '128256).'},
 {'id': 'mbridge2602-gb200-l3-70b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02 NeMo container, Model: LLAMA3_70B'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'GB200', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 1815.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4040.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB200. FSDP column on this page = 64 (Megatron-FSDP over the DP group; the archive page '
           'writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 64 (derived), '
           "grad-accum 2. VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). Recompute, "
           'sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge performance '
           'recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs per compute '
           'tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: 32x4096, 32 '
           'heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab '
           '128256).'},
 {'id': 'mbridge2602-gb300-l31-405b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02 NeMo container, Model: LLAMA3.1_405B'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'GB300', 'num_gpus': 256, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 8,
               'virtual_stages': 4,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 2495.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 988.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB300. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 '
           "(derived), grad-accum 192. VP 4. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs '
           'per compute tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: '
           '32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn '
           '53248; vocab 128256).'},
 {'id': 'mbridge2602-gb200-l31-405b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02 NeMo container, Model: LLAMA3.1_405B'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'GB200', 'num_gpus': 256, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 16,
               'dp': 4,
               'virtual_stages': 4,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 2004.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 793.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB200. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 4 '
           "(derived), grad-accum 384. VP 4. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs '
           'per compute tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: '
           '32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn '
           '53248; vocab 128256).'},
 {'id': 'mbridge2511-h100-l3-8b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 744.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 14451.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100. FSDP column on this page = 1 (Megatron-FSDP over the DP group; the archive page writes '
           'the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 (derived), grad-accum 16. '
           "VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). Recompute, sequence parallelism "
           'and distributed-optimizer settings are in the Megatron-Bridge performance recipes, not on this '
           'page (left None).  Llama dims standard (8B: 32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, '
           '64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2511-h100-l3-70b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 2,
               'virtual_stages': 5,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 719.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1602.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 2 '
           "(derived), grad-accum 64. VP 5. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None).  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2511-b200-l3-8b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-B200'",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'B200', 'num_gpus': 8, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 1576.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 30624.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-B200. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 '
           "(derived), grad-accum 8. VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None).  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2511-gb200-l3-8b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-GB200'",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'GB200', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 1622.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 31508.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB200. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 '
           "(derived), grad-accum 8. VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs '
           'per compute tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: '
           '32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn '
           '53248; vocab 128256).'},
 {'id': 'mbridge2511-gb200-l3-70b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-GB200'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'GB200', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': 1,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 1937.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4312.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB200. FSDP column on this page = 1 (Megatron-FSDP over the DP group; the archive page '
           'writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 64 (derived), '
           "grad-accum 2. VP 1. Precision FP8 (current scaling 'FP8-CS' where labelled). Recompute, sequence "
           'parallelism and distributed-optimizer settings are in the Megatron-Bridge performance recipes, '
           'not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs per compute tray, '
           '72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2511-gb200-l31-405b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-GB200'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'GB200', 'num_gpus': 256, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 16,
               'dp': 4,
               'virtual_stages': 4,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 2053.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 813.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB200. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 4 '
           "(derived), grad-accum 384. VP 4. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs '
           'per compute tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: '
           '32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn '
           '53248; vocab 128256).'},
 {'id': 'mbridge2511-gb300-l3-8b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-GB300'",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'GB300', 'num_gpus': 8, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 1933.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 37556.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB300. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 '
           "(derived), grad-accum 8. VP n/a. Precision FP8 (current scaling 'FP8-CS' where labelled). "
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs '
           'per compute tray, 72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: '
           '32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn '
           '53248; vocab 128256).'},
 {'id': 'mbridge2511-gb300-l3-70b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11 NeMo container, System: DGX-GB300'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'GB300', 'num_gpus': 64, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 64,
               'virtual_stages': 1,
               'micro_batch': 2,
               'global_batch': 256,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': 'fp8'},
  'measured': {'tflops_per_gpu': 2030.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 4520.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB300. FSDP column on this page = 1 (Megatron-FSDP over the DP group; the archive page '
           'writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 64 (derived), '
           "grad-accum 2. VP 1. Precision FP8 (current scaling 'FP8-CS' where labelled). Recompute, sequence "
           'parallelism and distributed-optimizer settings are in the Megatron-Bridge performance recipes, '
           'not on this page (left None). GB200/GB300 are NVL72 rack systems (4 GPUs per compute tray, '
           '72-GPU NVLink domain) - gpus_per_node left None.  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2509-h100-l3-8b',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '25.09 NeMo container, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 8, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': 'fsdp',
               'precision': None},
  'measured': {'tflops_per_gpu': 725.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 14079.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100. FSDP column on this page = 8 (Megatron-FSDP over the DP group; the archive page writes '
           'the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 8 (derived), grad-accum 16. '
           'VP n/a. Precision column absent for 25.09 tables (likely FP8 like later releases - not pinned). '
           'Recompute, sequence parallelism and distributed-optimizer settings are in the Megatron-Bridge '
           'performance recipes, not on this page (left None).  Llama dims standard (8B: 32x4096, 32 heads/8 '
           'kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, ffn 53248; vocab 128256).'},
 {'id': 'mbridge2509-h100-l3-70b',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '25.09 NeMo container, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 64, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 2,
               'virtual_stages': 5,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': None},
  'measured': {'tflops_per_gpu': 727.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1619.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100. FSDP column on this page = 0 (DDP, possibly with distributed optimizer - not stated; '
           'the archive page writes the FSDP sharding-group size instead of 1); dp = GPUs/(TP*PP*CP) = 2 '
           '(derived), grad-accum 64. VP 5. Precision column absent for 25.09 tables (likely FP8 like later '
           'releases - not pinned). Recompute, sequence parallelism and distributed-optimizer settings are '
           'in the Megatron-Bridge performance recipes, not on this page (left None).  Llama dims standard '
           '(8B: 32x4096, 32 heads/8 kv, ffn 14336; 70B: 80x8192, 64/8, ffn 28672; 405B: 126x16384, 128/8, '
           'ffn 53248; vocab 128256).'},
 {'id': 'bloom176b-gbs2048',
  'source': 'bloom-176b',
  'cite': 'https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml/README.md, '
          "section 'Important checkpoints' (log line at iteration 85376) + 'Replica setup'",
  'model': {'family': 'gpt',
            'layers': 70,
            'hidden': 14336,
            'heads': 112,
            'kv_heads': 112,
            'ffn_hidden': 57344,
            'vocab': 250880,
            'seq_len': 2048,
            'params_b': 176.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 384,
              'gpus_per_node': 8,
              'interconnect': 'Jean Zay: NVLink intra-node, 4x Omni-Path (OPA) links per node'},
  'parallel': {'tp': 4,
               'pp': 12,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 2048,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'zero1',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 149.77,
               'mfu': None,
               'step_time_s': 104.7,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Megatron-DeepSpeed/BigScience: hardware TFLOPs with activation recompute '
                                 "counted ('4*2' coefficient instead of '3*2' model-FLOP coefficient), i.e. "
                                 '~ 8*N*tokens/(time*GPUs) plus attention term; A100 peak 312'},
  'notes': 'Production BLOOM-176B run on Megatron-DeepSpeed: TP=4, PP=12, DP=8 on 384 A100-80GB (48 nodes). '
           "Log: GBS 2048, 104.70 s/iteration, 19.561 samples/s, 149.77 TFLOPs. MBS=2 per 'Replica setup' "
           "(switched from MBS 1 to 2 at GBS~784; the later 'Update' note says training started at GBS "
           '192/MBS 1) - MBS at this iteration inferred, not in the log line. BF16_Optimizer = own ZeRO '
           'stage 1 (DeepSpeed ZeRO stage set 0); DeepSpeed activation checkpointing; ALiBi; embedding '
           "layernorm; tied embeddings partitioned as pipeline stages ('type:transformer|embedding'). Vocab "
           "250,680 tokens padded to 250,880 in the embedding. 'Times' section: ~100 s/iteration."},
 {'id': 'bloom176b-gbs16-rampup',
  'source': 'bloom-176b',
  'cite': 'https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml/README.md, '
          "section 'Global batch size' (measured log line, iteration 3707)",
  'model': {'family': 'gpt',
            'layers': 70,
            'hidden': 14336,
            'heads': 112,
            'kv_heads': 112,
            'ffn_hidden': 57344,
            'vocab': 250880,
            'seq_len': 2048,
            'params_b': 176.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 384,
              'gpus_per_node': 8,
              'interconnect': 'Jean Zay: NVLink intra-node, 4x Omni-Path (OPA) links per node'},
  'parallel': {'tp': 4,
               'pp': 12,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 2,
               'global_batch': 16,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'zero1',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 8.04,
               'mfu': None,
               'step_time_s': 15.23,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Megatron-DeepSpeed/BigScience: hardware TFLOPs with activation recompute '
                                 "counted ('4*2' coefficient instead of '3*2' model-FLOP coefficient), i.e. "
                                 '~ 8*N*tokens/(time*GPUs) plus attention term; A100 peak 312'},
  'notes': 'Batch-size ramp-up regime measured on the same 384-GPU TP4/PP12/DP8 setup: GBS 16 with MBS 2 (so '
           'one microbatch per replica, pipeline essentially unfilled), 15.23 s/iteration, 1.051 samples/s, '
           '8.04 TFLOPs. Useful as an extreme pipeline-bubble data point.'},
 {'id': 'bloom176b-gbs192-mbs1',
  'source': 'bloom-176b',
  'cite': 'https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml/README.md, '
          "section 'Global batch size', 'Update' paragraph",
  'model': {'family': 'gpt',
            'layers': 70,
            'hidden': 14336,
            'heads': 112,
            'kv_heads': 112,
            'ffn_hidden': 57344,
            'vocab': 250880,
            'seq_len': 2048,
            'params_b': 176.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 384,
              'gpus_per_node': 8,
              'interconnect': 'Jean Zay: NVLink intra-node, 4x Omni-Path (OPA) links per node'},
  'parallel': {'tp': 4,
               'pp': 12,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': 1,
               'global_batch': 192,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'zero1',
               'precision': 'bf16'},
  'measured': {'tflops_per_gpu': 73.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': None,
               'memory_gib': None,
               'flops_counting': 'Megatron-DeepSpeed/BigScience: hardware TFLOPs with activation recompute '
                                 "counted ('4*2' coefficient instead of '3*2' model-FLOP coefficient), i.e. "
                                 '~ 8*N*tokens/(time*GPUs) plus attention term; A100 peak 312'},
  'notes': 'Update note: training actually started at GBS=192 / MBS=1 at 73 TFLOPs (vs 8 TFLOPs for GBS 16 / '
           'MBS 2). Iteration time not given; 73 is a rounded statement, not a log line.'}]

CP_ROWS: list[dict] = [{'id': 'torchtitan-dec24-t2-8b-cp1-seq32k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 2',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 32768,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 8,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 1},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 3890.0,
               'memory_gib': 83.9,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 8 x CP 1 on 8 GPUs, torch.compile + Float8, full AC, local batch 1 (global batch = FSDP '
           'degree, derived). Sequence length as published.'},
 {'id': 'torchtitan-dec24-t2-8b-cp2-seq64k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 2',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 65536,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 4,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 4,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 2540.0,
               'memory_gib': 84.2,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 4 x CP 2 on 8 GPUs, torch.compile + Float8, full AC, local batch 1 (global batch = FSDP '
           'degree, derived). Sequence length as published.'},
 {'id': 'torchtitan-dec24-t2-8b-cp4-seq128k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 2',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 131072,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 2,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 2,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 4},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1071.0,
               'memory_gib': 84.0,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 2 x CP 4 on 8 GPUs, torch.compile + Float8, full AC, local batch 1 (global batch = FSDP '
           'degree, derived). Sequence length as published.'},
 {'id': 'torchtitan-dec24-t2-8b-cp8-seq256k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 2',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 262144,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 1,
               'sequence_parallel': None,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 8},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 548.0,
               'memory_gib': 84.5,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 1 x CP 8 on 8 GPUs, torch.compile + Float8, full AC, local batch 1 (global batch = FSDP '
           'degree, derived). Sequence length as published.'},
 {'id': 'torchtitan-dec24-t6-405b-cp1-seq32k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 6',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 32768,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 64,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 1},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 76.0,
               'memory_gib': 75.3,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 8 x CP 1 x TP 8 x PP 8 = 512 GPUs, torch.compile + Float8 + AsyncTP + 1F1B, full AC, local '
           'batch 8 (global batch = 8 x FSDP degree, derived). Memory max across GPUs.'},
 {'id': 'torchtitan-dec24-t6-405b-cp2-seq64k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 6',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 65536,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 4,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 32,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 47.0,
               'memory_gib': 75.9,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 4 x CP 2 x TP 8 x PP 8 = 512 GPUs, torch.compile + Float8 + AsyncTP + 1F1B, full AC, local '
           'batch 8 (global batch = 8 x FSDP degree, derived). Memory max across GPUs.'},
 {'id': 'torchtitan-dec24-t6-405b-cp4-seq128k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 6',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 131072,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 2,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 16,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 4},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 31.0,
               'memory_gib': 77.1,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 2 x CP 4 x TP 8 x PP 8 = 512 GPUs, torch.compile + Float8 + AsyncTP + 1F1B, full AC, local '
           'batch 8 (global batch = 8 x FSDP degree, derived). Memory max across GPUs.'},
 {'id': 'torchtitan-dec24-t6-405b-cp8-seq256k',
  'source': 'torchtitan',
  'cite': 'https://github.com/pytorch/torchtitan/blob/main/docs/performance.md, Table 6',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 262144,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-96GB-HBM2e-500W',
              'num_gpus': 512,
              'gpus_per_node': 8,
              'interconnect': 'Grand Teton: 8x H100 per host fully NVLink-connected; backend RDMA 400 Gb/s '
                              'per GPU'},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': None,
               'global_batch': 8,
               'sequence_parallel': True,
               'recompute': 'full',
               'zero': 'fsdp',
               'precision': 'fp8',
               'cp': 8},
  'measured': {'tflops_per_gpu': None,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 16.0,
               'memory_gib': 84.9,
               'flops_counting': 'torchtitan MetricsProcessor: TPS = tokens/s per GPU (tokens / time / '
                                 'non-data-parallel size); MFU (when given) = (6*(N - N_embedding) + '
                                 '12*L*H*head_dim*S) * TPS / peak (PaLM-style, no recompute FLOPs); memory = '
                                 "torch.cuda 'reserved_bytes.all.peak' (max reserved) in GiB"},
  'notes': 'Model dims from torchtitan llama3_configs (8B: dim 4096, 32 layers, 32 heads, 8 kv; 70B: '
           '8192/80/64/8; 405B: 16384/126/128/8); ffn computed from ffn_dim_multiplier/multiple_of '
           '(14336/28672/53248); vocab 128256 = Llama 3 tiktoken tokenizer (not stated on the perf page). '
           'FSDP 1 x CP 8 x TP 8 x PP 8 = 512 GPUs, torch.compile + Float8 + AsyncTP + 1F1B, full AC, local '
           'batch 8 (global batch = 8 x FSDP degree, derived). Memory max across GPUs.'},
 {'id': 'nemo2407-h100-fp8-llama3-8b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn_hidden': 14336,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 8.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 1,
               'pp': 1,
               'dp': 4,
               'virtual_stages': 1,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 697.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 12036.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Uses context parallelism CP=2, dp = GPUs/(TP*PP*CP) (derived). Recompute/SP/optimizer sharding '
           'not stated. Llama 3 dims standard (NeMo Llama3Config8B/70B).'},
 {'id': 'nemo2407-h100-fp8-llama3-70b',
  'source': 'nemo-perf-summary',
  'cite': 'https://github.com/NVIDIA/NeMo/blob/main/docs/source/performance/performance_summary.md (NeMo '
          '24.07 container, DGX-H100, FP8)',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn_hidden': 28672,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 70.0},
  'cluster': {'gpu': 'H100-SXM-80GB',
              'num_gpus': 64,
              'gpus_per_node': 8,
              'interconnect': 'DGX-H100: 8x H100-SXM-80GB per node, NVLink/NVSwitch; inter-node IB (not '
                              'restated on page)'},
  'parallel': {'tp': 4,
               'pp': 4,
               'dp': 2,
               'virtual_stages': 5,
               'micro_batch': 1,
               'global_batch': 128,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 738.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 1533.0,
               'memory_gib': None,
               'flops_counting': "NeMo/Megatron 'Model TFLOP/sec/GPU' = model FLOPs (no recompute) per step "
                                 '/ step time / #GPUs; exact formula not restated on the page. '
                                 'Tokens/sec/GPU = GBS*seq/(step_time*#GPUs). MFU not given (FP8)'},
  'notes': 'Uses context parallelism CP=2, dp = GPUs/(TP*PP*CP) (derived). Recompute/SP/optimizer sharding '
           'not stated. Llama 3 dims standard (NeMo Llama3Config8B/70B).'},
 {'id': 'mbridge2602-h100-l31-405b-fp8',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '26.02, Model: LLAMA3.1_405B'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 1024, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': 8,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 784.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 311.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100, context parallel CP=2, FSDP=0; dp = GPUs/(TP*PP*CP) = 8 (derived). '
           'Recompute/SP/optimizer sharding not on the page. Precision fp8.'},
 {'id': 'mbridge2511-h100-l31-405b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 1024, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': 8,
               'micro_batch': 1,
               'global_batch': 512,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 737.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 292.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100, context parallel CP=2, FSDP=0; dp = GPUs/(TP*PP*CP) = 8 (derived). '
           'Recompute/SP/optimizer sharding not on the page. Precision fp8.'},
 {'id': 'mbridge2509-h100-l31-405b',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary-archive.md, '
          "section '25.09, System: DGX-H100'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'H100-SXM-80GB', 'num_gpus': 1024, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 8,
               'pp': 8,
               'dp': 8,
               'virtual_stages': 8,
               'micro_batch': 1,
               'global_batch': 512,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': None,
               'cp': 2},
  'measured': {'tflops_per_gpu': 763.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 302.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-H100, context parallel CP=2, FSDP=0; dp = GPUs/(TP*PP*CP) = 8 (derived). '
           'Recompute/SP/optimizer sharding not on the page. Precision column absent (25.09), not pinned.'},
 {'id': 'mbridge2511-b200-l31-405b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11, System: DGX-B200'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'B200', 'num_gpus': 128, 'gpus_per_node': 8, 'interconnect': None},
  'parallel': {'tp': 4,
               'pp': 8,
               'dp': 2,
               'virtual_stages': 8,
               'micro_batch': 1,
               'global_batch': 64,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 1667.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 661.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-B200, context parallel CP=2, FSDP=0; dp = GPUs/(TP*PP*CP) = 2 (derived). '
           'Recompute/SP/optimizer sharding not on the page. Precision fp8.'},
 {'id': 'mbridge2511-gb300-l31-405b-fp8cs',
  'source': 'megatron-bridge-perf-summary',
  'cite': 'https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/performance-summary.md, section '
          "'25.11, System: DGX-GB300'",
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn_hidden': 53248,
            'vocab': 128256,
            'seq_len': 8192,
            'params_b': 405.0},
  'cluster': {'gpu': 'GB300', 'num_gpus': 256, 'gpus_per_node': None, 'interconnect': None},
  'parallel': {'tp': 2,
               'pp': 8,
               'dp': 8,
               'virtual_stages': 4,
               'micro_batch': 1,
               'global_batch': 1536,
               'sequence_parallel': None,
               'recompute': None,
               'zero': None,
               'precision': 'fp8',
               'cp': 2},
  'measured': {'tflops_per_gpu': 2522.0,
               'mfu': None,
               'step_time_s': None,
               'tokens_per_s_per_gpu': 999.0,
               'memory_gib': None,
               'flops_counting': "Megatron-Bridge 'Model TFLOP/sec/GPU' = model FLOPs per step / step time / "
                                 '#GPUs (no recompute FLOPs); Tokens/sec/GPU per GPU. MFU not given'},
  'notes': 'DGX-GB300, context parallel CP=2, FSDP=0; dp = GPUs/(TP*PP*CP) = 8 (derived). '
           'Recompute/SP/optimizer sharding not on the page. Precision fp8.'}]

LAYER_TIMES: list[dict] = [{'id': 'korthikanti22-t4-22b-baseline-no-recompute',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Table 4 (time of one transformer layer of the 22B model)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': False,
               'recompute': 'none',
               'zero': 'none',
               'precision': None},
  'experiment': 'Baseline no recompute',
  'forward_ms': 7.7,
  'backward_ms': 11.9,
  'combined_ms': 19.6,
  'overhead_pct': None,
  'notes': 'Per single transformer layer, fwd/bwd wall time in ms (backward includes any recompute). Config '
           'of the 22B model in Table 3 (tp=8, micro-batch 4).'},
 {'id': 'korthikanti22-t4-22b-sequence-parallelism',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Table 4 (time of one transformer layer of the 22B model)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': True,
               'recompute': 'none',
               'zero': 'none',
               'precision': None},
  'experiment': 'Sequence Parallelism',
  'forward_ms': 7.2,
  'backward_ms': 11.8,
  'combined_ms': 19.0,
  'overhead_pct': -3,
  'notes': 'Per single transformer layer, fwd/bwd wall time in ms (backward includes any recompute). Config '
           'of the 22B model in Table 3 (tp=8, micro-batch 4).'},
 {'id': 'korthikanti22-t4-22b-baseline-with-recompute',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Table 4 (time of one transformer layer of the 22B model)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': False,
               'recompute': 'full',
               'zero': 'none',
               'precision': None},
  'experiment': 'Baseline with recompute',
  'forward_ms': 7.7,
  'backward_ms': 19.5,
  'combined_ms': 27.2,
  'overhead_pct': 39,
  'notes': 'Per single transformer layer, fwd/bwd wall time in ms (backward includes any recompute). Config '
           'of the 22B model in Table 3 (tp=8, micro-batch 4).'},
 {'id': 'korthikanti22-t4-22b-selective-recompute',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Table 4 (time of one transformer layer of the 22B model)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': False,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'experiment': 'Selective Recompute',
  'forward_ms': 7.7,
  'backward_ms': 13.2,
  'combined_ms': 20.9,
  'overhead_pct': 7,
  'notes': 'Per single transformer layer, fwd/bwd wall time in ms (backward includes any recompute). Config '
           'of the 22B model in Table 3 (tp=8, micro-batch 4).'},
 {'id': 'korthikanti22-t4-22b-selective-sequence',
  'source': 'korthikanti-2022',
  'cite': 'Korthikanti et al., arXiv:2205.05198, Table 4 (time of one transformer layer of the 22B model)',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 6144,
            'heads': 64,
            'kv_heads': 64,
            'ffn_hidden': 24576,
            'vocab': 51200,
            'seq_len': 2048,
            'params_b': 22.0},
  'cluster': {'gpu': 'A100-80GB',
              'num_gpus': 8,
              'gpus_per_node': 8,
              'interconnect': 'DGX A100 (Selene): NVLink/NVSwitch intra-node, 8x 200Gb/s HDR InfiniBand per '
                              'node, fat-tree'},
  'parallel': {'tp': 8,
               'pp': 1,
               'dp': 1,
               'virtual_stages': None,
               'micro_batch': 4,
               'global_batch': 4,
               'sequence_parallel': True,
               'recompute': 'selective',
               'zero': 'none',
               'precision': None},
  'experiment': 'Selective + Sequence',
  'forward_ms': 7.2,
  'backward_ms': 13.1,
  'combined_ms': 20.3,
  'overhead_pct': 4,
  'notes': 'Per single transformer layer, fwd/bwd wall time in ms (backward includes any recompute). Config '
           'of the 22B model in Table 3 (tp=8, micro-batch 4).'}]

UNPINNED: list[str] = ["NVIDIA/Megatron-LM README (current, 'Training Speed and Scalability'): the H100 weak-scaling model table "
 '(2B-462B, vocab 131072, seq 4096, up to 6144 H100) and strong-scaling plot (GPT-3 175B, 96->4608 H100, GBS '
 '1152, MFU 47%->42%) are images (images/model_table.png, weak_scaling.png, strong_scaling.png); per-row '
 'TP/PP/DP and TFLOP/s are not in text, so no rows. Text-only facts: MFU 41% (smallest) to 47-48% (largest).',
 'NVIDIA/Megatron-LM README (2022 version): MFU/HFU table for 22B/175B/530B/1T (41.5/43.7, 51.4/52.8, '
 '56.0/57.0, 56.3/57.0) - identical to Korthikanti Table 5, used only as corroboration (no duplicate rows). '
 'Its A100 weak-scaling graph (images/Achieved_petaFLOPs.png) is an image.',
 'Narayanan 2021 Figures 7, 8, 11-18 (microbatch sweeps, (t,p) sweeps on 64 GPUs for 162.2B, '
 'pipeline/interleaved scaling, recompute, scatter/gather): values only readable from plots (third-party '
 'notes give ~approximations) - not entered. Sec. 5.8 fused-operator text numbers (175B 113->135, 530B '
 "133->148 TFLOP/s) lack a stated configuration. The '175B on 1024 GPUs at 140 TFLOP/s -> 34 days' figure is "
 'an estimate, not a measurement.',
 'Korthikanti 2022 Figures 7-9 (activation memory %, per-layer fwd/bwd/recompute breakdown for all sizes, '
 'per-PP-rank memory): plot-only, not entered. Table 4 per-layer times are in LAYER_TIMES, not ROWS.',
 'torchtitan paper (arXiv 2410.06511): in the copy we could read (a Chinese translation, Elvin-Ma/ai_papers) '
 'the result tables are images; the Dec-2024 numbers were taken from torchtitan docs/performance.md and '
 "benchmarks/llama3_h100_202412_torchtitan.md instead. Whether the paper's own tables (v1 2024) differ from "
 'the Dec-2024 docs was not checked.',
 'torchtitan 405B-on-128-H100 table footnotes [^1]/[^2] (on the MFU column) could not be read; the MFU '
 'values there may use different peak conventions for bf16 vs Float8 rows.',
 'mosaicml llm-foundry benchmarking README: only 29 of ~150 rows entered (bias to >=1B params, seq 2048, '
 "plus a few long-seq and one fp8 row). Several 70B/PURE rows have a 'Model TFLOP' column ~100x too large "
 '(left None).',
 'NeMo 24.07 performance_summary.md fine-tuning rows (SFT/LoRA) - not pre-training, excluded. Other versions '
 'of that page (6 stored versions) and performance_long_sequence.md (CP sweeps, TFLOP/s only, partly garbled '
 'table) not used.',
 'Megatron-Bridge performance summaries: MoE rows (DeepSeek-V3, Qwen3-30B-A3B/235B-A22B, GPT-OSS-120B) '
 'excluded (MoE/expert parallelism out of scope); MXFP8/NVFP4 and FP8-MX (parenthesised) variants of dense '
 'rows omitted; 25.09 GB200 rows with alternative configs in parentheses omitted.',
 "BLOOM-176B: the '113 TFLOPs at iteration 512' and the '~150 TFLOPs' run-time estimate are not tied to a "
 'pinned configuration/log line - not entered beyond the three rows.',
 "Not searched in depth (time budget): Galvatron / Galvatron-BMW papers, Mist (EuroSys'25), MLPerf Training "
 "GPT-3 submissions, ZeRO/DeepSpeed papers, OPT-175B logbook, Llama 2/3 papers' MFU statements, MT-NLG 530B "
 'paper.',
 "Secondary summaries (bzhng-development paper summaries, 'AI research skills' docs claiming e.g. GPT-3 175B "
 'TP=4 PP=8 390 TFLOP/s on H100) were not used as sources - unverifiable/LLM-written.']
