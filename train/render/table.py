"""One table description, drawn two ways: a rich Table for the terminal, Markdown for files.

    spec = TableSpec(title="Heads", columns=(Column("variant"), Column("dead", numeric=True)),
                     rows=[("mha", "0"), ("mha", "1")], legend="dead = ...", grouped=1)
    out.print(to_rich(spec));  Path("report.md").write_text(to_markdown(spec))

Every section of every verb is a TableSpec built once from a document (a report, the pick
or compress document): the terminal table and the Markdown table then cannot drift apart.
Cells are strings, formatted by the section with `fmt`; this module formats nothing. Where
the two media differ on purpose (80 columns against a document read row by row), the spec
says how: a column's shorter terminal header and `terse` cells, columns shown in one medium
only, a Markdown heading and legend of its own, repeated names blanked in the terminal alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from rich import box
from rich.table import Table

# narrow tables: one space between columns (the box's divider), title and caption left
COMPACT = {"box": box.SIMPLE_HEAD, "pad_edge": False, "padding": 0,
           "title_justify": "left", "caption_justify": "left"}
# rich's own defaults, for a summary read as a whole: a boxed table with padded cells, and
# names and wrapping numbers cut with an ellipsis where the terminal is too narrow
BOXED = {"box": box.HEAVY_HEAD, "pad_edge": True, "padding": (0, 1),
         "title_justify": "center", "caption_justify": "center", "overflow": "ellipsis"}


def fmt(x, spec: str = ".1f") -> str:
    """A number as a cell: `-` for a missing one."""
    return "-" if x is None else format(x, spec)


@dataclass(frozen=True)
class Column:
    """A column: its name (the Markdown header), a shorter terminal header where the name
    is too wide for 80 columns, and whether it holds numbers (right-justified, never
    wrapped, so that a narrow terminal folds names rather than cutting figures; `wrap`:
    numbers under a header long enough that the header should wrap instead).

    `terse`: the terminal's shorter form of a cell ("over" for "over-provisioned"), as
    `header` is of the name; `terminal`/`markdown`: whether the column is shown there (a
    column the terminal folds into another to fit 80 columns is Markdown only)."""

    name: str
    header: str | None = None
    numeric: bool = False
    terse: Callable[[str], str] | None = None
    terminal: bool = True
    markdown: bool = True
    wrap: bool = False

    @property
    def short(self) -> str:
        return self.header or self.name


@dataclass(frozen=True)
class TableSpec:
    """A titled table with a legend. `grouped`: the first n cells of a row are shown only
    where they differ from the row above (a variant and its layer named once), in the
    terminal and, unless `grouped_in_markdown` is false, in Markdown (a document whose rows
    are read, and grepped, one by one); `sections`: a rule between rows whose first cell
    differs (rich only). `heading` and `markdown_legend`: the Markdown section's own
    heading and legend sentence where they differ from the terminal's title and caption
    (None: the same; "": none)."""

    columns: tuple[Column, ...]
    rows: Sequence[Sequence[str]]
    title: str = ""
    legend: str = ""
    grouped: int = 0
    sections: bool = False
    bold: Sequence[int] = field(default_factory=tuple)  # indices of rows shown in bold
    heading: str | None = None
    markdown_legend: str | None = None
    grouped_in_markdown: bool = True

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


def to_rich(spec: TableSpec, *, overflow: str = "fold", **style) -> Table:
    """The terminal table: compact (or `style`: rich Table options such as BOXED), the
    legend as its caption, the terminal's columns with their short headers and terse cells.
    `overflow`: what a name (or a wrapping number) too wide for its column does: fold onto
    the next line, whole, or be cut ("ellipsis")."""
    table = Table(title=spec.title or None, caption=spec.legend or None,
                  **{**COMPACT, **style})
    shown = [i for i, col in enumerate(spec.columns) if col.terminal]
    for i in shown:
        col = spec.columns[i]
        if col.numeric and not col.wrap:
            table.add_column(col.short, justify="right", min_width=len(col.short),
                             no_wrap=True)
        else:
            table.add_column(col.short, justify="right" if col.numeric else "left",
                             overflow=overflow)
    first = None
    for r, cells in enumerate(spec.shown_rows()):
        if spec.sections and first is not None and spec.rows[r][0] != first:
            table.add_section()
        first = spec.rows[r][0]
        table.add_row(*(_terse(spec.columns[i], cells[i]) for i in shown),
                      style="bold" if r in spec.bold else None)
    return table


def _terse(col: Column, cell: str) -> str:
    return col.terse(cell) if col.terse is not None and cell else cell


def markdown_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines (no title): header, rule, one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def to_markdown(spec: TableSpec, level: int = 2) -> str:
    """The Markdown section: a heading, the legend as a sentence, the table (bold rows
    bold in every cell), ending with the newline of its last row."""
    shown = [i for i, col in enumerate(spec.columns) if col.markdown]
    rows = spec.shown_rows() if spec.grouped_in_markdown else [list(r) for r in spec.rows]
    rows = [[f"**{cells[i]}**" if r in spec.bold and cells[i] else cells[i] for i in shown]
            for r, cells in enumerate(rows)]
    heading = spec.title if spec.heading is None else spec.heading
    legend = spec.legend if spec.markdown_legend is None else spec.markdown_legend
    lines = [f"{'#' * level} {heading}", ""] if heading else []
    if legend:
        lines += [legend.rstrip(".") + ".", ""]
    lines += markdown_rows([spec.columns[i].name for i in shown], rows)
    return "\n".join(lines) + "\n"
