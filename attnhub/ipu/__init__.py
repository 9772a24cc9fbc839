"""flash-attention-ipu's API on attnhub: ``flash_attention_qkv_packed`` and chunk selection.

``flash_attention_qkv_packed(qkv, num_chunks_q, num_chunks_kv)`` takes the packed (3, N, L, D)
tensor of graphcore-research/flash-attention-ipu (N = batch x heads, q already scaled) and returns
the causal attention (N, L, D). It runs attnhub's chunked graph (the ``ipu`` backend's) directly,
on whatever device the tensor is on: inside a PopTorch model PopTorch compiles it for the IPU; on
the CPU it is the same computation (flash-attention-ipu fell back to a dense CPU version).
Gradients flow through torch autograd.

Importing this module imports torch (not poptorch); ``import attnhub`` does not import it.
"""

from __future__ import annotations

import torch

from attnhub.rules import Causal
from attnhub_backends.ipu.graph import ChunkedAttention
from attnhub_backends.ipu.plan import choose_chunks, make_plan

__all__ = ["choose_chunks", "choose_num_chunks", "flash_attention_qkv_packed"]


def choose_num_chunks(seq_len: int, head_dim: int) -> tuple[int, int]:
    """``(num_chunks_q, num_chunks_kv)`` for self-attention of length ``seq_len``.

    The memory model (docs/backends/ipu.md): one tile of logits, ``(L / num_chunks_q) x
    (L / num_chunks_kv)`` per batch-head, is kept no larger than the query itself (``L x D``),
    so ``num_chunks_q * num_chunks_kv`` is the power of two at or above ``L / D``, split with the
    query side taking the larger half. For powers of two this is flash-attention-ipu's heuristic
    ``(2**ceil(log2(L/D)/2), 2**floor(log2(L/D)/2))``.
    """
    return choose_chunks(seq_len, seq_len, head_dim)


def flash_attention_qkv_packed(
    qkv: torch.Tensor, num_chunks_q: int | None = None, num_chunks_kv: int | None = None
) -> torch.Tensor:
    """Causal attention ``softmax(q @ k.T + causal) @ v`` of a packed qkv, chunked.

    qkv -- shape (3, N, L, D): q, k, v stacked; q already scaled (no ``1/sqrt(D)`` is applied).
    num_chunks_q, num_chunks_kv -- chunks along the query and key sequence; None picks them with
        :func:`choose_num_chunks`. As in flash-attention-ipu they must divide L.
    returns -- shape (N, L, D), the dtype of qkv (float16 or float32; computed in float32).
    """
    if qkv.ndim != 4:
        raise ValueError(f"flash_attention_qkv_packed expects qkv input to have 4 dimensions, got {qkv.ndim}")
    if qkv.shape[0] != 3:
        raise ValueError(
            f"flash_attention_qkv_packed expects qkv input to have size 3 at dimension 0, got {qkv.shape[0]}"
        )
    n, seq_len, head_dim = (int(s) for s in qkv.shape[1:])
    auto_q, auto_kv = choose_num_chunks(seq_len, head_dim)
    num_chunks_q = auto_q if num_chunks_q is None else num_chunks_q
    num_chunks_kv = auto_kv if num_chunks_kv is None else num_chunks_kv
    for name, c in (("num_chunks_q", num_chunks_q), ("num_chunks_kv", num_chunks_kv)):
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ValueError(f"flash_attention_qkv_packed expects {name} to be an int >= 1, got {c!r}")
        if seq_len % c:
            raise ValueError(
                f"flash_attention_qkv_packed expects qkv size at dimension 2 ({seq_len}) "
                f"to be divisible by {name} ({c})"
            )
    if qkv.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"flash_attention_qkv_packed supports float16 and float32, got {qkv.dtype}")
    if n == 0 or seq_len == 0 or head_dim == 0:
        return qkv[0] * 0
    plan = make_plan(Causal(), (seq_len,), (seq_len,), "none_front", num_chunks_q, num_chunks_kv)
    module = ChunkedAttention(plan, 1, n, n, head_dim, 1.0, qkv.device)
    q, k, v = (x.unsqueeze(0) for x in qkv.unbind(0))
    out, _ = module(q, k, v)
    return out.squeeze(0)
