"""Host reads of integer arrays (lengths, cu_seqlens, block tables), once per value.

Checking a CUDA tensor's values (SPEC §12) costs a device-to-host copy, which waits for every
kernel queued before it: per call, a serving loop could no longer queue the next layer's kernels
while the GPU works. A model calls attention once per layer with the *same* lengths tensor, so the
values read from a torch tensor are kept, with the facts checked on them, for as long as the tensor
lives and is not changed: keyed by a weak reference to it, its version counter (which every
in-place torch operation bumps) and its data pointer. Writes torch does not see (through ``.data``,
a NumPy view, DLPack, a custom kernel or a CUDA graph replay) are not noticed, as for autograd's
saved tensors (docs/semantics.md). Nothing is kept while ``torch.compile`` traces or a CUDA graph is
captured, for tensors made under ``torch.inference_mode`` (they have no version counter), or for
other frameworks' arrays (read on every call as before).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any

import numpy as np

from attnhub import settings
from attnhub.errors import SpecError

#: Entries kept at most (dead tensors' entries leave at once through their weak references).
KEPT = 64

#: ATTNHUB_TRUST_LENGTHS as set (None or empty: unset, its default False), read on every call: the
#: setting is parsed (and a bad value rejected) only where this says it is set.
_trust_raw = settings.key_reader("ATTNHUB_TRUST_LENGTHS")


def _trusted() -> bool:
    """``ATTNHUB_TRUST_LENGTHS``: the caller vouches for the lengths (no device read; kernels clamp)."""
    return bool(_trust_raw()) and settings.value("ATTNHUB_TRUST_LENGTHS")


class Reading:
    """The integer values of an array (int64 NumPy) and ``facts``: what callers derived from them
    (checks passed, the longest sequence, the array as int32 on a device), keyed by the caller."""

    __slots__ = ("values", "facts")

    def __init__(self, values: np.ndarray | None) -> None:
        self.values = values
        self.facts: dict[Any, Any] = {}


class _Kept(Reading):
    """A reading of one torch tensor at one version (``values`` None until first read)."""

    __slots__ = ("ref", "version", "ptr")


_KEPT: dict[int, _Kept] = {}


def _drop(key: int, ref: weakref.ref) -> None:
    """The tensor of ``ref`` died: forget its entry (unless a newer tensor took its id)."""
    kept = _KEPT.get(key)
    if kept is not None and kept.ref is ref:
        _KEPT.pop(key, None)


def kept(x: Any) -> Reading | None:
    """The reading kept for torch tensor ``x`` at its current version (a fresh one, values not yet
    read, after a change or for a new tensor), or None where nothing may be kept (not a torch
    tensor, a trace, a graph capture, an inference tensor)."""
    if type(x).__module__.split(".", 1)[0] != "torch":
        return None
    torch = sys.modules["torch"]
    if not isinstance(x, torch.Tensor) or torch.compiler.is_compiling():
        return None
    try:
        if x.is_inference() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        version, ptr = x._version, x.data_ptr()
    except RuntimeError:  # a functorch wrapper, a tensor without storage: read as before
        return None
    key = id(x)
    found = _KEPT.get(key)
    if found is not None and found.ref() is x and found.version == version and found.ptr == ptr:
        return found
    entry = _Kept(None)
    entry.ref = weakref.ref(x, lambda ref, key=key: _drop(key, ref))
    entry.version, entry.ptr = version, ptr
    _KEPT.pop(key, None)
    _KEPT[key] = entry
    if len(_KEPT) > KEPT:  # the oldest goes (another thread or a dying tensor may race: harmless)
        with contextlib.suppress(RuntimeError, StopIteration):
            _KEPT.pop(next(iter(_KEPT)), None)
    return entry


def check_readable(name: str, x: Any) -> None:
    """Raise :class:`SpecError` naming ``name`` when ``x`` has no values at all (a torch tensor on
    the meta device): lengths, cu_seqlens and block tables are read by the core (SPEC §12) and by
    the kernels, so such an array is bad input, whether or not its values are checked."""
    if type(x).__module__.split(".", 1)[0] == "torch" and getattr(x, "is_meta", False):
        raise SpecError(
            name, "a tensor whose values can be read (not on the meta device)", "a tensor on the meta device"
        )


def reading(x: Any) -> Reading | None:
    """The values of ``x`` (a Python sequence or an integer array of any framework) with room for
    derived facts, or None when they cannot be read now (see :func:`host_values`). A torch
    tensor is read once per version."""
    if isinstance(x, (list, tuple)):
        return Reading(host_values(x))
    if _trusted():
        return None
    entry = kept(x)
    if entry is not None:
        if entry.values is None:
            entry.values = host_values(x)
            if entry.values is None:
                return None
        return entry
    values = host_values(x)
    return None if values is None else Reading(values)


def host_values(x: Any) -> np.ndarray | None:
    """The integer values of ``x`` as NumPy (one device-to-host copy for a device array), or None
    when reading them would stop a trace or a CUDA graph capture, or ``ATTNHUB_TRUST_LENGTHS`` is
    set (then kernels clamp instead, docs/semantics.md)."""
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=np.int64)
    if _trusted():  # the caller vouches for them: no device sync
        return None
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "torch":
        torch = sys.modules["torch"]
        if torch.compiler.is_compiling():
            return None
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        return x.detach().cpu().numpy().astype(np.int64)
    from attnhub.frameworks import adapter_for

    ad = adapter_for(x, "lengths")
    if not ad.is_concrete(x):
        return None
    return np.asarray(ad.to_numpy(x)).astype(np.int64)


def int32_like(x: Any, like: Any) -> Any:
    """``x`` (ints of any framework or a Python sequence) as an int32 array on ``like``'s device
    in ``like``'s framework, contiguous for torch (the kernels index it directly); no copy when it
    already is one, one copy per version of a torch tensor otherwise (kept with its reading)."""
    mod = type(like).__module__.split(".", 1)[0]
    if mod == "torch":
        torch = sys.modules["torch"]
        if isinstance(x, torch.Tensor):
            if x.dtype is torch.int32 and x.device == like.device and x.is_contiguous():
                return x
            entry = kept(x)
            stream = None
            if entry is not None and like.is_cuda:
                if torch.cuda.is_current_stream_capturing():
                    entry = None  # a copy made now is the graph's: its replays must remake it
                else:  # one copy per stream: a copy queued on one stream is not ordered on another
                    stream = torch.cuda.current_stream(like.device).cuda_stream
            if entry is None:
                return x.to(like.device, torch.int32).contiguous()
            key = ("int32", like.device, stream)
            found = entry.facts.get(key)
            if found is None:
                found = entry.facts[key] = x.to(like.device, torch.int32).contiguous()
            return found
        return torch.as_tensor(np.asarray(x)).to(device=like.device, dtype=torch.int32)
    if mod == "tensorflow":
        tf = sys.modules["tensorflow"]
        return tf.cast(x if tf.is_tensor(x) else tf.convert_to_tensor(np.asarray(x)), tf.int32)
    if mod in ("jax", "jaxlib"):
        jnp = sys.modules["jax.numpy"]
        return jnp.asarray(x, dtype=jnp.int32)
    return np.asarray(x if not hasattr(x, "numpy") else x.numpy(), dtype=np.int32)
