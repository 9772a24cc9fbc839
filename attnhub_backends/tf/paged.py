"""Paged KV caches (SPEC §10) for the ``tf`` backend: gather the blocks, scatter their gradients.

``attention_kvcache`` with a block table hands the backend the raw caches (num_blocks, block_size,
Hkv, D). Gathering each entry's blocks gives the contiguous (B, Hkv, max_blocks·block_size, D)
keys of a right-padded batch with ``k_lengths``, which the kernel already computes exactly; the
gradients of the gathered keys are summed back into the blocks they came from (a block shared by
several entries gets the sum). Block-table entries past an entry's length may hold anything
(e.g. -1): they are clipped into range, and the kernel never reads or differentiates those keys.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import tensorflow as tf

from attnhub.request import Request


def _num_blocks(cache: tf.Tensor) -> Any:
    n = cache.shape[0]
    return int(n) if n is not None else tf.shape(cache, out_type=tf.int32)[0]


def _table(cache: tf.Tensor, block_table: Any) -> tf.Tensor:
    top = _num_blocks(cache) - 1
    return tf.clip_by_value(tf.cast(block_table, tf.int32), 0, tf.maximum(top, 0))


def gather(cache: tf.Tensor, block_table: Any) -> tf.Tensor:
    """(B, Hkv, max_blocks·block_size, D) keys (or values) of every batch entry."""
    g = tf.gather(cache, _table(cache, block_table))  # (B, max_blocks, block_size, Hkv, D)
    b, mb, bs, h, d = (int(x) for x in g.shape)
    return tf.transpose(tf.reshape(g, (b, mb * bs, h, d)), (0, 2, 1, 3))


def scatter(grad: tf.Tensor, cache: tf.Tensor, block_table: Any) -> tf.Tensor:
    """The gradient of ``cache`` from that of its gathered form (the inverse of :func:`gather`).

    ``unsorted_segment_sum`` keeps the backend deterministic: TensorFlow's GPU segment reductions
    use a sorted, atomics-free kernel unless ``TF_USE_ATOMIC_SEGMENT_REDUCTIONS=1`` is set.
    """
    bs, h, d = (int(x) for x in cache.shape[1:])
    table = _table(cache, block_table)
    parts = tf.reshape(tf.transpose(grad, (0, 2, 1, 3)), (-1, bs, h, d))  # (B·max_blocks, bs, H, D)
    return tf.math.unsorted_segment_sum(parts, tf.reshape(table, (-1,)), _num_blocks(cache))


def dense_request(req: Request) -> Request:
    """The request the kernel computes on the gathered keys: a right-padded batch with k_lengths."""
    assert req.k_lengths and req.padding_side == "right", req
    return replace(req, paged=0)
