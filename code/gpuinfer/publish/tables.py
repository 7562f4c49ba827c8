"""A docutils table, as the book's Sphinx directives return them (the datasheet, the
results at a glance, the reproduce page's tables)."""

from __future__ import annotations

from docutils import nodes


def table(header: list[str], rows: list[list],
          classes: tuple[str, ...] = ()) -> nodes.table:
    """A docutils table; a cell is a string or a node."""
    tgroup = nodes.tgroup(cols=len(header))
    tgroup += [nodes.colspec(colwidth=1) for _ in header]

    def row(cells):
        tr = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", cell if isinstance(cell, nodes.Node)
                                     else nodes.Text(str(cell)))
            tr += entry
        return tr

    tgroup += nodes.thead("", row(header))
    tgroup += nodes.tbody("", *[row(r) for r in rows])
    return nodes.table("", tgroup, classes=list(classes))
