"""``attnhub explain``: for a request given by shapes, which backend runs it and why the others do not."""

from __future__ import annotations

import dataclasses

import click

from attnhub.cli.options import MASKS, SYNCS, parse_mask_option
from attnhub.dispatch import explain_request
from attnhub.errors import AttnhubError, SpecError
from attnhub.modifiers.softcap import softcap_float
from attnhub.positions import check_position_range
from attnhub.request import Request
from attnhub.shapes import parse_shape, request_from_shapes


@click.command(name="explain")
@click.option("--q", "q_shape", required=True, help="q shape, e.g. 2,8,1024,64 (layout order)")
@click.option("--k", "k_shape", required=True, help="k shape")
@click.option("--v", "v_shape", default=None, help="v shape (default: k's)")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--framework", default="torch", show_default=True)
@click.option("--device", default="cuda:0", show_default=True)
@click.option("--mask", default="full", type=MASKS, show_default=True)
@click.option("--window", default=None, help="local window (int, or YxX for 2-d)")
@click.option("--log2-stride", default=0, show_default=True)
@click.option("--sync", default="none_front", type=SYNCS, show_default=True)
@click.option("--layout", default="bhsd", type=click.Choice(["bhsd", "bshd", "bhds"]), show_default=True)
@click.option("--grad", is_flag=True, help="the request needs gradients")
@click.option("--lse", is_flag=True, help="the request returns lse")
@click.option("--backend", default="auto", show_default=True)
@click.option(
    "--bias", "bias_shape", default=None, help="SPEC §9: an additive bias of this shape, e.g. 1,8,1024,1024"
)
@click.option("--bias-grad", is_flag=True, help="the bias requires grad (dbias)")
@click.option("--softcap", default=None, type=float, help="SPEC §9: logit softcap")
@click.option("--sinks", is_flag=True, help="SPEC §9: attention sinks (with --grad: their gradient too)")
@click.option(
    "--lengths", type=click.Choice(["q", "k", "qk"]), default=None, help="SPEC §10: q_lengths/k_lengths given"
)
@click.option("--padding-side", default="right", type=click.Choice(["right", "left"]), show_default=True)
@click.option("--varlen", is_flag=True, help="SPEC §10: packed sequences (attention_varlen)")
@click.option("--paged", default=0, show_default=True, help="SPEC §10: paged KV cache block size (0: none)")
@click.option("--q-offset", default=0, show_default=True, help="SPEC §11")
@click.option("--k-offset", default=0, show_default=True, help="SPEC §11")
def explain_cmd(
    q_shape,
    k_shape,
    v_shape,
    dtype,
    framework,
    device,
    mask,
    window,
    log2_stride,
    sync,
    layout,
    grad,
    lse,
    backend,
    bias_shape,
    bias_grad,
    softcap,
    sinks,
    lengths,
    padding_side,
    varlen,
    paged,
    q_offset,
    k_offset,
) -> None:  # noqa: E501
    """For a request given by shapes: which backend runs it and why the others do not."""
    try:
        req = request_from_shapes(
            parse_shape(q_shape),
            parse_shape(k_shape),
            parse_shape(v_shape or k_shape),
            dtype=dtype,
            framework=framework,
            device=device,
            mask=parse_mask_option(mask, window, log2_stride),
            sync=sync,
            layout=layout,
            needs_grad=grad,
            return_lse=lse,
        )
        req = with_modifiers(
            req,
            bias_shape,
            bias_grad,
            softcap,
            sinks,
            lengths,
            padding_side,
            varlen,
            paged,
            q_offset,
            k_offset,
        )
    except AttnhubError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(explain_request(req, backend, probe_all=True)))


def with_modifiers(
    req: Request, bias_shape: str | None, bias_grad: bool, softcap: float | None, sinks: bool,
    lengths: str | None, padding_side: str, varlen: bool, paged: int, q_offset: int, k_offset: int,
) -> Request:  # fmt: skip
    """``req`` with the SPEC §9-§11 fields the options describe, validated as the API would."""
    bias = None
    if bias_shape is not None:
        shape = parse_shape(bias_shape)
        target = (req.batch, req.heads_q, req.nq, req.nk)
        full = (1,) * (4 - len(shape)) + tuple(shape)
        if len(shape) > 4 or any(h not in (1, w) for h, w in zip(full, target)):
            raise SpecError("bias.shape", f"broadcastable to (B, Hq, Nq, Nk) = {target}", shape)
        bias = full
    if (lengths or varlen or paged or q_offset or k_offset) and req.ndim != 1:
        raise SpecError(
            "lengths/varlen/paged/offsets", "only with 1-d sequences (SPEC §10-§11)", "a 2-d sequence"
        )
    if (q_offset or k_offset) and req.sync != "none_front":
        raise SpecError("sync", "none_front with q_offset/k_offset (SPEC §11)", req.sync)
    check_position_range(req.seq_q, req.seq_k, q_offset, k_offset)
    return dataclasses.replace(
        req, bias=bias, bias_grad=bias_grad and bias is not None, softcap=softcap_float(softcap),
        sinks=sinks, sinks_grad=sinks and req.needs_grad, q_lengths=bool(lengths and "q" in lengths),
        k_lengths=bool(lengths and "k" in lengths) or bool(paged), padding_side=padding_side,
        varlen=varlen, paged=paged, q_offset=q_offset, k_offset=k_offset,
    )  # fmt: skip
