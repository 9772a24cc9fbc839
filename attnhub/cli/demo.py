"""``attnhub demo``: a few requests through auto dispatch on every CPU framework that is installed."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import attnhub
from attnhub.frameworks import numpy_dtype
from attnhub.rules import Causal, Full, Local

# (label, q shape, k shape, v shape, mask, sync, layout)
REQUESTS: list[tuple[str, tuple, tuple, tuple, Any, str, str]] = [
    ("1-d causal GQA 8/2", (2, 8, 128, 64), (2, 2, 128, 64), (2, 2, 128, 64), Causal(), "none_front", "bhsd"),
    ("decode Lq=1 KV cache", (1, 8, 1, 64), (1, 8, 512, 64), (1, 8, 512, 64), Causal(), "none_end", "bhsd"),
    ("sliding window 32 bshd", (2, 96, 4, 32), (2, 96, 4, 32), (2, 96, 4, 32),
     Local(32, causal=True), "none_end", "bshd"),
    ("cross 48/96 scale_end", (1, 4, 48, 32), (1, 4, 96, 32), (1, 4, 96, 16), Causal(), "scale_end", "bhsd"),
    ("2-d 8x8 local 3x3 s2", (1, 2, 8, 8, 32), (1, 2, 8, 8, 32), (1, 2, 8, 8, 32),
     Local((3, 3), log2_stride=1), "none_front", "bhsd"),
    ("2-d 4x4 over 8x8 full", (1, 2, 4, 4, 16), (1, 2, 8, 8, 16), (1, 2, 8, 8, 16), Full(), "scale_front", "bhsd"),
]  # fmt: skip


def _converters() -> dict[str, Callable[[np.ndarray, str], Any]]:
    """NumPy -> framework converters for the frameworks installed here (CPU)."""
    conv: dict[str, Callable[[np.ndarray, str], Any]] = {"numpy": lambda a, dt: a.astype(numpy_dtype(dt))}
    if importlib.util.find_spec("torch"):

        def to_torch(a: np.ndarray, dt: str) -> Any:
            import torch

            return torch.from_numpy(a).to(getattr(torch, dt))

        conv["torch"] = to_torch
    if importlib.util.find_spec("tensorflow"):

        def to_tf(a: np.ndarray, dt: str) -> Any:
            import tensorflow as tf

            with tf.device("/CPU:0"):
                return tf.cast(tf.constant(a), dt)

        conv["tensorflow"] = to_tf
    if importlib.util.find_spec("jax"):

        def to_jax(a: np.ndarray, dt: str) -> Any:
            import jax

            with jax.default_device(jax.devices("cpu")[0]):
                return jax.numpy.asarray(a.astype(numpy_dtype(dt)))

        conv["jax"] = to_jax
    return conv


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().float().numpy()
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        return np.asarray(x.numpy(), dtype=np.float64)
    return np.asarray(x, dtype=np.float64)


@click.command()
@click.option("--dtype", default="float32", show_default=True, help="dtype of the demo inputs")
@click.option("--seed", default=0, show_default=True)
def demo(dtype: str, seed: int) -> None:
    """Run attention through auto dispatch on every CPU framework here; report backend and error."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out
    console = Console(width=max(Console().width, 100))
    rng = np.random.default_rng(seed)
    table = Table(title=f"attnhub demo: {escape(dtype)}, auto dispatch; max err = max|out - ref| / max|ref|")
    for col in ("framework", "request", "backend", "out shape", "max err"):
        table.add_column(col, no_wrap=True)
    worst = 0.0
    for fw, convert in _converters().items():
        for label, qs, ks, vs, mask, sync, layout in REQUESTS:
            q, k, v = (rng.standard_normal(s) for s in (qs, ks, vs))
            q, k, v = (x.astype(numpy_dtype(dtype)).astype(np.float64) for x in (q, k, v))
            ref = attnhub.attention(q, k, v, mask=mask, sync=sync, layout=layout, backend="reference")
            args = [convert(x, dtype) for x in (q, k, v)]
            chosen = attnhub.explain(*args, mask=mask, sync=sync, layout=layout).chosen
            out = attnhub.attention(*args, mask=mask, sync=sync, layout=layout)
            err = float(np.max(np.abs(_to_numpy(out) - ref)) / np.max(np.abs(ref)))
            worst = max(worst, err)
            table.add_row(
                *(escape(cell) for cell in (fw, label, str(chosen), str(tuple(out.shape)), f"{err:.2e}"))
            )
    console.print(table)
    console.print("Every backend registered here: " + escape(", ".join(
        f"{r.name} ({'available' if r.available else 'unavailable: ' + str(r.reason)})" for r in attnhub.backends()
    )))  # fmt: skip
    if not np.isfinite(worst) or worst > 1e-2:
        raise click.ClickException(f"largest error {worst:.2e} is too large")
