"""Chapter 6's diagrams: speculative decoding's mechanisms, one function a picture.

- `speculative_pass`: one pass with k = 3 proposals, in words a reader can follow. The
  draft proposes three tokens one step at a time; the target checks them in one verify
  pass over k + 1 tokens; the proposals are kept up to the first one the target would
  not have chosen, and the target's own choice there is committed too.
- `pass_timeline`: the same committed tokens timed three ways, to scale, from measured
  times: the target alone, step after step; a speculative pass (the draft's steps, then
  the verify pass); and the pass the roofline promises, whose verify costs one step.
- `program_timeline`: inside one program of a matrix-vector kernel, a step against a
  verify pass of T tokens: the weight tile is loaded once either way, but each token's
  multiply and reduction runs after the wait, one token after another.

Each returns a matplotlib figure drawn with the primitives of `gpuinfer.report.diagrams`;
the chapter places it with `image(fig, alt)` and a caption.
"""

from __future__ import annotations

from gpuinfer.report.diagrams import (AMBER, BLUE, GREEN, GREY, ORANGE, PINK, arrow, box,
                                      bracket, canvas, label, lane, span)

# points, as drawn at 7.5 in: the page shows a diagram at about 0.6 of that, so 11 pt is
# the smallest that stays legible there (about 9 px)
SMALL = 11
NAME = 11.5  # a row's or a lane's name, bold


def measure(ax, x0: float, x1: float, y: float, text: str, ha: str = "center") -> None:
    """A bracket from x0 to x1 at height y, `text` clear above its ticks: centred on it,
    or starting at its left end (ha="left") where a long text would leave the canvas."""
    bracket(ax, x0, x1, y, "")
    label(ax, (x0 + x1) / 2 if ha == "center" else x0, y + 0.12, text, size=SMALL, ha=ha,
          va="bottom", color="0.25")


def speculative_pass():
    """One speculative pass with k = 3 proposals, drawn on a sentence: the draft proposes
    "sat", "on", "a" after "the cat"; the target's choices are "sat", "on", "the", "mat";
    two proposals are accepted, the third is not, and the target's "the" is committed in
    its place, so the pass commits three tokens."""
    fig, ax = canvas(10, 6.8)
    w, h, step = 0.8, 0.55, 0.95  # a token's cell, its height, from one slot to the next
    notes = 7.35  # where the notes on the right begin

    def x(col):  # the left edge of slot col of the sequence, left to right
        return 1.95 + col * step

    def mid(col):
        return x(col) + w / 2

    def cell(col, y, text, color, alpha=0.25):
        box(ax, x(col), y, w, h, text, color=color, alpha=alpha, size=SMALL + 0.5)

    # Row labels on the left, one per stage of the pass
    rows = {5.85: "1. the draft,\n$k$ = 3 steps", 4.55: "the sequence",
            3.2: "2. the target,\none pass", 1.9: "its choice\nfor each slot",
            0.45: "3. committed"}
    for y, text in rows.items():
        label(ax, 0.08, y + h / 2, text, size=NAME, weight="bold")

    # The sequence: committed tokens (grey), then the draft's proposals (orange).
    for col, word in enumerate(["the", "cat", "sat", "on", "a"]):
        cell(col, 4.55, word, ORANGE if col >= 2 else GREY)
    label(ax, notes, 4.55 + h / 2, "grey: committed\norange: the\ndraft's proposals",
          size=SMALL)

    # The draft: one step per proposal, each reading the token before it (a step of a
    # small model: cheap, but not free).
    for i in range(3):
        box(ax, x(2 + i), 5.85, w, h, f"step {i + 1}", color=ORANGE, alpha=0.35,
            size=SMALL)
        arrow(ax, (mid(2 + i), 5.85), (mid(2 + i), 4.55 + h + 0.02))
        arrow(ax, (x(1 + i) + w * 0.75, 4.55 + h), (x(2 + i) + 0.08, 5.85), curve=-0.25,
              color=GREY)

    # The verify pass: one pass of the target over the last committed token and the k
    # proposals, its weights read once for all k + 1 of them.
    box(ax, x(1), 3.2, x(4) + w - x(1), 0.8,
        "verify pass, $k + 1$ = 4 tokens:\nthe weights read once",
        color=BLUE, alpha=0.25, size=SMALL + 0.5)
    for col in range(1, 5):
        arrow(ax, (mid(col), 4.55), (mid(col), 3.2 + 0.82))
        # the choice after the token in slot col is for slot col + 1: one slot right
        arrow(ax, (mid(col), 3.2), (mid(col + 1), 1.9 + h + 0.02), color=BLUE)

    # The target's choice for each slot, checked against the proposal in that slot.
    marks = {2: ("sat", "✓", GREEN), 3: ("on", "✓", GREEN), 4: ("the", "✗", PINK),
             5: ("mat", "dropped", "0.3")}
    for col, (word, mark, color) in marks.items():
        cell(col, 1.9, word, BLUE if col < 5 else GREY, alpha=0.25 if col < 5 else 0.1)
        label(ax, mid(col), 1.8, mark, size=SMALL + 2 if len(mark) == 1 else SMALL,
              ha="center", va="top", color=color, weight="bold")
    # the notes start right of "mat", the target's last choice
    label(ax, x(6) - 0.05, 1.9 + h / 2, "✓ the proposal\n✗ not the proposal:\n"
          "   “the”, not “a”", size=SMALL)

    # What the pass commits: the accepted proposals and the target's own next token.
    for col, word in enumerate(["the", "cat", "sat", "on", "the"]):
        cell(col, 0.45, word, GREY if col < 2 else GREEN if col < 4 else BLUE)
    measure(ax, x(2), x(4) + w, 0.45 + h + 0.16, "3 tokens: 2 accepted + the target's own")
    label(ax, notes, 0.45 + h / 2, "“a” stays in the cache\npast the new position,\n"
          "overwritten later", size=SMALL)
    return fig


