#!/usr/bin/env python3
"""Pack the GPU kit's results into at most six files (run.sh calls it after every stage).

    python3 pack.py WORK OUT

WORK holds what the stages wrote: JSON lines (``*.jsonl``), unet-parity's JSON documents
(``check*.json``), Markdown tables (``*.md``), logs (``*.stderr``), ``env.json`` and
``summary.jsonl``. OUT gets:

* ``summary.jsonl``: ``{"env": ...}`` (the machine and the kit), run.sh's summary lines (one a stage
  and one a check), ``{"table": NAME, "markdown": ...}`` per table, ``{"log": NAME, "tail": ...}``
  per log (its last 100 lines, at most 32 KiB), ``{"other": NAME, "bytes": N}`` for anything else;
* ``fused.jsonl`` (fused_check), ``sdpa.jsonl`` (``bench_core_*``, ``bench_fused_*``,
  ``bench_splits_*``, ``bench_block_*``), ``layers.jsonl`` (layers_check, conv_check),
  ``whole.jsonl`` (``bench_whole_*``, ``bench_models*``): their JSON lines, each with ``src`` (the
  file it came from) added; a line that does not parse is kept as ``{"src", "unparsed"}``;
* ``check.jsonl``: one line per bundle of each ``check*.json`` (``src``, then the bundle's
  report) and a closing ``{"src", "summary": true, "passed", "failed", "errors", "exit_code"}``
  (``{"src", "error"}`` when the document is missing or cut short).

A file with no lines is not written. Each is written beside its final name (``.NAME.tmp``) and
renamed over it, so OUT never holds a half-written result file, and at most six result files
(seven while one is being renamed in). Names: letters, digits, ``.``, ``_``, ``-``; no folders.
"""

import json
import os
import sys

GROUPS = [
    ("fused.jsonl", ("fused",)),
    ("sdpa.jsonl", ("bench_core_", "bench_fused_", "bench_splits_", "bench_block_")),
    ("layers.jsonl", ("layers", "conv")),
    ("whole.jsonl", ("bench_whole", "bench_models")),
    ("check.jsonl", ("check",)),
]
LOG_LINES, LOG_BYTES, TABLE_BYTES = 100, 32 << 10, 64 << 10


def group(name):
    return next((g for g, prefixes in GROUPS if name.startswith(prefixes)), None)


def json_lines(path, src):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                out.append({"src": src, "unparsed": line.rstrip("\n")[:4096]})
                continue
            out.append({"src": src, **obj} if isinstance(obj, dict) else {"src": src, "value": obj})
    return out


def check_lines(path, src):
    try:
        with open(path) as f:
            doc = json.load(f)
        bundles = doc["bundles"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [{"src": src, "error": f"no complete JSON document: {e}"}]
    lines = [{"src": src, **b} for b in bundles]
    tally = {k: doc.get(k) for k in ("passed", "failed", "errors", "exit_code")}
    return lines + [{"src": src, "summary": True, **tally}]


def tail(path):
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - LOG_BYTES))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-LOG_LINES:])


def collect(work):
    summary, packed = [], {g: [] for g, _ in GROUPS}
    env = os.path.join(work, "env.json")
    if os.path.isfile(env):
        try:
            with open(env) as f:
                summary.append({"env": json.load(f)})
        except ValueError as e:
            summary.append({"env": None, "error": str(e)})
    if os.path.isfile(os.path.join(work, "summary.jsonl")):
        summary += json_lines(os.path.join(work, "summary.jsonl"), "summary")
    for name in sorted(os.listdir(work)):
        path = os.path.join(work, name)
        if not os.path.isfile(path) or name in ("env.json", "summary.jsonl") or name.startswith("."):
            continue
        stem, ext = os.path.splitext(name)
        g = group(name)
        if ext == ".jsonl" and g:
            packed[g] += json_lines(path, stem)
        elif ext == ".json" and g == "check.jsonl":
            packed[g] += check_lines(path, stem)
        elif ext == ".md":
            with open(path, errors="replace") as f:
                summary.append({"table": stem, "markdown": f.read(TABLE_BYTES)})
        elif ext in (".stderr", ".log"):
            summary.append({"log": stem, "tail": tail(path)})
        else:
            summary.append({"other": name, "bytes": os.path.getsize(path)})
    return [("summary.jsonl", summary)] + list(packed.items())


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    work, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name, lines in collect(work):
        if not lines:
            continue
        tmp = os.path.join(out, f".{name}.tmp")
        with open(tmp, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        os.replace(tmp, os.path.join(out, name))


if __name__ == "__main__":
    main()
