"""Probe (issue 57), CPU: where a kernel's work sits relative to its PDL wait. Reads the
SASS and PTX that `pass_sass_dump.py` wrote (DIR) and prints, for each kernel, the
ordered runs of the instructions that matter (global loads, the wait, shared-memory
stores/loads, ldmatrix, barriers, MMAs, shuffles, global stores/atomics), each run with
its first and last SASS address (PTX: line numbers), and the counts before and after
the wait (SASS: ACQBULK = griddepcontrol.wait, PREEXIT = launch_dependents).

    PYTHONPATH=code python scripts/probes/pass_sass_order.py [DIR=/tmp/pass_sass] [NAMES]
"""
import collections
import os
import re
import sys

SASS_KINDS = [("ACQBULK", "WAIT"), ("PREEXIT", "LAUNCH_DEP"), ("LDG", "LDG"),
              ("STS", "STS"), ("LDSM", "LDSM"), ("LDS", "LDS"), ("BAR", "BAR"),
              ("HMMA", "HMMA"), ("HGMMA", "HGMMA"), ("SHFL", "SHFL"), ("STG", "STG"),
              ("ATOMG", "ATOM"), ("ATOM", "ATOM"), ("RED", "ATOM"), ("MEMBAR", "MEMBAR"),
              ("MUFU", "MUFU"), ("BRA", "BRA"), ("EXIT", "EXIT")]
PTX_KINDS = [("griddepcontrol.wait", "WAIT"), ("griddepcontrol.launch", "LAUNCH_DEP"),
             ("ld.global", "LDG"), ("st.shared", "STS"), ("ldmatrix", "LDSM"),
             ("ld.shared", "LDS"), ("bar.sync", "BAR"), ("mma.sync", "HMMA"),
             ("wgmma", "HGMMA"), ("shfl.sync", "SHFL"), ("st.global", "STG"),
             ("atom.", "ATOM"), ("red.", "ATOM"), ("fence", "MEMBAR"),
             ("ex2.approx", "MUFU"), ("rcp.", "MUFU"), ("sqrt.", "MUFU")]
SKIP = {"NOP"}


def sass_instructions(text):
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m and m.group(2) not in SKIP:
            out.append((int(m.group(1), 16), m.group(2), line.strip()))
    return out


def kind_of(op, kinds):
    for prefix, k in kinds:
        if op.startswith(prefix):
            return k
    return None


def runs(items):
    """[(kind, n, first, last)] for consecutive items (pos, kind) of one kind."""
    out = []
    for pos, k in items:
        if out and out[-1][0] == k:
            out[-1][1] += 1
            out[-1][3] = pos
        else:
            out.append([k, 1, pos, pos])
    return out


def fmt_runs(rs, hexa):
    f = (lambda p: f"{p:04x}") if hexa else str
    return " ".join(f"{k}x{n}@{f(a)}" + (f"-{f(b)}" if b != a else "")
                    for k, n, a, b in rs)


def split_counts(items, wait_pos):
    before, after = collections.Counter(), collections.Counter()
    for pos, k in items:
        (before if pos < wait_pos else after)[k] += 1
    return before, after


def main_end(text):
    """The address past the last unpredicated EXIT: what follows is out-of-line code
    (the slow paths of div_rn, sqrt_rn, exp), branched to and back."""
    ends = [int(a, 16) for a in re.findall(r"/\*([0-9a-f]{4})\*/\s+EXIT\s*;", text)]
    return ends[-1] + 1 if ends else 1 << 30


def sass_report(text):
    ins = sass_instructions(text)
    # stop at the trailing self-branch (BRA to itself after the last EXIT)
    wait = next(a for a, op, _ in ins if op == "ACQBULK")
    items = [(a, kind_of(op, SASS_KINDS)) for a, op, _ in ins]
    total_b = sum(1 for a, *_ in ins if a < wait)
    total_a = sum(1 for a, *_ in ins if a > wait)
    # the main body ends at the self-branch (BRA to its own address) after the last
    # EXIT; what follows it is out-of-line code (div_rn/sqrt_rn/exp slow paths)
    end = main_end(text)
    main_a = sum(1 for a, *_ in ins if wait < a < end)
    before, after = split_counts([i for i in items if i[1]], wait)
    return ins, wait, runs([i for i in items if i[1]]), before, after, total_b, (total_a, main_a, end)


def ptx_report(text):
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("//") or s.startswith("."):
            continue
        s = re.sub(r"^@!?%p\d+\s+", "", s)
        k = kind_of(s, PTX_KINDS)
        if k:
            items.append((n, k))
    wait = next(n for n, k in items if k == "WAIT")
    before, after = split_counts(items, wait)
    return wait, runs(items), before, after


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/pass_sass"
    names = sys.argv[2:] or sorted(f[:-5] for f in os.listdir(d) if f.endswith(".sass"))
    for name in names:
        sass = open(os.path.join(d, name + ".sass")).read()
        ins, wait, rs, before, after, nb, na = sass_report(sass)
        na, main_a, end = na
        print(f"== {name}: SASS {len(ins)} instructions (no NOPs), {nb} before the "
              f"ACQBULK at {wait:04x}, {na} after ({main_a} of them in the main body, "
              f"which ends at {end:04x}; the rest out-of-line slow paths)")
        print("  before:", dict(sorted(before.items())))
        print("  after: ", dict(sorted(after.items())))
        print("  order: ", fmt_runs(rs, True))
        p = os.path.join(d, name + ".ptx")
        if os.path.exists(p):
            pw, prs, pb, pa = ptx_report(open(p).read())
            print(f"  PTX wait at line {pw}; before:", dict(sorted(pb.items())),
                  "after:", dict(sorted(pa.items())))
            print("  PTX order:", fmt_runs(prs, False))


if __name__ == "__main__":
    main()
