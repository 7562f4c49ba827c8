"""The book's short labels for what the code names by what it is: the run modes of
`gpuinfer.decode.runners` (V4 ... V9) and the decode loops of `gpuinfer.decode.loops`
(V0 ... V2L). The chapters' tables, figures and glued names show these labels; the code keys
everything by its own names, so a label changes here and nowhere else."""

from __future__ import annotations

# Mode.name -> the chapters' short label (Chapter 3 numbers on from Chapter 2's loops)
MODE_SHORT = {
    "eager": "V4",
    "eager_graph": "V5",
    "compiled": "V6",
    "compiled_graph": "V7",
    "compiled_trees": "V8",
    "compiled_graph_pdl": "V9",
}

# a key of gpuinfer.decode.loops.LOOPS -> its row label in Chapter 2
LOOP_LABELS = {
    "naive": "V0 naive",
    "kv_cache": "V1 KV cache",
    "no_sync": "V2 no sync",
    "static_cache": "V2s static cache",
    "lean": "V2L lean loop",
}


def short_label(mode) -> str:
    """The mode's short label ("V9"); a mode the book does not number keeps its name."""
    return MODE_SHORT.get(mode.name, mode.name)


def mode_label(mode) -> str:
    """The mode's label in the chapters' tables: "V9: compiled with PDL, CUDA graph by
    hand" (the short label, then `Mode.words`, which name every option set)."""
    return f"{short_label(mode)}: {mode.words}"


def is_naive_loop(variant: str) -> bool:
    """Whether a results row's variant is Chapter 2's naive loop ("V0 naive", "V0 …"), the
    row the others' "× V0" figures divide."""
    return variant.split(" ")[0] == LOOP_LABELS["naive"].split(" ")[0]


def loop_label(name: str) -> str:
    """The row label of the loop `name` (a key of `LOOPS`): "V2L lean loop"."""
    if name not in LOOP_LABELS:
        raise KeyError(f"loop {name!r} has no label: one of {list(LOOP_LABELS)}")
    return LOOP_LABELS[name]
