"""Run a list of block calls on local buffers and merge their partial results by lse.

The forward accumulates ``(O, lse)`` in float32 (float64 for float64 inputs): merging block
``b`` into rows already holding ``(O, L)`` gives ``L' = logaddexp(L, lse_b)`` and
``O' = O·exp(L − L') + O_b·exp(lse_b − L')``; rows masked so far (``L = −inf``) stay exact.
The backward adds each block's (dq, dk, dv) into float32 buffers in a fixed order (deterministic).
"""

from __future__ import annotations

from typing import Any

import torch

from attnhub.distributed import block
from attnhub.distributed.schedule import Call


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_into(acc_o: Any, acc_lse: Any, o_b: Any, lse_b: Any, lo: int, hi: int) -> None:
    a_o, a_l = acc_o[:, :, lo:hi], acc_lse[:, :, lo:hi]
    l_b = lse_b.to(a_l.dtype)
    new = torch.logaddexp(a_l, l_b)
    ref = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    wa, wb = torch.exp(a_l - ref).unsqueeze(-1), torch.exp(l_b - ref).unsqueeze(-1)
    acc_o[:, :, lo:hi] = a_o * wa + o_b.to(a_o.dtype) * wb
    acc_lse[:, :, lo:hi] = new


def forward_calls(
    q: Any, k: Any, v: Any, calls: list[Call], acc_o: Any, acc_lse: Any, scale: float,
    softcap: float | None, backend: str,
) -> None:  # fmt: skip
    """Compute ``calls`` (q rows against the keys ``k``, ``v`` on hand) and merge them."""
    for c in calls:
        o_b, l_b = block.forward(
            q[:, :, c.q_lo : c.q_hi], k[:, :, c.k_lo : c.k_hi], v[:, :, c.k_lo : c.k_hi], c, scale,
            softcap, backend,
        )  # fmt: skip
        merge_into(acc_o, acc_lse, o_b, l_b, c.q_lo, c.q_hi)


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
