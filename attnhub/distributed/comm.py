"""Point-to-point exchange of flat byte buffers round the ring (gloo and NCCL alike)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def pack(*xs: Any) -> Any:
    """One flat uint8 buffer holding ``xs`` (contiguous), so a ring step is one message."""
    return torch.cat([x.contiguous().reshape(-1).view(torch.uint8) for x in xs])


def unpack(buf: Any, likes: list[tuple[tuple[int, ...], torch.dtype]]) -> list[Any]:
    """Views of ``buf`` with the given shapes and dtypes (the inverse of :func:`pack`)."""
    out, at = [], 0
    for shape, dtype in likes:
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        out.append(buf[at : at + n].view(dtype).view(shape))
        at += n
    return out


def global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def exchange(send: Any, to: int, recv: Any, frm: int, group: Any) -> list[Any]:
    """Start sending ``send`` to group rank ``to`` and receiving ``recv`` from ``frm``."""
    ops = [
        dist.P2POp(dist.isend, send, global_rank(group, to), group),
        dist.P2POp(dist.irecv, recv, global_rank(group, frm), group),
    ]
    return dist.batch_isend_irecv(ops)


def wait(reqs: list[Any] | None) -> None:
    for r in reqs or ():
        r.wait()
