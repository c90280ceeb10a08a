"""Choose the pass rule's constants on one half of the generated calibration bundles and replay the
verdicts on the other half (docs/cli.md, "Calibration").

Reads the JSON lines of ``crates/parity/examples/calibrate`` (one file per lane: CPU kernel choices,
aarch64): one ``case`` line per bundle output and scenario (``honest``; ``bug``: a wrong port;
``refbug``: a bundle exported from a wrong module; ``tbug``: PyTorch's run wrong in its dtype only;
``forge``: PyTorch's output replaced) with the raw numbers each part of the rule decides on, and one
``stage`` line per stage of our honest run. On the bundles whose manifest ``half`` is ``calibrate``
(default lane) it chooses, each as a margin times the largest value an honest case needed, rounded
up to two significant digits:

* the float64 twin's bounds per dtype class (float32, half precision), from the ``normal`` bundles
  (margin 1): PyTorch's largest relative error against its twin, at one element and as a
  neighbourhood RMS;
* the maths check's embedding factor (the grid value that needs the smallest maths factor) and its
  maths factor (margin ``--maths-margin``);
* rule (b)'s element and window factors (margin 2), within the twin bounds and beyond them;
* the plausibility bounds of PyTorch's output (global, neighbourhood, average) per dtype class and
  regime (margin 2).

Then it replays ``check``'s decision (``verdict``) on the ``validate`` half: honest bundles that
PASS, FAIL, are inconclusive or refused, per lane; and per scenario, bug and dtype the wrong cases
caught (anything but PASS) beside ``torch.testing.assert_close``'s catches on the same pairs.

    python scripts/calibrate_summary.py LINES.jsonl [...] [--current CONSTANTS.json] [--margin 2]
    python scripts/calibrate_summary.py LINES.jsonl [...] --validate-only --current CONSTANTS.json
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

INF = float("inf")
# the embedding factors of the maths_off / maths_kept arrays (crates/parity/examples/calibrate/cases.rs)
EMBEDDING_GRID = [0.0, 4.0, 8.0, 16.0, 32.0, 64.0]
SCENARIOS = ("bug", "refbug", "tbug", "forge")


def num(x):
    if x == "inf" or x == "nan":
        return INF
    return 0.0 if x is None else x


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


def beyond(case, c) -> bool:
    elem, rms = c["twin_bounds"][dtype_class(case["dtype"])]
    return num(case["twin_element_eps"]) > elem or num(case["twin_rms_eps"]) > rms


def maths_needed(case, embedding_factor):
    """The smallest maths factor at which our float64 run (the better convention) matches; None
    where the case has no float64 run of ours."""
    k = EMBEDDING_GRID.index(embedding_factor)
    runs = [case[key][k] for key in ("maths_off", "maths_kept") if key in case]
    return min(num(x) for x in runs) if runs else None


def verdict(case, c) -> str:
    """``check``'s decision on one output (crates/parity/src/check/judge.rs): PASS, FAIL,
    INCONCLUSIVE or REFUSED."""
    if case.get("non_finite"):
        return "FAIL"
    far = beyond(case, c)
    maths = maths_needed(case, c["embedding_factor"])
    matches = maths is not None and maths <= c["maths_factor"]
    if far and maths is None:
        return "REFUSED"
    if far and not matches and case.get("odd_twin"):
        return "REFUSED"
    if maths is not None and not matches:
        return "FAIL"
    if not case.get("outside_a"):
        return "PASS"
    e, w = c["confirmed_factors"] if far else c["factors"]
    if num(case["element_factor"]) > e or num(case["window_factor"]) > w:
        return "FAIL"
    pg, pw, pb = c["plausibility"][dtype_class(case["dtype"])]["beyond" if far else "within"]
    if num(case["plaus_global"]) > pg or num(case["plaus_window"]) > pw or num(case["plaus_bias"]) > pb:
        return "INCONCLUSIVE"
    return "PASS"


RANK = {"PASS": 0, "INCONCLUSIVE": 1, "FAIL": 2, "REFUSED": 3}


def bundle_verdict(cases, c) -> str:
    """A bundle is refused if any output is, else its worst output's verdict."""
    return max((verdict(x, c) for x in cases), key=RANK.get, default="PASS")


