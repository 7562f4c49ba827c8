"""Author-year labels for the references page: a Sphinx extension (listed in _config.yml).

The references page labels each entry by author and year ("Williams et al., 2009"), as the
chapters cite it, instead of pybtex's alpha labels ("WWP09"): the bibliography style
`author_year_labels` (named in _config.yml), registered with pybtex when this loads.
"""

from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def author_year(entry) -> str:
    """"Williams et al., 2009": the first author's last name (with "and" the second's, when
    there are two), and the year. A corporate author written in braces ({NVIDIA}) is kept
    whole; LaTeX accents become Unicode."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [Text.from_latex(" ".join(p.last_names) or " ".join(p.first_names))
             .render_as("text") for p in people]
    if len(names) > 2 or (people and str(people[-1]) == "others"):
        who = f"{names[0]} et al."
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = names[0] if names else entry.fields.get("title", entry.key)
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    """Author-year labels; the same label twice gets a, b, ... after the year ("n.d.-a" for
    an undated one, as APA writes it)."""

    def format_labels(self, sorted_entries):
        labels = [author_year(e) for e in sorted_entries]
        total, seen = Counter(labels), Counter()
        for label in labels:
            seen[label] += 1
            suffix = chr(ord("a") + seen[label] - 1) if total[label] > 1 else ""
            yield label + ("-" + suffix if suffix and label.endswith("n.d.") else suffix)


class AuthorYearStyle(PlainStyle):
    """pybtex's plain style (sorted by author, year, title) with `AuthorYearLabels`."""

    default_label_style = AuthorYearLabels


register_plugin("pybtex.style.formatting", "author_year_labels", AuthorYearStyle)


def setup(app):
    return {"parallel_read_safe": True, "parallel_write_safe": True}
