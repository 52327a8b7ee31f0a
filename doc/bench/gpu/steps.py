#!/usr/bin/env python3
"""Where a native replica's serving time goes, step by step, from xinf's log.

Run xinf with `XINF_LOG=warn,xinf::step=trace` (plain or JSON log lines): every step of every
native replica logs its sequences, its decode tokens, its prompt tokens and its time
(`engines/native/src/engine/worker.rs`, `trace_step`). This prints, for the steps logged:

- decode-only, mixed (decodes and prompt chunks) and prompt-only steps: how many, their share
  of the time, their median time and prompt tokens;
- decode-only steps by batch size: median time, of it the part after the forward pass
  (sampling, stops, streaming), and the host's time between steps (commands, admission,
  planning);
- where the log has `xinf::step::gpu` lines (GPU replicas): the host's time until a step's
  work was enqueued and the wait for its results, for decode-only steps by batch size and
  for those with prompts;
- the prompt tokens per second of the steps that carried prompts (mixed and prompt-only);
- the time between tokens a decoding sequence saw (each step's time counted once per decode it
  carried), over all steps and over the decode-only ones: their ratio is how much the steps
  that also carried prompts stretched it.

With `--bench BENCH_JSON` (the `--json` report of the `xinf bench` run that made the load),
each level of the report gets these tables for the steps logged while it ran, by its
`started_unix_s` and `wall_s` (the log's timestamps and the report's come from the same clock
where both ran on one machine).

usage: steps.py XINF_LOG_FILE [--bench BENCH_JSON]
"""

import datetime
import json
import re
import statistics
import sys

FIELD = re.compile(r"\b(\w+)=(\d+)\b")


def unix(stamp):
    """Seconds since the epoch of an RFC 3339 timestamp (tracing's), None if it is not one."""
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def records(path, marker, required, optional=()):
    """Of each log line holding `marker` (plain or JSON) with every integer field in `required`:
    those fields, the line's unix time (None if unreadable), then the fields in `optional`
    (None where absent)."""
    out = []
    for line in open(path, errors="replace"):
        if marker not in line:
            continue
        line = line.strip()
        if line.startswith("{"):
            try:
                j = json.loads(line)
                fields, stamp = j.get("fields", {}), j.get("timestamp", "")
            except (ValueError, AttributeError):
                continue
        else:
            fields, stamp = {k: int(v) for k, v in FIELD.findall(line)}, line.split(" ", 1)[0]
        if not isinstance(fields, dict) or not all(k in fields for k in required):
            continue
        out.append(tuple(fields[k] for k in required) + (unix(stamp),) + tuple(fields.get(k) for k in optional))
    return out


def steps(path):
    """(seqs, decodes, prompt_tokens, us, unix time or None, sample_us, between_us) of each step
    line; the last two are None in logs of builds that did not log them."""
    return records(path, "xinf::step", ("seqs", "decodes", "prompt_tokens", "us"), ("sample_us", "between_us"))


def gpu_steps(path):
    """(tokens, rows, host_us, wait_us, unix time or None) of each `xinf::step::gpu` line."""
    return records(path, "xinf::step::gpu", ("tokens", "rows", "host_us", "wait_us"))


def bucket(n):
    for hi in (1, 2, 4, 8, 16, 32, 64):
        if n <= hi:
            return hi
    return n


def main():
    args = sys.argv[1:]
    bench = None
    if "--bench" in args:
        at = args.index("--bench")
        if at + 1 >= len(args):
            print(__doc__, file=sys.stderr)
            sys.exit(2)
        bench = args[at + 1]
        del args[at : at + 2]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    rows, gpu = steps(args[0]), gpu_steps(args[0])
    if not rows:
        print("no step lines (was xinf run with XINF_LOG=...,xinf::step=trace?)", file=sys.stderr)
        sys.exit(1)
    if bench is None:
        report(rows, gpu)
        return
    for level in json.load(open(bench))["results"]:
        start, wall = level.get("started_unix_s"), level.get("wall_s")
        print(f"## {level['model_uid']} at concurrency {level['concurrency']}")
        print()
        if start is None or wall is None:
            print("the report has no start time for this level (an xinf bench before it had one)")
            print()
            continue
        # A step logs when it ends: those ending within the level, plus the one it began inside.
        mine = [r for r in rows if r[4] is not None and start <= r[4] <= start + wall]
        if mine:
            report(mine, [g for g in gpu if g[4] is not None and start <= g[4] <= start + wall])
        else:
            print("no steps logged while it ran")
        print()