def choose(lines, margin, maths_margin):
    cal = [l for l in lines if l.get("half") == "calibrate" and l["lane"] == "default" and l["kind"] == "case"]
    honest = [l for l in cal if l["scenario"] == "honest"]
    c = {"twin_bounds": {}, "plausibility": {"f32": {}, "half": {}}}
    for cls in ("f32", "half"):
        normal = [l for l in honest if dtype_class(l["dtype"]) == cls and l["condition"] == "normal"]
        c["twin_bounds"][cls] = (round_up(max((num(l["twin_element_eps"]) for l in normal), default=1.0)),
                                 round_up(max((num(l["twin_rms_eps"]) for l in normal), default=1.0)))
    best = None
    for b in EMBEDDING_GRID:
        need = max((maths_needed(l, b) for l in honest if maths_needed(l, b) is not None), default=0.0)
        if best is None or need < best[1]:
            best = (b, need)
    c["embedding_factor"], c["maths_factor"] = best[0], round_up(maths_margin * best[1])
    outs = {True: [], False: []}
    for l in honest:
        if l.get("outside_a") and not l.get("non_finite"):
            outs[beyond(l, c)].append(l)
    for far, key in ((False, "factors"), (True, "confirmed_factors")):
        c[key] = (round_up(margin * max((num(o["element_factor"]) for o in outs[far]), default=1.0)),
                  round_up(margin * max((num(o["window_factor"]) for o in outs[far]), default=1.0)))
    for cls in ("f32", "half"):
        for far in (False, True):
            ls = [o for o in outs[far] if dtype_class(o["dtype"]) == cls]
            c["plausibility"][cls]["beyond" if far else "within"] = (
                round_up(margin * max((num(o["plaus_global"]) for o in ls), default=1.0)),
                round_up(margin * max((num(o["plaus_window"]) for o in ls), default=1.0)),
                round_up(margin * max((num(o["plaus_bias"]) for o in ls), default=1.0)))
    return c


def describe(c) -> str:
    p = c["plausibility"]
    return (f"twin bounds (element/RMS eps) f32 {c['twin_bounds']['f32'][0]:g}/{c['twin_bounds']['f32'][1]:g}, half "
            f"{c['twin_bounds']['half'][0]:g}/{c['twin_bounds']['half'][1]:g}; maths factor {c['maths_factor']:g} with "
            f"embedding factor {c['embedding_factor']:g}; rule (b) factors {c['factors'][0]:g}/{c['factors'][1]:g}, "
            f"beyond the bounds {c['confirmed_factors'][0]:g}/{c['confirmed_factors'][1]:g}; plausibility (global/"
            f"window/average) f32 {trio(p['f32']['within'])}, beyond {trio(p['f32']['beyond'])}; half "
            f"{trio(p['half']['within'])}, beyond {trio(p['half']['beyond'])}")


def trio(b) -> str:
    return "/".join(f"{x:g}" for x in b)


