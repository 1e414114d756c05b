"""The biased-attention op (a trained attention bias as one op): values and gradients equal
PyTorch's math attention, for a full and a broadcast bias; captured graphs route SDPA with a
bias that requires grad through it, and the decomposed layer holds it as one node."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from galvatron_fx.ops.attention import sdpa_or_biased


@pytest.mark.parametrize("bias_shape", [(2, 3, 5, 5), (1, 3, 5, 5), (2, 1, 5, 5)])
def test_biased_attention_equals_math_attention(bias_shape):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(*bias_shape, generator=g, requires_grad=True)
    out = sdpa_or_biased(q, k, v, bias)
    w = torch.randn(out.shape, generator=g)
    (out * w).sum().backward()
    got = [out.detach()] + [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    ref = F.softmax(q @ k.transpose(-2, -1) / 2.0 + bias, dim=-1) @ v
    (ref * w).sum().backward()
    want = [ref.detach()] + [t.grad for t in (q, k, v, bias)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_bias_without_grad_keeps_the_kernel():
    q = k = v = torch.randn(1, 2, 4, 8)
    mask = torch.zeros(1, 1, 4, 4)
    torch.testing.assert_close(sdpa_or_biased(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_t5_layers_decompose_to_one_biased_attention_node():
    hf_tiny = pytest.importorskip("hf_tiny")
    pytest.importorskip("transformers")
    import galvatron_fx as gfx
    from galvatron_fx.passes.decompose_layer import decompose_layer

    model, batch = hf_tiny.build("t5")
    mg = gfx.capture(model, (), example_kwargs=batch)
    block = mg.blocks()[0]
    ops = [str(n.target) for n in decompose_layer(mg, block).gm.graph.nodes if n.op == "call_function"]
    assert ops.count("galvatron_fx.biased_attention.default") == 1
    assert not any("bmm" in o or "_safe_softmax" in o for o in ops)
