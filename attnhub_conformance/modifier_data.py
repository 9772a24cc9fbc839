"""Inputs of a SPEC §9-§11 case: q, k, v and every extra array, drawn from the seed and the case id.

Everything is drawn in NumPy float64 and rounded to the dtype it travels in (the inputs' dtype, or
float32 for a float32 bias), so the backend and the oracle see the same values. Padded key rows
and the cache beyond each entry's length hold ordinary random data (a backend that attends them
is off by O(1)); a paged cache's blocks that no table entry names hold NaN (a backend reading them
gives NaN). A ``nan_padding`` case stores NaN in every padded query row, padded key and value
row and cache row past ``k_lengths`` of the arrays the call receives (``q_in``, ``k_in``,
``v_in``), while the oracle keeps the random values: SPEC §10 reads none of them, so any value
gives the same result, and a backend that multiplies a masked probability by them (0 × NaN) or
leaves a padded query row unzeroed shows NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnhub_conformance import oracle
from attnhub_conformance.arrays import round_to
from attnhub_conformance.cases import Case


@dataclass
class ModData:
    """The float64 canonical inputs of a modified case and its extra arrays (None where unused)."""

    q: np.ndarray  # (B, Hq, Nq, Dqk); varlen: (1, Hq, Tq, Dqk)
    k: np.ndarray  # logical (B, Hkv, Nk, Dqk) (a paged cache gathered)
    v: np.ndarray
    dout: np.ndarray
    mask: np.ndarray | None = None  # bool (rank 4)
    bias: np.ndarray | None = None  # rank 4, rounded to bias_dtype
    sinks: np.ndarray | None = None  # (Hq,)
    alibi: np.ndarray | None = None  # ALiBi slopes, float32 values: (Hq,) or (B, Hq) as passed
    q_lengths: np.ndarray | None = None  # (B,) int32
    k_lengths: np.ndarray | None = None
    cu_seqlens_q: np.ndarray | None = None  # (N + 1,) int32
    cu_seqlens_k: np.ndarray | None = None
    k_blocks: np.ndarray | None = None  # (num_blocks, block, Hkv, Dqk)
    v_blocks: np.ndarray | None = None
    block_table: np.ndarray | None = None  # (B, max_blocks) int32
    #: What the call receives where it differs from q, k, v (NaN in padding), else None.
    q_in: np.ndarray | None = None
    k_in: np.ndarray | None = None
    v_in: np.ndarray | None = None

    def call_inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q, k, v) as the call receives them (logical k, v for a paged cache)."""
        pick = lambda a, b: b if a is None else a  # noqa: E731
        return pick(self.q_in, self.q), pick(self.k_in, self.k), pick(self.v_in, self.v)

    def problem(self, case: Case, scale: float) -> oracle.Problem:
        """The oracle's dense problem for these inputs."""
        keep, padded = oracle.rule_keep(case)
        alibi = shift = None
        if self.alibi is not None:
            alibi, shift = oracle.alibi_term(case, self.alibi.reshape(-1, case.heads_q))
        if self.mask is not None:
            keep = keep & self.mask
        return oracle.Problem(
            self.q, self.k, self.v, keep, scale, bias=self.bias, softcap=case.softcap, sinks=self.sinks,
            padded_q=padded, alibi=alibi, alibi_shift=shift,
        )  # fmt: skip


def bias_dtype(case: Case) -> str:
    return case.bias_dtype or case.dtype


