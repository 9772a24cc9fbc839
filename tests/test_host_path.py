"""Length arrays are read on the host once per torch tensor version (attnhub/readings.py,
docs/semantics.md "Lengths' values"): N layers given the same ``k_lengths`` / ``cu_seqlens`` /
``block_table`` tensor cost one device read, and a value changed in place, or a new tensor, is
checked again (SPEC §12). The reads are counted by wrapping :func:`attnhub.readings.host_values`.

The cases run on the reference here and, in a child pytest with ``TRITON_INTERPRET=1`` (set before
triton is imported), on the triton backend as well, against the reference on fresh tensors.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

import attnhub
from attnhub import SpecError, readings

torch = pytest.importorskip("torch")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["reference", "triton"] if INTERPRETED else ["reference"]
N = 6  # calls with the same arrays: a model's layers in one decoding step

if not INTERPRETED and importlib.util.find_spec("triton") is not None:

    @pytest.mark.slow
    def test_host_path_under_interpreter() -> None:
        """Every case below on the triton backend too, in a child process with the interpreter."""
        here = Path(__file__).parent
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(here.parent))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__))],
            cwd=here.parent, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g)


def close(got, want, tol=2e-5):
    """Relative Frobenius error against the float64 reference (SPEC §6, float32 inputs)."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape and torch.isfinite(got).all()
    return float((got - want).norm() / want.norm().clamp_min(1e-30)) < tol


def reference_kvcache(q, kc, vc, lengths, **kw):
    """The reference on float64 copies and a fresh lengths tensor (nothing kept from earlier calls)."""
    lens = torch.tensor(lengths.tolist(), dtype=torch.int32)
    return attnhub.attention_kvcache(q.double(), kc.double(), vc.double(), lens, backend="reference", **kw)


