"""SPEC §9 modifiers, boolean masks and §11 offsets in the compiled triton kernels at realistic shapes.

Same oracle as tests/test_triton_modifiers.py (float64 autograd of the SPEC formula, on the GPU),
compiled kernels instead of the interpreter: padded causal batches as boolean masks (padded queries
too), a T5-like (1, H, L, L) bias requiring grad, softcap, sinks and offsets, in each dtype.
"""

from __future__ import annotations

import pytest

from attnhub.rules import Causal, Full, Local

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from tests.test_triton_modifiers import padding_mask, run_case  # noqa: E402

DTYPES = ["bfloat16", "float16", "float32"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_causal_batch_bool_mask(dtype) -> None:
    """B=2, H=4, L=1000: entry 1 padded to 613 tokens, its padded queries attend nothing."""
    m = padding_mask(2, 1000, 1000, [1000, 613])
    run_case(dtype=dtype, b=2, hq=4, hkv=4, lq=1000, lk=1000, d=64, mask=m, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES)
def test_t5_bias_requiring_grad(dtype) -> None:
    run_case(
        dtype=dtype, b=2, hq=4, hkv=4, lq=512, lk=512, d=64, rule=Full(), bias_shape=(1, 4, 512, 512),
        bias_dtype="float32", device="cuda",
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_causal_d128(dtype) -> None:
    run_case(
        dtype=dtype,
        b=1,
        hq=4,
        hkv=2,
        lq=777,
        lk=777,
        d=128,
        rule=Causal(),
        softcap=30.0,
        boost=3.0,
        device="cuda",
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_sinks_local_and_causal(dtype) -> None:
    run_case(
        dtype=dtype, b=2, hq=8, hkv=2, lq=600, lk=600, d=64, rule=Local(128, causal=True), sinks=True,
        device="cuda",
    )  # fmt: skip
    run_case(dtype=dtype, b=1, hq=4, hkv=4, lq=300, lk=700, d=128, rule=Causal(), sinks=True, device="cuda")


def test_decode_shapes_with_sinks_and_softcap() -> None:
    """Few queries (GQA packing, split-KV) with sinks and softcap."""
    run_case(
        dtype="bfloat16", b=2, hq=8, hkv=1, lq=1, lk=3000, d=64, rule=Causal(), sync="none_end",
        sinks=True, softcap=20.0, device="cuda",
    )  # fmt: skip


def test_offsets_and_mixed() -> None:
    run_case(
        dtype="bfloat16",
        b=1,
        hq=4,
        hkv=4,
        lq=500,
        lk=900,
        d=64,
        rule=Causal(),
        offsets=(400, 0),
        device="cuda",
    )
    run_case(
        dtype="float16", b=2, hq=4, hkv=2, lq=400, lk=400, d=64, rule=Local(64, causal=True),
        offsets=(3, 0), softcap=10.0, bias_shape=(2, 1, 400, 400), sinks=True, device="cuda",
    )  # fmt: skip


def test_random_bool_mask_per_head_with_bias() -> None:
    g = torch.Generator().manual_seed(1)
    m = torch.rand(2, 4, 700, 650, generator=g) > 0.2
    m[:, :, :256, :256] = True
    m[:, :, 300:420, :] = False
    run_case(
        dtype="bfloat16",
        b=2,
        hq=4,
        hkv=4,
        lq=700,
        lk=650,
        d=64,
        mask=m,
        bias_shape=(2, 4, 700, 650),
        device="cuda",
    )
