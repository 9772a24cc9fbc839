"""The ``attnhub`` command line: one module per command, each imported only when it is used.

``info`` (:mod:`.info`), ``explain`` (:mod:`.explain`), ``demo`` (:mod:`.demo`), ``show-mask``
(:mod:`.show_mask`), ``bench`` (:mod:`.bench`), ``tune`` (:mod:`.tune`), ``warmup`` (:mod:`.warmup`)
and ``certify``, which belongs to the conformance suite (:mod:`attnhub_conformance.cli`).
``python -m attnhub.cli`` runs the same command.
"""

from __future__ import annotations

import importlib

import click

#: Subcommands that live in their own modules, imported only when used: name -> "module:attribute".
LAZY_COMMANDS = {
    "info": "attnhub.cli.info:info",
    "explain": "attnhub.cli.explain:explain_cmd",
    "demo": "attnhub.cli.demo:demo",
    "show-mask": "attnhub.cli.show_mask:show_mask",
    "certify": "attnhub_conformance.cli:certify",
    "bench": "attnhub.cli.bench:bench",
    "tune": "attnhub.cli.tune:tune",
    "warmup": "attnhub.cli.warmup:warmup",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use, keeping ``attnhub --help`` fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name].split(":")
            try:
                return getattr(importlib.import_module(module), attr)
            except ImportError as exc:
                return _missing(name, exc)
        return super().get_command(ctx, name)


def _missing(name: str, exc: ImportError) -> click.Command:
    @click.command(name=name, help=f"(unavailable: {exc})")
    def _cmd() -> None:
        raise click.ClickException(f"'attnhub {name}' is unavailable: {exc}")

    return _cmd


@click.group(cls=LazyGroup)
@click.version_option(package_name="attnhub")
def main() -> None:
    """attnhub: exact attention on any framework, dispatched to the best backend."""
