"""Arithmetic of the per-rank memory model (``galvatron_fx.cost_models.memory``), one process.

The model against measured memory is ``tests/dist/test_memory_model.py``.
"""

from __future__ import annotations

import math

import pytest

from galvatron_fx.cost_models.memory import (
    LayerMemory,
    TPShard,
    layer_memory,
    sharded_numel,
    stage_peak_bytes,
)
from galvatron_fx.ir.graph import LayerCosts, ParamInfo
from galvatron_fx.ir.strategy import LayerStrategy, Precision


def _param(name: str, shape: tuple[int, ...], *, buffer: bool = False, requires_grad: bool = True) -> ParamInfo:
    numel = math.prod(shape)
    return ParamInfo(name=name, node=name, shape=shape, dtype="float32", numel=numel, nbytes=4 * numel,
                     is_buffer=buffer, requires_grad=requires_grad and not buffer)


# a block-like layer: (96, 32) weight + (96,) bias = 3168 params; a rotary buffer it also reads
PARAMS = [_param("w", (96, 32)), _param("b", (96,))]
NUMEL = 96 * 32 + 96
COSTS = LayerCosts(num_params=NUMEL, param_bytes=4 * NUMEL, activation_bytes=40_000,
                   activation_bytes_selective=24_000, activation_bytes_full=8_000)


def mem(dp_type: str = "ddp", recompute: str = "none", *, dp: int = 4, micro_batch: float = 8,
        captured_batch: int = 8, params=PARAMS, **kw) -> LayerMemory:
    return layer_memory(COSTS, LayerStrategy(dp_type=dp_type, recompute=recompute), dp=dp,
                        micro_batch=micro_batch, captured_batch=captured_batch, params=params, **kw)


def test_ddp_keeps_everything_whole() -> None:
    m = mem("ddp")
    assert (m.param_bytes, m.grad_bytes, m.optimizer_bytes) == (4 * NUMEL, 4 * NUMEL, 8 * NUMEL)
    assert m.unsharded_param_bytes == 0
    assert m.temp_bytes == 0  # no gathered params, no unsharded grads, no recompute


def test_persistent_bytes_order_ddp_zero2_zero3() -> None:
    ddp, z2, z3 = mem("ddp"), mem("zero2"), mem("zero3")
    assert ddp.persistent_bytes > z2.persistent_bytes > z3.persistent_bytes
    # ZeRO-2 keeps the gathered copy between forward and backward; ZeRO-3 only while running
    assert z2.unsharded_param_bytes == 4 * NUMEL and z3.unsharded_param_bytes == 0
    assert z3.temp_bytes > z2.temp_bytes  # ZeRO-3 gathers (this layer + prefetched) in temp
    assert z3.temp_bytes == 4 * NUMEL + 2 * 4 * NUMEL  # unsharded grads + two gathered copies


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
@pytest.mark.parametrize("dp_type", ["zero2", "zero3"])
def test_sharding_divides_by_dp(dp: int, dp_type: str) -> None:
    m = mem(dp_type, dp=dp)  # 96 rows divide by every dp here: no padding
    assert m.param_bytes == 4 * NUMEL // dp
    assert m.grad_bytes == 4 * NUMEL // dp
    assert m.optimizer_bytes == 8 * NUMEL // dp
    if dp == 1:  # nothing to shard: same as DDP
        assert m == mem("ddp", dp=1)


def test_fsdp_pads_dim0_per_parameter() -> None:
    assert sharded_numel((10, 3), 4) == 3 * 3  # ceil(10 / 4) rows
    assert sharded_numel((8, 3), 4) == 2 * 3
    assert sharded_numel((5,), 2) == 3
    assert sharded_numel((5,), 1) == 5
    assert sharded_numel((), 4) == 1
    # (10, 3) + (5,) over 4 ranks: 3 rows of 3 + 2 elements = 11, not (30 + 5) / 4 = 8.75
    params = [_param("w", (10, 3)), _param("b", (5,))]
    costs = LayerCosts(num_params=35, param_bytes=140)
    z3 = layer_memory(costs, LayerStrategy(dp_type="zero3"), dp=4, micro_batch=1, captured_batch=1,
                      params=params)
    assert (z3.param_bytes, z3.grad_bytes, z3.optimizer_bytes) == (4 * 11, 4 * 11, 8 * 11)
    # without the parameters' shapes the model can only divide
    plain = layer_memory(costs, LayerStrategy(dp_type="zero3"), dp=4, micro_batch=1, captured_batch=1)
    assert plain.param_bytes == int(4 * 35 / 4)
    # the gathered copy is unpadded
    z2 = layer_memory(costs, LayerStrategy(dp_type="zero2"), dp=4, micro_batch=1, captured_batch=1,
                      params=params)
    assert z2.unsharded_param_bytes == 4 * 35


