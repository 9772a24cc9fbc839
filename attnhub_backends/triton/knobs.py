"""The triton backend's development settings: pins of its kernel choices for tuning and experiments
(declared here, with the backend, not in the core; ``attnhub info --settings`` lists them once the
backend is loaded). Imported by the package, so declared before any module of it reads one."""

from __future__ import annotations

from attnhub.settings import declare, parse_int, parse_ints

_CFG = "bm,bn,warps,stages[,maxnreg[,band]]"
declare("ATTNHUB_TRITON_FWD_CFG", parse_ints, None, "pin the triton forward kernel's config", expects=_CFG)
declare("ATTNHUB_TRITON_DQ_CFG", parse_ints, None, "pin the triton dq kernel's config", expects=_CFG)
declare("ATTNHUB_TRITON_DKDV_CFG", parse_ints, None, "pin the triton dk/dv kernel's config", expects=_CFG)
declare(
    "ATTNHUB_TRITON_TMA", parse_int, None, "force the triton forward's K/V load path",
    expects="0 (pointers) or 3 (descriptors)",
)  # fmt: skip
declare(
    "ATTNHUB_TRITON_SPLITS", parse_int, None, "force the triton split-KV factor", expects="an integer >= 1"
)