def make_mod_data(case: Case, rng: np.random.Generator) -> ModData:
    """N(0, 1) q, k, v (q x 8 for large logits) and the case's extra arrays, all rounded."""
    batch = 1 if case.entry == "varlen" else case.batch
    hq, hkv, nq, nk = case.heads_q, case.heads_kv, case.nq, case.nk
    q = rng.standard_normal((batch, hq, nq, case.dim_qk)) * (8.0 if case.large_logits else 1.0)
    k = rng.standard_normal((batch, hkv, nk, case.dim_qk))
    v = rng.standard_normal((batch, hkv, nk, case.dim_v))
    dout = rng.standard_normal((batch, hq, nq, case.dim_v))
    if case.cotangent == "ones":  # the gradient of out.sum()
        dout = np.ones_like(dout)
    q, k, v, dout = (round_to(a, case.dtype) for a in (q, k, v, dout))
    d = ModData(q, k, v, dout)
    if case.rule == "bool":
        d.mask = _bool_mask(case, batch, rng)
    if case.bias:
        shape = oracle.bias_shape(case)
        bias = rng.standard_normal(shape) * 2.0
        if case.bias_neginf:
            bias[rng.random(shape) < 0.2] = -np.inf
        d.bias = round_to(bias, bias_dtype(case))
    if case.sinks:
        d.sinks = round_to(rng.standard_normal(hq) * 2.0, case.dtype)
    if case.alibi:  # positive slopes around ALiBi's (2**-8 .. 0.5), large enough to matter at these lengths
        shape = (hq,) if case.alibi == "h" else (batch, hq)
        d.alibi = round_to(rng.uniform(0.05, 1.0, shape), "float32")
    if case.q_lengths is not None and case.entry == "attention":
        d.q_lengths = np.asarray(case.q_lengths, dtype=np.int32)
    if case.k_lengths is not None:
        d.k_lengths = np.asarray(case.k_lengths, dtype=np.int32)
    if case.entry == "varlen":
        d.cu_seqlens_q = np.concatenate([[0], np.cumsum(case.seqlens_q)]).astype(np.int32)
        d.cu_seqlens_k = np.concatenate([[0], np.cumsum(case.seqlens_k)]).astype(np.int32)
    if getattr(case, "nan_padding", False):
        d.q_in, d.k_in, d.v_in = nan_in_padding(case, q, k, v)
    if case.paged:
        per = nk // case.paged
        n = batch * per + SPARE_BLOCKS
        d.block_table = rng.permutation(n)[: batch * per].reshape(batch, per).astype(np.int32)
        _, kc, vc = d.call_inputs()
        d.k_blocks, d.v_blocks = (to_blocks(x, case.paged, d.block_table, n) for x in (kc, vc))
    return d


def nan_in_padding(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """Copies of q, k, v with NaN in every query row and key row outside the valid segments."""
    padded_q = np.ones(q.shape[::2], dtype=bool)  # (B, Nq)
    padded_k = np.ones(k.shape[::2], dtype=bool)  # (B, Nk)
    for b, segs in enumerate(oracle.segments(case)):
        for rows, cols in segs:
            padded_q[b, rows] = False
            padded_k[b, cols] = False
    qn, kn, vn = (x.copy() for x in (q, k, v))
    qn[np.broadcast_to(padded_q[:, None, :, None], q.shape)] = np.nan
    for x in (kn, vn):
        x[np.broadcast_to(padded_k[:, None, :, None], x.shape)] = np.nan
    return qn, kn, vn


#: Blocks of a paged cache that no table entry names; they hold NaN.
SPARE_BLOCKS = 2


def to_blocks(x: np.ndarray, block: int, table: np.ndarray, n: int, fill: float = np.nan) -> np.ndarray:
    """A logical (B, Hkv, L, D) cache as (n, block, Hkv, D) blocks placed by ``table`` (the blocks
    no entry names hold ``fill``): the cache a paged call reads, or the oracle's dk/dv of one."""
    bsz, hkv, _, dim = x.shape
    out = np.full((n, block, hkv, dim), fill, dtype=np.result_type(x.dtype, type(fill)))
    for bi in range(bsz):
        for j in range(table.shape[1]):
            out[table[bi, j]] = np.moveaxis(x[bi, :, j * block : (j + 1) * block, :], 0, 1)
    return out


def _bool_mask(case: Case, batch: int, rng: np.random.Generator) -> np.ndarray:
    """A bool mask: padding-shaped (B, 1, Nq, Nk), block-sparse (1, 1, Nq, Nk) or random."""
    nq, nk = case.nq, case.nk
    if case.mask_shape == "padding":
        m = np.zeros((batch, 1, nq, nk), dtype=bool)
        for b in range(batch):  # entry 0: about half its query rows padded; the others random
            ql = max(1, nq // 2) if b == 0 else int(rng.integers(1, nq + 1))
            kl = int(rng.integers(1, nk + 1))
            m[b, 0, :ql, :kl] = True
        return m
    if case.mask_shape.startswith("block"):
        tile = int(case.mask_shape[len("block") :])
        return oracle.block_sparse(nq, nk, tile, rng)[None, None]
    shape = (1, 1, nq, nk) if case.mask_shape == "bcast" else (batch, case.heads_q, nq, nk)
    m = rng.random(shape) < 0.7
    rows = np.arange(nq)
    m[..., rows, rows % nk] = True
    if case.mask_empty_rows:
        m[..., np.unique([0, nq // 2]), :] = False
    return m
