"""kernel_costs: the bytes each kernel reads and writes, against hand counts (fp32 = 4 bytes)."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from galvatron_fx.passes.kernel_costs import CostCounter

B, T, C, H, D, V = 2, 8, 16, 2, 8, 32
F32, I64 = 4, 8


def _count(fn, grad_of=()):
    """(forward bytes, backward bytes, forward FLOPs) of ``fn`` on fake tensors."""
    with CostCounter() as fc:
        out = fn()
    bwd = 0
    if grad_of:
        with CostCounter() as bc:
            torch.autograd.grad(out, grad_of, torch.empty_like(out))
        bwd = bc.bytes
    return fc.bytes, bwd, fc.flops


@pytest.fixture
def fake():
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def leaf(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, requires_grad=dtype.is_floating_point)


def test_matmul(fake):
    x, w, b = leaf(B, T, C), leaf(4 * C, C), leaf(4 * C)
    m, k, n = B * T, C, 4 * C
    fwd, bwd, flops = _count(lambda: F.linear(x, w), (x, w))
    assert fwd == F32 * (m * k + k * n + m * n)  # the weight's transpose is a view: read once
    assert bwd == 2 * F32 * (m * n + k * n + m * k)  # grad_x = g @ w, grad_w = g^T @ x
    assert flops == 2 * m * k * n
    fwd, _, _ = _count(lambda: F.linear(x, w, b), ())
    assert fwd == F32 * (m * k + k * n + m * n + n)  # addmm reads the bias once


def test_layer_norm(fake):
    x, w, b = leaf(B, T, C), leaf(C), leaf(C)
    fwd, bwd, _ = _count(lambda: F.layer_norm(x, (C,), w, b), (x, w, b))
    # reads x, w, b; writes y and the per-row mean and rstd
    assert fwd == F32 * (B * T * C + 2 * C + B * T * C + 2 * B * T)
    # reads dy, x, mean, rstd, w, b; writes dx, dw, db
    assert bwd == F32 * (2 * B * T * C + 2 * B * T + 2 * C + B * T * C + 2 * C)


def test_softmax(fake):
    x = leaf(B, H, T, T)
    fwd, bwd, _ = _count(lambda: torch.softmax(x, -1), (x,))
    n = B * H * T * T
    assert (fwd, bwd) == (2 * F32 * n, 3 * F32 * n)  # y = f(x); dx = f(dy, y)


def test_flash_attention(fake):
    q, k, v = leaf(B, H, T, D), leaf(B, H, T, D), leaf(B, H, T, D)
    fwd, bwd, flops = _count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v))
    n, rows = B * H * T * D, B * H * T
    assert fwd == F32 * (3 * n + n + rows)  # reads q, k, v; writes out and the log-sum-exp
    assert bwd == F32 * (5 * n + rows + 3 * n)  # reads dout, q, k, v, out, lse; writes dq, dk, dv
    assert flops == 4 * B * H * T * T * D


def test_math_attention_reads_a_broadcast_mask_once(fake):
    s = leaf(B, H, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    fwd, _, _ = _count(lambda: s.masked_fill((~mask).expand(B, H, T, T), float("-inf")), ())
    # ~ reads and writes the T*T mask; masked_fill reads the scores and the broadcast mask's
    # T*T distinct values, and writes the scores
    n = B * H * T * T
    assert fwd == 2 * T * T + (F32 * n + T * T + F32 * n)


def test_embedding_gathers_rows(fake):
    table, idx = leaf(V, C), torch.zeros(B, T, dtype=torch.long)
    fwd, bwd, _ = _count(lambda: F.embedding(idx, table), (table,))
    rows = B * T * C
    assert fwd == I64 * B * T + 2 * F32 * rows  # indices, the gathered rows, the output
    assert bwd == F32 * V * C + 2 * F32 * rows + I64 * B * T  # zero-filled table + scattered rows


def test_cross_entropy(fake):
    logits, target = leaf(B * T, V), torch.zeros(B * T, dtype=torch.long)
    fwd, bwd, _ = _count(lambda: F.cross_entropy(logits, target), (logits,))
    n, nv = B * T, B * T * V
    # log_softmax reads/writes the logits; nll_loss reads the targets and one value per target,
    # writes the loss and the total weight
    assert fwd == 2 * F32 * nv + (I64 * n + F32 * n + 2 * F32)
    # nll_loss_backward writes the whole gradient from the targets; log_softmax's reads 2, writes 1
    assert bwd == (F32 * nv + F32 + I64 * n + F32) + 3 * F32 * nv


def test_metadata_views_and_allocations_move_nothing(fake):
    x = leaf(B, T, C)
    for fn in (lambda: x.view(B * T, C), lambda: x.t() if x.ndim == 2 else x.transpose(0, 1),
               lambda: x.expand(3, B, T, C), lambda: torch.empty_like(x), lambda: x.detach()):
        assert _count(fn)[0] == 0
    assert _count(lambda: torch.zeros_like(x))[0] == F32 * B * T * C  # written, not read
    y = leaf(B, T, C)
    with torch.no_grad():
        assert _count(lambda: y.copy_(x))[0] == 2 * F32 * B * T * C  # src read, dst written
        assert _count(lambda: y.add_(x))[0] == 3 * F32 * B * T * C  # self read and written


def test_bf16_bytes_are_halved(fake):
    x, w = leaf(B, T, C, dtype=torch.bfloat16), leaf(4 * C, C, dtype=torch.bfloat16)
    x32, w32 = leaf(B, T, C), leaf(4 * C, C)
    assert 2 * _count(lambda: F.linear(x, w))[0] == _count(lambda: F.linear(x32, w32))[0]
