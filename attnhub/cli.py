"""The ``attnhub`` command line: info, explain, demo, show-mask, and the lazily loaded certify/bench."""

from __future__ import annotations

import importlib

import click

#: Subcommands that live in their own modules, imported only when used: name -> "module:attribute".
LAZY_COMMANDS = {
    "info": "attnhub.cli_info:info",
    "explain": "attnhub.cli_info:explain_cmd",
    "demo": "attnhub.demo:demo",
    "show-mask": "attnhub.show_mask:show_mask",
    "certify": "attnhub_conformance.cli:certify",
    "bench": "attnhub.bench.cli:bench",
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


if __name__ == "__main__":
    main()
