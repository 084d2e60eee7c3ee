"""Tables for people: one look for every table the package prints
(`jaxlake bench`, `replay`, `memory_report()`, the view's summary)."""

from __future__ import annotations

import io
from typing import Optional, Sequence


def format_table(rows: Sequence[Optional[Sequence[str]]],
                 header: Sequence[str], left: int = 1) -> str:
    """Plain text of a table drawn by rich: `header`, then `rows` (lists of
    cells; None draws a rule between groups). The first `left` columns are
    left-aligned, the others right-aligned. Any number of columns."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1), header_style="", expand=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < left else "right",
                         no_wrap=True)
    pending_rule = False
    for row in rows:
        if row is None:
            pending_rule = True
            continue
        if pending_rule:
            table.add_section()
            pending_rule = False
        table.add_row(*row)
    text = io.StringIO()
    Console(file=text, width=1000, color_system=None, force_terminal=False,
            legacy_windows=False).print(table)
    # (a section is a blank line in this box style)
    return "\n".join(line.rstrip()
                     for line in text.getvalue().splitlines()).strip("\n")
