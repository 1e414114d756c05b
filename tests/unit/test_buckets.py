"""Bucket planning for fused data-parallel gradient sums (runtime/buckets.py)."""

import pytest
import torch

from galvatron_fx.runtime.buckets import plan_buckets


def _t(n: int, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype)


def test_buckets_fill_in_order_up_to_the_cap():
    ts = [_t(10), _t(10), _t(10), _t(30), _t(5)]  # 40, 40, 40, 120, 20 bytes
    assert plan_buckets(ts, bucket_bytes=80) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(ts, bucket_bytes=1000) == [[0, 1, 2, 3, 4]]


def test_first_bucket_is_smaller_and_dtypes_never_mix():
    ts = [_t(10), _t(10), _t(10, torch.bfloat16), _t(10), _t(10)]
    got = plan_buckets(ts, bucket_bytes=200, first_bucket_bytes=40)
    assert sorted(i for b in got for i in b) == list(range(5))
    assert [0] in got and [2] in got  # first fp32 bucket holds one tensor; bf16 alone
    for b in got:
        assert len({ts[i].dtype for i in b}) == 1
    assert [1, 3, 4] in got


def test_oversized_tensor_gets_its_own_bucket_and_bad_caps_are_refused():
    assert plan_buckets([_t(100), _t(1)], bucket_bytes=16) == [[0], [1]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([_t(1)], bucket_bytes=0)