def report(rows, gpu):
    """The tables of the steps in `rows`, and of the GPU's side of them in `gpu`."""
    total = sum(r[3] for r in rows)
    kinds = {
        "decode-only": [r for r in rows if r[2] == 0],
        "mixed": [r for r in rows if r[1] > 0 and r[2] > 0],
        "prompt-only": [r for r in rows if r[1] == 0 and r[2] > 0],
    }
    print(f"{len(rows)} steps, {total / 1e6:.3f} s")
    print()
    print("| steps | count | share of time | median ms | median prompt tokens | median decodes |")
    print("|---|---|---|---|---|---|")
    for name, rs in kinds.items():
        if not rs:
            continue
        t = sum(r[3] for r in rs)
        print(f"| {name} | {len(rs)} | {100 * t / total:.1f} % | {statistics.median(r[3] for r in rs) / 1e3:.3f} | "
              f"{statistics.median(r[2] for r in rs):.0f} | {statistics.median(r[1] for r in rs):.0f} |")
    print()
    # Sampling and the host's time between steps, where the log has them (the first step
    # of a stretch waited idle before it: medians, not sums).
    print("| decode-only batch (up to) | steps | median ms | of it after the forward, ms | host between steps, ms |")
    print("|---|---|---|---|---|")
    by = {}
    for r in kinds["decode-only"]:
        by.setdefault(bucket(r[1]), []).append(r)

    def median_ms(values):
        values = [v for v in values if v is not None]
        return f"{statistics.median(values) / 1e3:.3f}" if values else "–"

    for b in sorted(by):
        rs = by[b]
        print(f"| {b} | {len(rs)} | {median_ms(r[3] for r in rs)} | {median_ms(r[5] for r in rs)} | "
              f"{median_ms(r[6] for r in rs)} |")
    print()

    if gpu:
        # Decode-only steps have one row a token; the rest carried prompt chunks.
        print("| GPU steps | count | median host ms (until enqueued) | median wait ms |")
        print("|---|---|---|---|")
        by = {}
        for g in gpu:
            by.setdefault(f"decode-only, batch up to {bucket(g[0])}" if g[0] == g[1] else "with prompts", []).append(g)
        for name in sorted(by, key=lambda k: (k == "with prompts", len(k), k)):
            gs = by[name]
            print(f"| {name} | {len(gs)} | {statistics.median(g[2] for g in gs) / 1e3:.3f} | "
                  f"{statistics.median(g[3] for g in gs) / 1e3:.3f} |")
        print()

    def gap(rs):
        tokens = sum(r[1] for r in rs)
        return sum(r[3] * r[1] for r in rs) / tokens / 1e3 if tokens else None

    prompts = kinds["mixed"] + kinds["prompt-only"]
    if prompts:
        rate = sum(r[2] for r in prompts) / (sum(r[3] for r in prompts) / 1e6)
        print(f"prompt tokens per second of the steps that carried prompts: {rate:,.0f}")
    seen, alone = gap([r for r in rows if r[1] > 0]), gap(kinds["decode-only"])
    print(f"time between tokens a decoding sequence saw: {seen:.3f} ms over all steps" if seen else "no decodes")
    if seen and alone:
        print(f"over decode-only steps: {alone:.3f} ms; ratio {seen / alone:.2f}")


if __name__ == "__main__":
    main()
