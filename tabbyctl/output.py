"""Rendering for tabbyctl: rich tables for people, JSON/YAML for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

OUTPUT_FORMATS = ("table", "json", "yaml")

output_option = click.option(
    "-o",
    "--output",
    "output",
    type=click.Choice(OUTPUT_FORMATS),
    default="table",
    show_default=True,
    help="Output format.",
)


def emit_data(data: Any, output: str) -> None:
    """Print data as JSON or YAML (for -o json|yaml)."""
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def emit_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows as a boxed table, like calicoctl's."""
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(width=max(120, _terminal_width())).print(table)


def _terminal_width() -> int:
    try:
        import shutil

        return shutil.get_terminal_size().columns
    except OSError:
        return 120


class CliError(click.ClickException):
    """An error a person can act on: printed as 'Error: ...' with exit code 2 by default."""

    exit_code = 2


def fail(message: str, code: int = 2) -> None:
    """Stop with 'Error: message' and exit code `code` (2: bad input, 1: found problems)."""
    error_type = type("CliError", (CliError,), {"exit_code": code})
    raise error_type(message)


def warn(message: str) -> None:
    click.echo(f"Warning: {message}", err=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
