"""A benchmark case: one shape, rule, dtype and direction (forward, backward, or both)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from attnhub.rules import Causal, Full, Local, Rule


@dataclass(frozen=True)
class Case:
    """One shape and rule, timed forward or backward."""

    family: str  # "dense", "local", "decode", or one of attnhub.bench.workloads.FAMILIES
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    dim: int
    rule: Rule = field(default_factory=Full)
    sync: str = "none_front"
    dtype: str = "bfloat16"
    direction: str = "fwd"
    #: A family's variant (e.g. "block=16" for paged caches); empty for most cases.
    variant: str = ""

    @property
    def causal(self) -> bool:
        return isinstance(self.rule, Causal) or (isinstance(self.rule, Local) and self.rule.causal)

    def label(self) -> str:
        return (
            f"{self.family} {self.direction} {self.dtype} B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} "
            f"Lq={self.len_q} Lk={self.len_k} D={self.dim} {self.rule.describe()} sync={self.sync}"
            + (f" {self.variant}" if self.variant else "")
        )

    def to_json(self) -> dict:
        d = asdict(self)
        d["rule"] = self.rule.describe()
        return d
