"""The jax backend's development setting (declared with the backend, not in the core). Imported
by the package, so declared before any module of it reads it."""

from __future__ import annotations

from attnhub.settings import declare, parse_positive_pair

declare(
    "ATTNHUB_JAX_TILES", parse_positive_pair, None, "jax blockwise tile sizes",
    expects="block_q,block_k (two positive integers)",
)  # fmt: skip
