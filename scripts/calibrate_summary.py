"""Choose the pass rule's constants on one half of the generated calibration bundles and report them
on the other half (docs/cli.md, "Calibration").

Reads the JSON lines of ``crates/parity/examples/calibrate.rs`` (one file per lane: CPU kernel
choices, aarch64) and takes the bundles whose manifest ``half`` is ``calibrate`` to choose, each as
a margin times the largest value seen, rounded up to two significant digits:

* the float64 twin's bounds per dtype class (float32, half precision), from the ``normal``
  bundles (margin 1): PyTorch's largest relative error against its twin, at one element and as a
  neighbourhood RMS. An output beyond them is an ill-conditioned block (or a forged twin) and is
  judged only if our float64 run confirms the twin, else refused;
* rule (b)'s element and window factors (margin 2), from the outputs within the bounds
  (``FACTORS``) and from the confirmed ones (``CONFIRMED_FACTORS``).

Then it counts, on the ``validate`` half only, the honest bundles that FAIL, are refused, or whose
stages would be marked diverging (per lane), and the planted bugs caught (per bug and dtype), at the
chosen constants and at the library's (``--current``, as ``calibrate --constants`` prints them).

    python scripts/calibrate_summary.py LINES.jsonl [...] [--current E,W,CE,CW,F32E,F32R,HE,HR] [--margin 2]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

INF = float("inf")


def num(x):
    if x == "inf":
        return INF
    return x


def round_up(x: float) -> float:
    """Up to two significant digits (0 stays 0, inf stays inf)."""
    if x <= 0 or math.isinf(x):
        return x
    digits = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / digits - 1e-9) * digits


def dtype_class(dtype: str) -> str:
    return "f32" if dtype in ("float32", "f32", "float64") else "half"


def read(paths):
    lines = []
    for p in paths:
        with open(p) as f:
            lines.extend(json.loads(line) for line in f if line.strip())
    return lines


def fails(line, factors) -> bool:
    """Whether an output, stage or bug line FAILs at the factors (see compare::model)."""
    if line.get("non_finite"):
        return True
    if not line.get("outside_a"):
        return False
    ef, wf = num(line.get("element_factor")) or 0.0, num(line.get("window_factor")) or 0.0
    return ef > factors[0] or wf > factors[1]


def beyond(twin, bounds) -> bool:
    elem, rms = bounds[dtype_class(twin["dtype"])]
    return num(twin["element_eps"]) > elem or num(twin["rms_eps"]) > rms


class Bundles:
    """The lines of one lane, by bundle: its twins, confirmations, outputs, stages and bugs."""

    def __init__(self, lines):
        self.by = defaultdict(lambda: defaultdict(list))
        for l in lines:
            self.by[l["id"]][l["kind"]].append(l)

    def regime(self, bundle, bounds):
        """`within` (every output twin within the bounds), `confirmed` or `refused`."""
        twins = [t for t in bundle["twin"] if t["name"].startswith("output:")]
        if not any(beyond(t, bounds) for t in twins):
            return "within"
        if bundle["error"]:
            return "refused"
        return "confirmed" if all(c.get("confirmed") for c in bundle["confirm"]) else "refused"


def choose(lines, margin, bound_margin):
    cal = [l for l in lines if l.get("half") == "calibrate" and l["lane"] == "default"]
    bounds = {}
    for cls in ("f32", "half"):
        twins = [l for l in cal if l["kind"] == "twin" and dtype_class(l["dtype"]) == cls
                 and l["condition"] == "normal" and l["name"].startswith("output:")]
        bounds[cls] = (
            round_up(bound_margin * max((num(l["element_eps"]) for l in twins), default=1.0)),
            round_up(bound_margin * max((num(l["rms_eps"]) for l in twins), default=1.0)),
        )
    b = Bundles(cal)
    factors = {}
    for regime in ("within", "confirmed"):
        outs = [o for bundle in b.by.values() if b.regime(bundle, bounds) == regime
                for o in bundle["output"] if o.get("outside_a") and not o.get("non_finite")]
        factors[regime] = (
            round_up(margin * max((num(o["element_factor"]) or 0.0 for o in outs), default=1.0)),
            round_up(margin * max((num(o["window_factor"]) or 0.0 for o in outs), default=1.0)),
        )
    return factors, bounds


def report(lines, factors, bounds, title):
    val = [l for l in lines if l.get("half") == "validate"]
    print(f"\n### {title}\n")
    print(f"factors (element/window): {factors['within'][0]:g}/{factors['within'][1]:g}, confirmed "
          f"{factors['confirmed'][0]:g}/{factors['confirmed'][1]:g}; twin bounds (element/RMS eps): "
          f"f32 {bounds['f32'][0]:g}/{bounds['f32'][1]:g}, half {bounds['half'][0]:g}/{bounds['half'][1]:g}\n")
    print("| lane | honest bundles | judged within bounds | judged after float64 confirmation | refused | FAIL | "
          "stages marked diverging |")
    print("|---|---|---|---|---|---|---|")
    by_lane = defaultdict(list)
    for l in val:
        by_lane[l["lane"]].append(l)
    examples = []
    for lane, ls in sorted(by_lane.items()):
        b = Bundles(ls)
        count = defaultdict(int)
        failed, stages = 0, 0
        for bid, bundle in b.by.items():
            regime = b.regime(bundle, bounds)
            count[regime] += 1
            if regime == "refused":
                continue
            f = factors[regime]
            bad = [o for o in bundle["output"] if fails(o, f)]
            failed += bool(bad)
            examples += bad[:1]
            stages += any(fails(s, f) for s in bundle["stage"])
        print(f"| {lane} | {len(b.by)} | {count['within']} | {count['confirmed']} | {count['refused']} | {failed} | "
              f"{stages} |")
    for l in examples[:6]:
        print(f"\n  false FAIL: {l['lane']} {l['id']} {l['block']} {l['dtype']} {l['condition']} {l['name']} "
              f"ef {l['element_factor']} wf {l['window_factor']}")
    print("\n| bug | dtype | bundles | caught | refused | within rule (a) | missed |")
    print("|---|---|---|---|---|---|---|")
    b = Bundles([l for l in val if l["lane"] == "default"])
    groups = defaultdict(lambda: defaultdict(int))
    for bundle in b.by.values():
        regime = b.regime(bundle, bounds)
        per_bug = defaultdict(list)
        for l in bundle["bug"]:
            per_bug[(l["bug"], l["dtype"])].append(l)
        for key, ls in per_bug.items():
            g = groups[key]
            g["n"] += 1
            if regime == "refused":
                g["refused"] += 1
            elif any(fails(l, factors[regime]) for l in ls):
                g["caught"] += 1
            elif all(not l.get("outside_a") and not l.get("non_finite") for l in ls):
                g["within_a"] += 1
            else:
                g["missed"] += 1
    for (bug, dtype), g in sorted(groups.items()):
        print(f"| {bug} | {dtype} | {g['n']} | {g['caught']} ({100 * g['caught'] / g['n']:.0f} %) | {g['refused']} | "
              f"{g['within_a']} | {g['missed']} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lines", nargs="+")
    ap.add_argument("--margin", type=float, default=2.0, help="the factors: this times the largest seen")
    ap.add_argument("--bound-margin", type=float, default=1.0,
                    help="the twin bounds: this times PyTorch's largest error on the normal bundles")
    ap.add_argument("--current", default=None, help="E,W,CE,CW,F32E,F32R,HE,HR (calibrate --constants)")
    ap.add_argument("--validate-only", action="store_true",
                    help="a fresh set: every bundle is validation, judged at --current only")
    args = ap.parse_args()
    lines = read(args.lines)
    if args.validate_only:
        if not args.current:
            ap.error("--validate-only needs --current")
        for line in lines:
            line["half"] = "validate"
        c = [float(x) for x in args.current.split(",")]
        report(lines, {"within": (c[0], c[1]), "confirmed": (c[2], c[3])}, {"f32": (c[4], c[5]), "half": (c[6], c[7])},
               "The library's constants, on a fresh set (every bundle)")
        return
    ids = {(l["id"], l.get("half")) for l in lines}
    print(f"{len(lines)} lines, {len({i for i in ids if i[1] == 'calibrate'})} calibration bundles, "
          f"{len({i for i in ids if i[1] == 'validate'})} validation bundles, lanes {sorted({l['lane'] for l in lines})}")
    factors, bounds = choose(lines, args.margin, args.bound_margin)
    report(lines, factors, bounds, f"Chosen on the calibration half (margins {args.margin:g} and {args.bound_margin:g}), "
           "reported on the validation half")
    if args.current:
        c = [float(x) for x in args.current.split(",")]
        report(lines, {"within": (c[0], c[1]), "confirmed": (c[2], c[3])}, {"f32": (c[4], c[5]), "half": (c[6], c[7])},
               "The library's constants, on the validation half")


if __name__ == "__main__":
    main()
