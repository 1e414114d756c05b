"""``galvatron-fx export``: a checkpoint's trained weights as safetensors or a Hugging Face
directory (:func:`galvatron_fx.runtime.weights.export_checkpoint`)."""

from __future__ import annotations

from galvatron_fx.runtime.weights import export_checkpoint


def run_cli(args) -> int:
    """``galvatron-fx export CKPT --out model.safetensors [--hf-dir DIR --hf-config C]``."""
    state = export_checkpoint(args.checkpoint, out=args.out, hf_dir=args.hf_dir, hf_config=args.hf_config,
                              overwrite=args.overwrite)
    n = sum(t.numel() for t in state.values())
    wrote = " and ".join(str(p) for p in (args.out, args.hf_dir) if p is not None)
    print(f"exported {len(state)} tensors ({n / 1e6:.2f} M values) from {args.checkpoint} to {wrote}")
    return 0
