"""A MkDocs hook: the command-line reference written from the commands themselves.

A page holding the line ``<!-- eventbus-cli-help -->`` gets, in its place, one section per
command of ``eventbus`` (groups first, then their commands) with its ``--help`` text, so the
page cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

MARKER = "<!-- eventbus-cli-help -->"
WIDTH = 100


def _commands(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Context, click.Command]]:
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def _section(ctx: click.Context, cmd: click.Command) -> str:
    path = ctx.command_path
    level = "#" * min(2 + path.count(" "), 4)
    return f"{level} `{path}`\n\n```text\n{cmd.get_help(ctx).rstrip()}\n```\n"


def cli_help() -> str:
    from eventbus.cli import cli

    root = click.Context(cli, info_name="eventbus", terminal_width=WIDTH, max_content_width=WIDTH)
    return "\n".join(_section(ctx, cmd) for ctx, cmd in _commands(cli, root))


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, cli_help()) if MARKER in markdown else markdown
