"""train/render/table.py: one table description drawn as a rich Table and as Markdown."""

from __future__ import annotations

from rich.console import Console

from train.render.table import BOXED, Column, TableSpec, columns, fmt, to_markdown, to_rich

ROWS = [("mha", "0", "softmax", "12.5"), ("mha", "0", "softmax", "3.0"),
        ("mha", "1", "softmax", "7.25"), ("ssm", "1", "ssm", "4.0")]


def spec(**kw) -> TableSpec:
    cols = (Column("variant"), Column("layer", numeric=True), Column("block"),
            Column("realized", "mean", numeric=True))
    return TableSpec(**{"columns": cols, "rows": ROWS, "title": "ranks",
                        "legend": "mean = rank_eps", **kw})


def text_of(table, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def md_rows(md: str) -> list[list[str]]:
    """The body rows of a Markdown table, as cells."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")][2:]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_fmt_says_dash_for_a_missing_number():
    assert fmt(None) == "-" and fmt(None, ".3g") == "-"
    assert fmt(2.345) == "2.3" and fmt(0.0012345, ".3g") == "0.00123" and fmt(0.0) == "0.0"


def test_grouped_cells_are_blank_where_they_repeat_the_row_above():
    shown = spec(grouped=2).shown_rows()
    assert shown == [["mha", "0", "softmax", "12.5"], ["", "", "softmax", "3.0"],
                     ["", "1", "softmax", "7.25"], ["ssm", "1", "ssm", "4.0"]]
    # a layer number that repeats under a new variant is still shown: the key is the prefix
    assert spec(grouped=2).shown_rows()[3][1] == "1"
    assert spec().shown_rows() == [list(r) for r in ROWS]


def test_markdown_groups_too_unless_told_to_keep_rows_whole():
    assert md_rows(to_markdown(spec(grouped=1)))[1][0] == ""
    whole = spec(grouped=2, grouped_in_markdown=False)
    assert md_rows(to_markdown(whole)) == [list(r) for r in ROWS]
    table = to_rich(whole)
    assert list(table.columns[0].cells) == ["mha", "", "", "ssm"]  # the terminal still groups


def test_sections_rule_off_rows_whose_first_cell_changes():
    table = to_rich(spec(sections=True))
    assert [row.end_section for row in table.rows] == [False, False, True, False]
    assert not any(row.end_section for row in to_rich(spec()).rows)


def test_bold_rows_in_both_media():
    table = to_rich(spec(bold=[3], grouped=1))
    assert [row.style for row in table.rows] == [None, None, None, "bold"]
    md = md_rows(to_markdown(spec(bold=[1], grouped=1)))
    assert md[1] == ["", "**0**", "**softmax**", "**3.0**"]  # a blank cell stays blank
    assert md[0] == ["mha", "0", "softmax", "12.5"]


def test_markdown_heading_and_legend_end_in_one_period():
    md = to_markdown(spec(legend="mean = rank_eps."))
    assert md.startswith("## ranks\n\nmean = rank_eps.\n\n| variant | layer |")
    assert "rank_eps.." not in md
    assert "mean = rank_eps.\n" in to_markdown(spec())  # the period is added when missing
    assert to_markdown(spec(), level=3).startswith("### ranks\n")
    assert md.endswith("| ssm | 1 | ssm | 4.0 |\n")


def test_markdown_may_have_its_own_heading_and_legend():
    md = to_markdown(spec(heading="Ranks per layer", markdown_legend="see the docs"))
    assert md.startswith("## Ranks per layer\n\nsee the docs.\n\n|")
    bare = to_markdown(spec(heading="", markdown_legend=""))
    assert bare.startswith("| variant | layer | block | realized |\n|---|---|---|---|\n")
    table = to_rich(spec(heading="Other"))
    assert table.title == "ranks" and table.caption == "mean = rank_eps"


def test_headers_short_in_the_terminal_whole_in_markdown():
    assert "| realized |" in to_markdown(spec())
    text = text_of(to_rich(spec()))
    assert " mean" in text and "realized" not in text


def test_numeric_columns_right_justified_and_never_cut():
    table = to_rich(spec())
    justify = {c.header: (c.justify, c.no_wrap, c.overflow) for c in table.columns}
    assert justify["mean"][:2] == justify["layer"][:2] == ("right", True)
    assert justify["variant"] == ("left", False, "fold")
    long = spec(rows=[("a-rather-long-variant-name", "11", "sliding_window", "123.25")])
    text = text_of(to_rich(long), width=30)
    assert "123.25" in text and "…" not in text  # the names fold, the number stays whole
    assert max(len(ln) for ln in text.splitlines()) <= 30


def test_wrapping_numbers_and_boxed_tables_cut_with_an_ellipsis():
    cols = (Column("variant"), Column("a long header", numeric=True, wrap=True))
    wrapping = TableSpec(columns=cols, rows=[("mha", "1.5")])
    column = to_rich(wrapping).columns[1]
    assert (column.justify, column.no_wrap, column.overflow) == ("right", False, "fold")
    boxed = to_rich(wrapping, **BOXED)
    assert boxed.columns[0].overflow == "ellipsis" and boxed.title_justify == "center"


def test_terse_cells_and_columns_of_one_medium():
    cols = (Column("variant"), Column("quantity", terminal=False),
            Column("state", terse=lambda q: q.removeprefix("inference."), markdown=False),
            Column("verdict", terse={"over-provisioned": "over"}.get))
    rows = [("mha", "inference.k", "inference.k", "over-provisioned")]
    both = TableSpec(columns=cols, rows=rows, grouped=1)
    table = to_rich(both)
    assert [c.header for c in table.columns] == ["variant", "state", "verdict"]
    assert [list(c.cells) for c in table.columns] == [["mha"], ["k"], ["over"]]
    md = to_markdown(both)
    assert "| variant | quantity | verdict |" in md
    assert md_rows(md) == [["mha", "inference.k", "over-provisioned"]]


def test_columns_by_name():
    cols = columns("variant", "layer", "util", numeric=("layer", "util"))
    assert [(c.name, c.numeric) for c in cols] == [("variant", False), ("layer", True),
                                                   ("util", True)]
