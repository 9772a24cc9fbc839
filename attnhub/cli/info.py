"""``attnhub info``: every backend (available or why not), or with ``--settings`` every setting."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnhub import settings
from attnhub.api import BackendRecord, backends
from attnhub.registry import REGISTRY


@click.command()
@click.option("--errors/--no-errors", default=True, help="Show plugin load errors with tracebacks.")
@click.option(
    "--settings",
    "show_settings",
    is_flag=True,
    help="List every ATTNHUB_* environment variable instead: audience, default, meaning, value here.",
)
def info(errors: bool, show_settings: bool) -> None:
    """List every backend: available or why not, version, priority, what it accepts."""
    console = Console()
    if show_settings:
        console.print(settings_table())
        return
    table = Table(title="attnhub backends")
    for col in ("backend", "priority", "status", "version"):
        table.add_column(col, overflow="fold")
    records = backends()
    for r in records:
        table.add_row(escape(r.name), str(r.priority), _status(r), escape(r.version or "-"))
    console.print(table)
    for r in records:
        console.print(
            f"[bold]{escape(r.name)}[/]: "
            + escape(
                f"frameworks {', '.join(r.frameworks)}; devices {', '.join(r.device_types)}; "
                f"dtypes {', '.join(r.dtypes)}; features {', '.join(r.features)}"
            ),
            highlight=False,
        )
    if REGISTRY.load_errors:
        console.print("[red bold]Plugins that failed to load[/] (every other backend keeps working):")
        for e in REGISTRY.load_errors:
            console.print(f"  [red]{escape(e.plugin)}[/]: {escape(e.error)}")
            if errors:
                console.print(e.detail, markup=False, highlight=False)


def _status(record: BackendRecord) -> str:
    """A backend's status cell as rich markup; the reason is escaped (install hints hold brackets)."""
    status = (
        "[green]available[/]" if record.available else f"[red]unavailable[/]: {escape(str(record.reason))}"
    )
    if record.disabled:
        status += " [yellow](disabled by ATTNHUB_DISABLE)[/]"
    return status


def _shown(value: Any) -> str:
    """A setting's default as a user would write it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (frozenset, set, tuple, list)):
        return (
            ",".join(str(x) for x in (sorted(value) if isinstance(value, (frozenset, set)) else value)) or "-"
        )
    return str(value)


def settings_table() -> Table:
    """Every declared setting, user ones first: name, audience, default, meaning, value if set here."""
    table = Table(title="attnhub settings (environment variables); dev settings may change between releases")
    table.add_column("setting", no_wrap=True)
    for col in ("audience", "default", "meaning", "set here"):
        table.add_column(col, overflow="fold")
    from attnhub.registry import REGISTRY

    REGISTRY.backends()  # loads the backends' packages, which declare their dev settings
    ordered = sorted(settings.SETTINGS.values(), key=lambda s: s.audience != "user")  # stable: declared order
    for s in ordered:
        meaning = s.meaning + (f" ({s.expects})" if s.expects else "")
        text = settings.raw(s.name)
        if text is None:
            current = "-"
        else:
            try:
                settings.value(s.name)
                current = escape(text)
            except settings.SettingError as exc:
                current = f"{escape(text)} [red](invalid: {escape(str(exc))})[/]"
        table.add_row(s.name, s.audience, escape(_shown(s.default)), escape(meaning), current)
    return table
