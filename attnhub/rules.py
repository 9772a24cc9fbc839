"""Mask rules of SPEC §3: Full, Causal, Local, and the shape of an explicit mask array.

Rules are small frozen dataclasses: hashable (they are part of the dispatch cache key) and
evaluated from positions by every backend, never read from memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnhub.errors import SpecError


@dataclass(frozen=True)
class Full:
    """Every query attends every key."""

    def describe(self) -> str:
        return "full"


@dataclass(frozen=True)
class Causal:
    """A query attends keys whose flat position is not after its own: ``F(q) >= F(k)``."""

    def describe(self) -> str:
        return "causal"


@dataclass(frozen=True)
class Local:
    """A window of half-size ``window`` (per dimension), sampled every ``2**log2_stride`` positions.

    Attended iff for every sequence dimension ``|P - R| % s == 0`` and ``|P - R| // s < window``;
    with ``causal=True`` also ``F(q) >= F(k)``.
    """

    window: int | tuple[int, ...]
    log2_stride: int = 0
    causal: bool = False

    def __post_init__(self) -> None:
        w = self.window
        if isinstance(w, list):
            object.__setattr__(self, "window", tuple(w))
            w = self.window
        values = w if isinstance(w, tuple) else (w,)
        if not values:
            raise SpecError("mask.window", "an int >= 1 or a non-empty tuple of them", w)
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                raise SpecError("mask.window", "an int >= 1 (or a tuple of ints >= 1)", w)
        s = self.log2_stride
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 31:
            raise SpecError("mask.log2_stride", "an int with 0 <= log2_stride < 31", s)
        if not isinstance(self.causal, bool):
            raise SpecError("mask.causal", "a bool", self.causal)

    @property
    def stride(self) -> int:
        return 1 << self.log2_stride

    def windows(self, ndim: int) -> tuple[int, ...]:
        """The window per sequence dimension for a request with ``ndim`` sequence dimensions."""
        if isinstance(self.window, tuple):
            if len(self.window) == 1:
                return self.window * ndim
            if len(self.window) != ndim:
                raise SpecError(
                    "mask.window",
                    f"an int or a tuple of {ndim} ints (one per sequence dimension)",
                    self.window,
                )
            return self.window
        return (self.window,) * ndim

    def describe(self) -> str:
        parts = [f"window={self.window}"]
        if self.log2_stride:
            parts.append(f"log2_stride={self.log2_stride}")
        if self.causal:
            parts.append("causal")
        return "local(" + ", ".join(parts) + ")"


@dataclass(frozen=True)
class ExplicitMask:
    """Signature of an explicit mask array: ``kind`` is ``"bool"`` (True = attend) or ``"additive"``.

    ``shape`` is the array's shape after it was brought to rank 4 (broadcastable to
    ``B x Hq x Nq x Nk``). The array itself travels beside the request, not inside it.
    """

    kind: str
    shape: tuple[int, int, int, int]

    def describe(self) -> str:
        return f"explicit {self.kind} mask {self.shape}"


Rule = Full | Causal | Local | ExplicitMask

SYNC_MODES = ("none_front", "scale_front", "scale_end", "none_end")