def honest_table(val, c):
    print("| lane | honest bundles | PASS | FAIL | inconclusive | refused | judged beyond the twin bounds | "
          "stages marked diverging |")
    print("|---|---|---|---|---|---|---|---|")
    by_lane = defaultdict(lambda: defaultdict(list))
    stages = defaultdict(lambda: defaultdict(list))
    for l in val:
        if l["kind"] == "case" and l["scenario"] == "honest":
            by_lane[l["lane"]][l["id"]].append(l)
        elif l["kind"] == "stage":
            stages[l["lane"]][l["id"]].append(l)
    examples = []
    for lane, bundles in sorted(by_lane.items()):
        count = defaultdict(int)
        far = diverging = 0
        for bid, cases in bundles.items():
            v = bundle_verdict(cases, c)
            count[v] += 1
            far += any(beyond(x, c) for x in cases)
            if v != "PASS":
                examples.append((lane, v, cases[0]))
            f = c["factors"]
            diverging += any(s.get("outside_a") and (num(s["element_factor"]) > f[0] or num(s["window_factor"]) > f[1])
                             for s in stages[lane][bid])
        print(f"| {lane} | {len(bundles)} | {count['PASS']} | {count['FAIL']} | {count['INCONCLUSIVE']} | "
              f"{count['REFUSED']} | {far} | {diverging} |")
    for lane, v, x in examples[:12]:
        print(f"\n  {v}: {lane} {x['id']} {x['block']} {x['dtype']} {x['condition']} {x['name']}")
    return examples


def power_table(val, c):
    print("\n| scenario | bug | dtype | cases | caught (FAIL / inconclusive / refused) | assert_close catches | "
          "caught where assert_close catches |")
    print("|---|---|---|---|---|---|---|")
    groups = defaultdict(lambda: defaultdict(int))
    for l in val:
        if l["kind"] != "case" or l["scenario"] not in SCENARIOS or l["lane"] != "default":
            continue
        g = groups[(l["scenario"], l["bug"], l["dtype"])]
        v = verdict(l, c)
        g["n"] += 1
        g[v] += 1
        g["ac"] += bool(l.get("outside_a"))
        g["both"] += bool(l.get("outside_a")) and v != "PASS"
    for (sc, bug, dtype), g in sorted(groups.items()):
        caught = g["n"] - g["PASS"]
        pct = lambda k: f"{100 * k / g['n']:.1f} %" if g["n"] else "-"  # noqa: E731
        print(f"| {sc} | {bug} | {dtype} | {g['n']} | {pct(caught)} ({g['FAIL']} / {g['INCONCLUSIVE']} / "
              f"{g['REFUSED']}) | {pct(g['ac'])} | {g['both']} of {g['ac']} |")


def report(lines, c, title):
    val = [l for l in lines if l.get("half") == "validate"]
    print(f"\n### {title}\n\n{describe(c)}\n")
    honest_table(val, c)
    power_table(val, c)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lines", nargs="+")
    ap.add_argument("--margin", type=float, default=2.0, help="factors and bounds: this times the largest seen")
    ap.add_argument("--maths-margin", type=float, default=2.0,
                    help="the maths factor: this times the largest an honest block needed")
    ap.add_argument("--current", default=None, help="the library's constants: JSON, as calibrate --constants prints them")
    ap.add_argument("--validate-only", action="store_true",
                    help="a fresh set: every bundle is validation, judged at --current only")
    ap.add_argument("--json-out", default=None, help="write the chosen constants here as JSON")
    args = ap.parse_args()
    lines = read(args.lines)
    current = json.loads(args.current) if args.current else None
    if args.validate_only:
        if not current:
            ap.error("--validate-only needs --current")
        for line in lines:
            line["half"] = "validate"
        report(lines, current, "The library's constants, on a fresh set (every bundle)")
        return
    ids = {(l["id"], l.get("half")) for l in lines}
    print(f"{len(lines)} lines, {len({i for i in ids if i[1] == 'calibrate'})} calibration bundles, "
          f"{len({i for i in ids if i[1] == 'validate'})} validation bundles, lanes {sorted({l['lane'] for l in lines})}")
    c = choose(lines, args.margin, args.maths_margin)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(c, f, indent=1)
    report(lines, c, f"Chosen on the calibration half (margins {args.margin:g}, maths {args.maths_margin:g}), "
           "reported on the validation half")
    if current:
        report(lines, current, "The library's constants, on the validation half")


if __name__ == "__main__":
    main()
