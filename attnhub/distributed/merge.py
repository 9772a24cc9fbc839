"""Run a list of block calls on local buffers and merge their partial results by lse.

The forward accumulates ``(O, lse)`` in float32 (float64 for float64 inputs): merging block
``b`` into rows already holding ``(O, L)`` gives ``L' = logaddexp(L, lse_b)`` and
``O' = O·exp(L − L') + O_b·exp(lse_b − L')``; rows masked so far (``L = −inf``) stay exact.
The backward adds each block's (dq, dk, dv) into float32 buffers in a fixed order (deterministic).
"""

from __future__ import annotations

from typing import Any

import torch

from attnhub import settings
from attnhub.distributed import block
from attnhub.distributed.schedule import Call


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_into(acc_o: Any, acc_lse: Any, o_b: Any, lse_b: Any, lo: int, hi: int, fresh: bool) -> None:
    """Merge a block's (out, lse) into rows ``lo:hi``; ``fresh`` rows hold nothing yet (a copy)."""
    a_o, a_l = acc_o[:, :, lo:hi], acc_lse[:, :, lo:hi]
    if _fused(acc_o):
        from attnhub.distributed import merge_kernel

        merge_kernel.merge(a_o, a_l, o_b, lse_b, fresh)
        return
    if fresh:
        a_o.copy_(o_b)
        a_l.copy_(lse_b)
        return
    l_b = lse_b.to(a_l.dtype)
    new = torch.logaddexp(a_l, l_b)
    ref = new.nan_to_num(neginf=0.0)  # rows masked in both: weights exp(-inf) = 0
    wa, wb = (a_l - ref).exp_().unsqueeze(-1), (l_b - ref).exp_().unsqueeze(-1)
    a_o.mul_(wa).add_(o_b * wb)
    a_l.copy_(new)


def _fused(acc_o: Any) -> bool:
    """The Triton merge: float32 accumulators on a CUDA device (or under TRITON_INTERPRET=1 for
    tests), unless ATTNHUB_CP_TORCH_MERGE=1."""
    if acc_o.dtype != torch.float32 or settings.value("ATTNHUB_CP_TORCH_MERGE"):
        return False
    if not acc_o.is_cuda and (settings.external("TRITON_INTERPRET") or "0") != "1":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class Rows:
    """Which local query rows already hold a partial result (so that a first block is copied)."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def fresh(self, lo: int, hi: int) -> bool:
        """True when no row of lo:hi was written yet (rows not written hold 0 and lse −inf, so a
        merge into them is exact too). Records lo:hi as written."""
        clear = all(hi <= a or lo >= b for a, b in self.spans)
        self.spans.append((lo, hi))
        return clear


def forward_calls(
    q: Any, k: Any, v: Any, calls: list[Call], acc_o: Any, acc_lse: Any, scale: float,
    softcap: float | None, backend: str, rows: Rows,
) -> None:  # fmt: skip
    """Compute ``calls`` (q rows against the keys ``k``, ``v`` on hand) and merge them."""
    for c in calls:
        o_b, l_b = block.forward(
            q[:, :, c.q_lo : c.q_hi], k[:, :, c.k_lo : c.k_hi], v[:, :, c.k_lo : c.k_hi], c, scale,
            softcap, backend,
        )  # fmt: skip
        merge_into(acc_o, acc_lse, o_b, l_b, c.q_lo, c.q_hi, rows.fresh(c.q_lo, c.q_hi))


def backward_calls(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, calls: list[Call], dq: Any, dk: Any,
    dv: Any, scale: float, softcap: float | None, backend: str,
) -> None:  # fmt: skip
    """Add the calls' shares of the merged gradient into ``dq`` and ``dk``/``dv`` (of ``k``, ``v``)."""
    for c in calls:
        rows, keys = slice(c.q_lo, c.q_hi), slice(c.k_lo, c.k_hi)
        g = block.backward(
            q[:, :, rows], k[:, :, keys], v[:, :, keys], o[:, :, rows], lse[:, :, rows],
            do[:, :, rows], c, scale, softcap, backend,
        )  # fmt: skip
        dq[:, :, rows] += g[0]
        dk[:, :, keys] += g[1]
        dv[:, :, keys] += g[2]