def pass_timeline(*, k: int, tokens: float, step_us: float, draft_first_us: float,
                  draft_next_us: float, verify_us: float):
    """Three lanes on one time axis, to scale: the target alone taking `tokens` steps of
    `step_us` (as many tokens as a pass commits on average); the pass with k proposals,
    the draft's first step `draft_first_us`, its k - 1 next ones `draft_next_us` each,
    then the verify pass of k + 1 tokens `verify_us`; and the same pass with a verify
    that costs one step, what the roofline promises. Each lane's span is bracketed with
    its time and its speed-up over the first."""
    fig, ax = canvas(10, 4.6)
    x0, x1 = 2.2, 9.8  # the time axis, in canvas units
    alone_us = tokens * step_us
    draft_us = draft_first_us + (k - 1) * draft_next_us
    end = max(alone_us, draft_us + verify_us) * 1.02

    def t(us):
        return x0 + (x1 - x0) * us / end

    lanes = {3.35: "target alone", 1.9: f"speculative,\n$k$ = {k}",
             0.4: "if verify\ncost a step"}
    for y, name in lanes.items():
        lane(ax, y, 0.6, name, x0, x1, size=NAME)

    # The target alone: whole steps, then the fraction of one that makes up `tokens`.
    whole = int(tokens)
    for i in range(whole):
        span(ax, 3.35, 0.6, t(i * step_us), t((i + 1) * step_us),
             f"step: {step_us:.0f} µs", color=BLUE, size=SMALL)
    if tokens > whole:
        span(ax, 3.35, 0.6, t(whole * step_us), t(alone_us), "", color=BLUE, alpha=0.15,
             hatch="//")
    measure(ax, t(0), t(alone_us), 4.08, f"{tokens:.2f} tokens: {alone_us:.0f} µs", "left")

    # A speculative pass: the draft's steps are short, the verify pass is not.
    def draft_then(y, verify, text, alpha):
        span(ax, y, 0.6, t(0), t(draft_us), "", color=ORANGE, alpha=0.5)
        for i in range(1, k):  # the boundaries between the draft's steps
            edge = t(draft_first_us + (i - 1) * draft_next_us)
            ax.plot([edge, edge], [y, y + 0.6], color=ORANGE, linewidth=1)
        span(ax, y, 0.6, t(draft_us), t(draft_us + verify), text, color=BLUE,
             alpha=alpha, size=SMALL)
        total = draft_us + verify
        # left-aligned: the text runs past a short bracket rather than off the canvas
        measure(ax, t(0), t(total), y + 0.73,
                f"{tokens:.2f} tokens: {total:.0f} µs, {alone_us / total:.2f}× the target "
                "alone's speed", "left")

    draft_then(1.9, verify_us, f"verify {k + 1} tokens: {verify_us:.0f} µs", 0.3)
    label(ax, t(draft_us) + 0.05, 1.8, f"the draft's {k} steps: {draft_us:.0f} µs",
          size=SMALL, va="top", color=ORANGE)
    draft_then(0.4, step_us, f"verify = one step: {step_us:.0f} µs", 0.1)
    return fig


def program_timeline(*, tokens: int = 3, extra_token_us: float | None = None,
                     step_us: float | None = None):
    """One program of a matrix-vector kernel, schematic (not to scale): in a step it loads
    its weight tile before the wait for the kernel ahead (PDL), then multiplies and
    reduces one token; in a verify pass of `tokens` tokens it loads the same tile once
    and then multiplies and reduces each token in turn, each reduction a barrier across
    its warps, all on the path the next kernel waits for. With the measured
    `extra_token_us` and `step_us`, a note says what each token adds to a whole pass."""
    fig, ax = canvas(10, 4.3)
    x0, h, work = 1.8, 0.75, 1.1  # widths are schematic: what comes after what
    load, wait = (x0, x0 + 1.45), (x0 + 1.45, x0 + 3.25)

    lanes = {2.75: ("a step", 1), 1.2: (f"a pass of\n{tokens} tokens", tokens)}
    for y, (name, n) in lanes.items():
        lane(ax, y, h, name, x0, 9.9, size=NAME)
        span(ax, y, h, *load, "load\nthe tile", color=AMBER, alpha=0.4, size=SMALL)
        span(ax, y, h, *wait, "wait for the\nkernel ahead", color=GREY, alpha=0.12,
             size=SMALL)
        start = wait[1]
        for i in range(n):  # each token's multiply and reduction, in turn
            span(ax, y, h, start, start + work, f"token {i + 1}", color=BLUE, alpha=0.3,
                 size=SMALL)
            start += work
        arrow(ax, (start, y + h / 2), (start + 0.35, y + h / 2))
        label(ax, start + 0.4, y + h / 2, "next\nkernel", size=SMALL)
    measure(ax, load[0], load[1], 2.75 + h + 0.12, "the weights, once", "left")
    bracket(ax, wait[1], wait[1] + tokens * work, 1.05, "")
    # both notes end under the tokens' bracket: centred they would leave the canvas
    right = wait[1] + tokens * work
    label(ax, right, 0.9, "each token: multiply the tile, reduce across the warps",
          size=SMALL, ha="right", va="top", color="0.25")
    if extra_token_us is not None and step_us is not None:
        label(ax, right, 0.45,
              f"over a whole pass of the target: +{extra_token_us:.0f} µs a token, "
              f"{100 * extra_token_us / step_us:.0f} % of a step", size=SMALL, ha="right",
              va="top", color=BLUE)
    return fig