def kvcache_inputs(lk=32):
    q, kc, vc = rand(2, 4, 2, 16, seed=1), rand(2, 2, lk, 16, seed=2), rand(2, 2, lk, 16, seed=3)
    return q, kc, vc


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_one_read_for_many_calls(reads, backend, dtype) -> None:
    """A KV-cache decode step: N calls with one lengths tensor read it once; results match the
    reference on a fresh tensor (an int64 tensor's int32 copy is kept with the reading)."""
    q, kc, vc = kvcache_inputs()
    lens = torch.tensor([29, 7], dtype=dtype)
    want = reference_kvcache(q, kc, vc, lens)
    reads.clear()
    outs = [attnhub.attention_kvcache(q, kc, vc, lens, backend=backend) for _ in range(N)]
    outs += [
        attnhub.attention(q, kc, vc, k_lengths=lens, sync="none_end", mask="causal", backend=backend)
        for _ in range(N)
    ]
    assert sum(x is lens for x in reads) == 1
    assert len(reads) == 1
    for out in outs:
        assert close(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_change_is_checked_again(reads, backend) -> None:
    """``k_lengths[0] = 10**6`` after cached calls is a SpecError; a valid in-place change is read
    again and used (also for an int64 tensor, whose int32 copy is remade)."""
    q, kc, vc = kvcache_inputs()
    for dtype in (torch.int32, torch.int64):
        lens = torch.tensor([32, 5], dtype=dtype)
        for _ in range(N):
            attnhub.attention_kvcache(q, kc, vc, lens, backend=backend)
        lens[0] = 10**6
        with pytest.raises(SpecError, match="k_lengths"):
            attnhub.attention_kvcache(q, kc, vc, lens, backend=backend)
        lens[0] = -1
        with pytest.raises(SpecError, match="k_lengths"):
            attnhub.attention(q, kc, vc, k_lengths=lens, sync="none_end", backend=backend)
        lens[0] = 11
        lens[1] += 10
        got = attnhub.attention_kvcache(q, kc, vc, lens, backend=backend)
        assert close(got, reference_kvcache(q, kc, vc, lens))
        assert lens.tolist() == [11, 15]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_tensor_is_checked(reads, backend) -> None:
    """A new tensor is read, even with the values of one read before; a bad one is rejected."""
    q, kc, vc = kvcache_inputs()
    a = torch.tensor([20, 3], dtype=torch.int32)
    attnhub.attention_kvcache(q, kc, vc, a, backend=backend)
    b = a.clone()
    attnhub.attention_kvcache(q, kc, vc, b, backend=backend)
    assert [x is a for x in reads] == [True, False] and reads[1] is b
    with pytest.raises(SpecError, match="k_lengths"):
        attnhub.attention_kvcache(q, kc, vc, torch.tensor([20, 33], dtype=torch.int32), backend=backend)
    with pytest.raises(SpecError, match="k_lengths"):
        attnhub.attention_kvcache(q, kc, vc, a.clone().sub_(21), backend=backend)


def test_kept_readings_hold_no_tensor() -> None:
    """The cache keeps weak references only: a lengths tensor dies with its last user, and its
    entry (values, int32 copy) goes with it."""
    q, kc, vc = kvcache_inputs()
    lens = torch.tensor([30, 2], dtype=torch.int64)
    attnhub.attention_kvcache(q, kc, vc, lens, backend="reference")
    key = id(lens)
    assert key in readings._KEPT and readings._KEPT[key].facts  # values, range and int32 copy kept
    ref = weakref.ref(lens)
    del lens
    gc.collect()
    assert ref() is None
    assert key not in readings._KEPT


def test_kept_entries_are_bounded() -> None:
    q, kc, vc = kvcache_inputs()
    alive = [torch.tensor([i % 33, 1], dtype=torch.int32) for i in range(readings.KEPT + 20)]
    for lens in alive:
        attnhub.attention_kvcache(q, kc, vc, lens, backend="reference")
    assert len(readings._KEPT) <= readings.KEPT


def test_inference_tensors_are_read_every_call(reads) -> None:
    """Tensors made under torch.inference_mode have no version counter: nothing is kept."""
    q, kc, vc = kvcache_inputs()
    with torch.inference_mode():
        lens = torch.tensor([30, 2], dtype=torch.int32)
        for _ in range(3):
            attnhub.attention_kvcache(q, kc, vc, lens, backend="reference")
        assert len(reads) == 3
        lens[0] = 10**6
        with pytest.raises(SpecError, match="k_lengths"):
            attnhub.attention_kvcache(q, kc, vc, lens, backend="reference")


def test_trusted_lengths_are_never_read(reads, monkeypatch) -> None:
    monkeypatch.setenv("ATTNHUB_TRUST_LENGTHS", "1")
    q, kc, vc = kvcache_inputs()
    lens = torch.tensor([30, 2], dtype=torch.int32)
    for _ in range(3):
        attnhub.attention_kvcache(q, kc, vc, lens, backend="reference")
    assert reads == []


def varlen_inputs():
    cu_q = torch.tensor([0, 2, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 30], dtype=torch.int32)
    return rand(7, 4, 16, seed=4), rand(30, 2, 16, seed=5), rand(30, 2, 16, seed=6), cu_q, cu_k


def reference_varlen(q, k, v, cu_q, cu_k, **kw):
    fresh = (torch.tensor(c.tolist(), dtype=torch.int32) for c in (cu_q, cu_k))
    return attnhub.attention_varlen(q.double(), k.double(), v.double(), *fresh, backend="reference", **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_reads_once_and_rechecks_changes(reads, backend) -> None:
    """cu_seqlens: one read per tensor version; the longest sequence (the grid's size) is derived
    again after an in-place change, and a bad change is rejected."""
    q, k, v, cu_q, cu_k = varlen_inputs()
    kw = dict(mask="causal", sync="none_end")
    want = reference_varlen(q, k, v, cu_q, cu_k, **kw)
    reads.clear()
    for _ in range(N):
        assert close(attnhub.attention_varlen(q, k, v, cu_q, cu_k, backend=backend, **kw), want)
    assert len(reads) == 2 and reads[0] is cu_q and reads[1] is cu_k
    cu_q[1] = 0  # sequences of 0, 1 and 6 queries: the longest (the grid) grows from 4 to 6
    cu_q[2] = 1
    cu_k[1] = 2
    want = reference_varlen(q, k, v, cu_q, cu_k, **kw)
    got = attnhub.attention_varlen(q, k, v, cu_q, cu_k, backend=backend, **kw)
    assert close(got, want)
    cu_q[1] = 5  # not non-decreasing
    with pytest.raises(SpecError, match="non-decreasing"):
        attnhub.attention_varlen(q, k, v, cu_q, cu_k, backend=backend, **kw)
    cu_q[1] = 0
    cu_k[-1] = 29  # no longer ends at Tk
    with pytest.raises(SpecError, match="total length"):
        attnhub.attention_varlen(q, k, v, cu_q, cu_k, backend=backend, **kw)
    with pytest.raises(SpecError, match="max_seqlen"):
        attnhub.attention_varlen(q, k, v, cu_q, torch.tensor(cu_k.tolist()[:-1] + [30], dtype=torch.int32),
                                 max_seqlen_q=2, backend=backend, **kw)  # fmt: skip


def paged_inputs():
    q, kc, vc = kvcache_inputs()
    table = torch.tensor([[5, 0, 7, 2], [6, 3, 1, 4]], dtype=torch.int32)
    kp, vp = torch.empty(8, 8, 2, 16), torch.empty(8, 8, 2, 16)
    kp[table.long()] = kc.reshape(2, 2, 4, 8, 16).permute(0, 2, 3, 1, 4)
    vp[table.long()] = vc.reshape(2, 2, 4, 8, 16).permute(0, 2, 3, 1, 4)
    return q, kc, vc, kp, vp, table


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_reads_once_and_rechecks_changes(reads, backend) -> None:
    """Block table and lengths: one read each per version; a block index moved out of range in
    place is rejected (only for blocks in use: the rest may be unset)."""
    q, kc, vc, kp, vp, table = paged_inputs()
    lens = torch.tensor([32, 9], dtype=torch.int32)
    want = reference_kvcache(q, kc, vc, lens)
    reads.clear()
    with torch.no_grad():
        for _ in range(N):
            got = attnhub.attention_kvcache(q, kp, vp, lens, block_table=table, backend=backend)
            assert close(got, want)
        assert len(reads) == 2 and {id(x) for x in reads} == {id(table), id(lens)}
        table[1, 3] = 99  # batch 1 uses blocks 0 and 1 of its row only (9 keys, block size 8)
        attnhub.attention_kvcache(q, kp, vp, lens, block_table=table, backend=backend)
        table[1, 1] = 8
        with pytest.raises(SpecError, match="block_table"):
            attnhub.attention_kvcache(q, kp, vp, lens, block_table=table, backend=backend)
        table[1, 1] = 3
        lens[1] = 32  # now batch 1 uses block 3 of its row too, which holds 99
        with pytest.raises(SpecError, match="block_table"):
            attnhub.attention_kvcache(q, kp, vp, lens, block_table=table, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_operands(backend) -> None:
    """Lengths, cu_seqlens, block tables and sinks given as strided views compute what their
    contiguous copies do (the kernels index them directly: the core makes them contiguous)."""
    q, kc, vc, kp, vp, table = paged_inputs()
    lens = torch.tensor([[30, -5], [9, -5]], dtype=torch.int32)[:, 0]
    assert not lens.is_contiguous()
    sinks = rand(8, seed=9)[::2]
    want = reference_kvcache(q, kc, vc, lens, sinks=sinks.double().contiguous())
    got = attnhub.attention_kvcache(q, kc, vc, lens, sinks=sinks, backend=backend)
    assert close(got, want)
    with torch.no_grad():
        strided_table = table.t().contiguous().t()  # column-major: stride (1, 2)
        got = attnhub.attention_kvcache(
            q, kp, vp, lens, block_table=strided_table, sinks=sinks, backend=backend
        )
    assert close(got, want)
    dense = attnhub.attention(q, kc, vc, sinks=sinks, mask="causal", sync="none_end", backend=backend)
    want = attnhub.attention(q.double(), kc.double(), vc.double(), sinks=sinks.double().contiguous(),
                             mask="causal", sync="none_end", backend="reference")  # fmt: skip
    assert close(dense, want)
    qv, kv, vv, cu_q, cu_k = varlen_inputs()
    cu_q2 = torch.stack([cu_q, cu_q], 1)[:, 1]
    assert not cu_q2.is_contiguous()
    got = attnhub.attention_varlen(qv, kv, vv, cu_q2, cu_k, mask="causal", backend=backend)
    assert close(got, reference_varlen(qv, kv, vv, cu_q, cu_k, mask="causal"))


def test_sequence_items_checked_on_every_call() -> None:
    """A Python list's key holds only its length: its items are still checked on a cached plan."""
    q, kc, vc = kvcache_inputs()
    attnhub.attention(q, kc, vc, k_lengths=[30, 2], backend="reference")
    for bad in ([30, 2.5], [30, True], [30, 33], [-1, 2]):
        with pytest.raises(SpecError, match="k_lengths"):
            attnhub.attention(q, kc, vc, k_lengths=bad, backend="reference")


def test_extras_and_operands_init_match_their_fields():
    """Extras and Operands have hand-written __init__s (one dict update, built on every call): the
    parameters are exactly the dataclass fields with the same defaults, and instances stay frozen."""
    import dataclasses
    import inspect

    from attnhub.extras import Extras
    from attnhub.operands import Operands

    for cls in (Extras, Operands):
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        fields = dataclasses.fields(cls)
        assert [p.name for p in params] == [f.name for f in fields]
        assert [p.default for p in params] == [f.default for f in fields]
        made = cls(**{f.name: i for i, f in enumerate(fields)})
        assert [getattr(made, f.name) for f in fields] == list(range(len(fields)))
        assert dataclasses.replace(made, **{fields[0].name: "x"}) == cls("x", *range(1, len(fields)))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, fields[0].name, 1)
