"""One table description, drawn two ways: a rich Table for the terminal, Markdown for files.

    spec = TableSpec(title="Heads", columns=(Column("variant"), Column("dead", numeric=True)),
                     rows=[("mha", "0"), ("mha", "1")], legend="dead = ...", grouped=1)
    out.print(to_rich(spec));  Path("report.md").write_text(to_markdown(spec))

Every section of every verb is a TableSpec built once from a document (a report, the pick
or compress document): the terminal table and the Markdown table then cannot drift apart.
Cells are strings, formatted by the section with `fmt`; this module formats nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.table import Table

# narrow tables: one space between columns (the box's divider), title and caption left
COMPACT = {"box": box.SIMPLE_HEAD, "pad_edge": False, "padding": 0,
           "title_justify": "left", "caption_justify": "left"}


def fmt(x, spec: str = ".1f") -> str:
    """A number as a cell: `-` for a missing one."""
    return "-" if x is None else format(x, spec)


@dataclass(frozen=True)
class Column:
    """A column: its name (the Markdown header), a shorter terminal header where the name
    is too wide for 80 columns, and whether it holds numbers (right-justified, never
    wrapped, so that a narrow terminal folds names rather than cutting figures)."""

    name: str
    header: str | None = None
    numeric: bool = False

    @property
    def short(self) -> str:
        return self.header or self.name


@dataclass(frozen=True)
class TableSpec:
    """A titled table with a legend. `grouped`: the first n cells of a row are shown only
    where they differ from the row above (a variant and its layer named once); `sections`:
    a rule between rows whose first cell differs (rich only)."""

    columns: tuple[Column, ...]
    rows: Sequence[Sequence[str]]
    title: str = ""
    legend: str = ""
    grouped: int = 0
    sections: bool = False
    bold: Sequence[int] = field(default_factory=tuple)  # indices of rows shown in bold

    def shown_rows(self) -> list[list[str]]:
        """The rows as displayed: grouped cells blanked where they repeat."""
        shown, last = [], None
        for row in self.rows:
            key = list(row[:self.grouped])
            cells = list(row)
            if last is not None:
                for i in range(self.grouped):
                    if key[:i + 1] != last[:i + 1]:
                        break
                    cells[i] = ""
            shown.append(cells)
            last = key
        return shown


def columns(*names: str, numeric: Iterable[str] = ()) -> tuple[Column, ...]:
    """Columns by name; those in `numeric` right-justified."""
    numeric = set(numeric)
    return tuple(Column(n, numeric=n in numeric) for n in names)


def to_rich(spec: TableSpec, **style) -> Table:
    """The terminal table: compact, the legend as its caption."""
    table = Table(title=spec.title or None, caption=spec.legend or None,
                  **{**COMPACT, **style})
    for col in spec.columns:
        if col.numeric:
            table.add_column(col.short, justify="right", min_width=len(col.short),
                             no_wrap=True)
        else:
            table.add_column(col.short, overflow="fold")
    first = None
    for i, cells in enumerate(spec.shown_rows()):
        if spec.sections and first is not None and spec.rows[i][0] != first:
            table.add_section()
        first = spec.rows[i][0]
        table.add_row(*cells, style="bold" if i in spec.bold else None)
    return table


def markdown_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines (no title): header, rule, one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def to_markdown(spec: TableSpec, level: int = 2) -> str:
    """The Markdown section: a heading, the legend as a sentence, the table (bold rows
    bold in every cell), a blank line after."""
    rows = [[f"**{c}**" if i in spec.bold and c else c for c in cells]
            for i, cells in enumerate(spec.shown_rows())]
    lines = [f"{'#' * level} {spec.title}", ""] if spec.title else []
    if spec.legend:
        lines += [spec.legend.rstrip(".") + ".", ""]
    lines += markdown_rows([c.name for c in spec.columns], rows)
    return "\n".join(lines) + "\n"