def test_params_are_the_count_buffers_and_frozen_skipped() -> None:
    # costs.num_params counts buffers and tied parameters of every reader: with ``params`` given,
    # only the trainable parameters handed to this layer count, under every flavour
    costs = LayerCosts(num_params=NUMEL + 1000, param_bytes=4 * (NUMEL + 1000))
    params = PARAMS + [_param("rope", (10, 100), buffer=True), _param("frozen", (7,), requires_grad=False)]
    for dp_type in ("ddp", "zero2", "zero3"):
        m = layer_memory(costs, LayerStrategy(dp_type=dp_type), dp=2, micro_batch=1, captured_batch=1,
                         params=params)
        want = mem(dp_type, dp=2, micro_batch=1, captured_batch=1)
        got = (m.param_bytes, m.unsharded_param_bytes, m.grad_bytes, m.optimizer_bytes)
        assert got == (want.param_bytes, want.unsharded_param_bytes, want.grad_bytes, want.optimizer_bytes), dp_type
    # a layer that owns no parameter (its tied weight charged elsewhere) has none
    none = layer_memory(costs, LayerStrategy(), dp=2, micro_batch=1, captured_batch=1, params=[])
    assert (none.param_bytes, none.grad_bytes, none.optimizer_bytes) == (0, 0, 0)
    # without ``params`` the costs' count is used
    assert layer_memory(costs, LayerStrategy(), dp=2, micro_batch=1, captured_batch=1).param_bytes == 4 * (NUMEL + 1000)


def test_recompute_lowers_activations_and_adds_temp() -> None:
    none, sel, full = mem(recompute="none"), mem(recompute="selective"), mem(recompute="full")
    assert (none.activation_bytes, sel.activation_bytes, full.activation_bytes) == (40_000, 24_000, 8_000)
    # what is not kept comes back while the layer's backward runs
    assert (none.temp_bytes, sel.temp_bytes, full.temp_bytes) == (0, 16_000, 32_000)
    for m in (sel, full):
        assert m.activation_bytes + m.temp_bytes == none.activation_bytes
        assert m.persistent_bytes == none.persistent_bytes


def test_activations_scale_with_micro_batch_and_dtype() -> None:
    assert mem(micro_batch=2, captured_batch=8).activation_bytes == 10_000
    assert mem(micro_batch=16, captured_batch=8).activation_bytes == 80_000
    bf16 = mem(precision=Precision.bf16())
    assert bf16.activation_bytes == 20_000
    # fp32 master parameters, grads and AdamW states under bf16; the gathered copy is bf16
    assert (bf16.param_bytes, bf16.grad_bytes, bf16.optimizer_bytes) == (4 * NUMEL, 4 * NUMEL, 8 * NUMEL)
    assert mem("zero2", precision=Precision.bf16()).unsharded_param_bytes == 2 * NUMEL


def test_stage_peak_counts_in_flight_micro_batches() -> None:
    a = mem("ddp", "none")
    b = mem("zero2", "full")
    assert stage_peak_bytes([], 3) == 0
    assert stage_peak_bytes([a], 1) == a.peak_bytes(1)
    for in_flight in (1, 2, 4):
        want = (a.persistent_bytes + b.persistent_bytes
                + in_flight * (a.activation_bytes + b.activation_bytes)
                + max(a.temp_bytes, b.temp_bytes))  # temps are transient: only the largest counts
        assert stage_peak_bytes([a, b], in_flight) == want
    assert stage_peak_bytes([a, b], 4) - stage_peak_bytes([a, b], 1) == 3 * (a.activation_bytes + b.activation_bytes)


def test_tensor_parallel_needs_a_shard() -> None:
    with pytest.raises(ValueError, match="tp=2 needs the tensor-parallel shard"):
        layer_memory(COSTS, LayerStrategy(tp=2), dp=1, micro_batch=8, captured_batch=8)
    shard = TPShard(param_fraction=0.5, activation_fraction=(0.5, 0.5, 1.0))
    m = layer_memory(COSTS, LayerStrategy(tp=2), dp=1, micro_batch=8, captured_batch=8, tp_shard=shard,
                     params=PARAMS)
    assert m.param_bytes == 4 * NUMEL // 2 and m.activation_bytes == 20_000


def test_dp_must_be_positive() -> None:
    with pytest.raises(ValueError, match="dp must be >= 1"):
        mem(dp=0)


def test_backward_temp_scales_like_activations() -> None:
    m = mem(micro_batch=4, captured_batch=8, backward_temp_bytes=6_000)
    assert m.temp_bytes == 3_000 and m.activation_bytes == 20_000
    assert mem("zero3", backward_temp_bytes=6_000).temp_bytes == mem("zero3").temp_bytes + 6_000


def test_with_one_micro_batch_gradients_appear_as_activations_are_freed() -> None:
    # three layers in forward order; the backward runs from the last to the first
    layers = [LayerMemory(param_bytes=10, grad_bytes=10, optimizer_bytes=20, activation_bytes=a, temp_bytes=t)
              for a, t in ((100, 5), (100, 5), (1, 50))]
    fixed = 3 * (10 + 20)
    held = stage_peak_bytes(layers, 1)
    assert held == fixed + 3 * 10 + 201 + 50  # accumulation: every gradient all along, the largest temp
    # no accumulation: the last layer's backward runs with every activation and no gradient yet
    assert stage_peak_bytes(layers, 1, grads_held=False) == fixed + 201 + 50
    # gradients that outweigh the activations: the peak is at the end of the backward, all made
    big = [LayerMemory(grad_bytes=500, activation_bytes=10), LayerMemory(grad_bytes=0, activation_bytes=10)]
    assert stage_peak_bytes(big, 1, grads_held=False) == 500
    assert stage_peak_bytes(big, [3, 1], grads_held=False) == 500  # in-flight counts per layer
    assert stage_peak_bytes(big, [3, 1]) == 500 + 40
