"""A Keras 3 layer that calls :func:`attnhub.attention`: ``attnhub.keras.DotProductAttention``.

The layer has no weights: it takes already projected ``query``, ``key`` and ``value`` and returns
the attention output in the same layout. It runs on whichever Keras backend is active (TensorFlow,
JAX or torch arrays all dispatch through attnhub) and is serialisable (``get_config`` and
``keras.saving.register_keras_serializable(package="attnhub")``), so models using it round-trip
through ``model.save`` / ``keras.models.load_model``.

Importing this module imports Keras; ``import attnhub`` alone does not.
"""

from __future__ import annotations

from typing import Any

import keras

from attnhub.api import attention
from attnhub.errors import SpecError
from attnhub.rules import Causal, Full, Local, Rule

__all__ = ["DotProductAttention", "rule_from_config", "rule_to_config"]


def rule_to_config(rule: Rule | str | None) -> dict[str, Any]:
    """A JSON-able description of a rule (``None``/``"full"``/``"causal"``/Full/Causal/Local)."""
    if rule is None or rule == "full" or isinstance(rule, Full):
        return {"rule": "full"}
    if rule == "causal" or isinstance(rule, Causal):
        return {"rule": "causal"}
    if isinstance(rule, Local):
        w = rule.window
        return {
            "rule": "local",
            "window": list(w) if isinstance(w, tuple) else w,
            "log2_stride": rule.log2_stride,
            "causal": rule.causal,
        }
    raise SpecError("mask", "None, 'full', 'causal', Full(), Causal() or Local(...)", rule)


def rule_from_config(cfg: dict[str, Any] | Rule | str | None) -> Rule:
    """Inverse of :func:`rule_to_config` (rule objects and names pass through)."""
    if not isinstance(cfg, dict):
        cfg = rule_to_config(cfg)
    kind = cfg.get("rule")
    if kind == "full":
        return Full()
    if kind == "causal":
        return Causal()
    if kind == "local":
        w = cfg["window"]
        return Local(
            tuple(w) if isinstance(w, list) else w, int(cfg.get("log2_stride", 0)), bool(cfg.get("causal"))
        )
    raise SpecError("mask", "a rule config with rule 'full', 'causal' or 'local'", cfg)


@keras.saving.register_keras_serializable(package="attnhub")
class DotProductAttention(keras.layers.Layer):
    """Exact scaled-dot-product attention through attnhub, as a weightless Keras layer.

    Args:
        mask: the rule: ``None``/``"full"``, ``"causal"``, ``Full()``, ``Causal()``, ``Local(...)``
            or its config dict (see :func:`rule_to_config`).
        sync: SPEC sync mode (``"none_front"``, ``"scale_front"``, ``"scale_end"``, ``"none_end"``).
        scale: logit scale; ``None`` is ``1/sqrt(Dqk)``.
        layout: ``"bhsd"``, ``"bshd"`` or ``"bhds"`` (for query, key, value and the output).
        backend: attnhub backend name or ``"auto"``.

    Call: ``layer(query, key, value, attention_mask=None)``; ``attention_mask`` is an optional
    explicit mask (boolean, True = attend, or additive float), broadcastable to (B, Hq, Nq, Nk),
    used instead of the rule.
    """

    def __init__(
        self,
        mask: Any = None,
        sync: str = "none_front",
        scale: float | None = None,
        layout: str = "bhsd",
        backend: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rule = rule_from_config(mask)
        self.sync = sync
        self.scale = None if scale is None else float(scale)
        self.layout = layout
        self.backend_name = backend

    def call(self, query: Any, key: Any, value: Any, attention_mask: Any = None) -> Any:
        mask = self.rule if attention_mask is None else attention_mask
        kwargs = dict(
            mask=mask, sync=self.sync, scale=self.scale, layout=self.layout, backend=self.backend_name
        )
        if keras.config.backend() == "tensorflow" and query.shape[0] is None:
            return _per_example(query, key, value, attention_mask, kwargs)
        return attention(query, key, value, **kwargs)

    def compute_output_shape(self, query_shape, key_shape, value_shape, attention_mask_shape=None):
        return _out_shape(self.layout, tuple(query_shape), tuple(value_shape))

    def compute_output_spec(self, query, key, value, attention_mask=None):
        shape = self.compute_output_shape(query.shape, key.shape, value.shape)
        return keras.KerasTensor(shape, dtype=query.dtype)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            mask=rule_to_config(self.rule),
            sync=self.sync,
            scale=self.scale,
            layout=self.layout,
            backend=self.backend_name,
        )
        return config


def _out_shape(layout: str, query_shape: tuple, value_shape: tuple) -> tuple:
    if layout == "bhds":
        return (*query_shape[:2], value_shape[2], *query_shape[3:])
    return (*query_shape[:-1], value_shape[-1])


def _per_example(query: Any, key: Any, value: Any, attention_mask: Any, kwargs: dict[str, Any]) -> Any:
    """TensorFlow graphs with an unknown batch size (``model.fit``): attention per example.

    attnhub needs static shapes; every example has them, so ``tf.map_fn`` runs the attention on
    each one (a batch of 1) and stacks the results. A mask with batch size 1 is shared.
    """
    import tensorflow as tf

    per_example_mask = (
        attention_mask is not None and len(attention_mask.shape) == 4 and attention_mask.shape[0] != 1
    )

    def one(args: tuple) -> Any:
        q, k, v, *m = args
        mask = m[0][None] if m else kwargs["mask"]
        return attention(q[None], k[None], v[None], **dict(kwargs, mask=mask))[0]

    elems = (query, key, value, attention_mask) if per_example_mask else (query, key, value)
    spec = tf.TensorSpec(
        _out_shape(kwargs["layout"], tuple(query.shape), tuple(value.shape))[1:], query.dtype
    )
    return tf.map_fn(one, elems, fn_output_signature=spec)
