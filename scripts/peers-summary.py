#!/usr/bin/env python3
"""Summarises a peer-harness results file (../shared/bench/peers/run.sh
--results FILE) as Markdown tables: each peer's medians per workload, rota's
extra figures (a lone workflow's latency, CPU per workflow, TLS), and rota's
ratios to the peers measured in the same run.

Usage: scripts/peers-summary.py RESULTS.json
Standard library only.
"""

import argparse
import json
import statistics
import sys


def median_of(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fmt(value, digits=1):
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    args = parser.parse_args()
    try:
        with open(args.results, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        sys.exit(f"error: cannot read {args.results}: {err}")

    medians = {}
    for row in results.get("medians", []):
        medians[(row["peer"], row["workload"], row["metric"])] = (row["median"], row.get("runs"), row.get("values", []))
    workloads = sorted({w for (_, w, _) in medians})
    out = []
    machine = results.get("machine_at_start", {})
    out.append(
        f"Machine: {machine.get('nproc')} cores, {machine.get('cpu_model')}, load at start {machine.get('loadavg')}, "
        f"at end {results.get('machine_at_end', {}).get('loadavg')}; 8 KiB fdatasync {machine.get('fdatasync_8k_per_s')}/s."
    )
    postgres = results.get("servers", {}).get("postgres", {}).get("settings", {})
    if postgres:
        out.append(
            "PostgreSQL: "
            + ", ".join(f"{k}={postgres[k]}" for k in ("server_version", "fsync", "synchronous_commit", "autovacuum", "ssl") if k in postgres)
            + "."
        )
    for workload in workloads:
        metrics = sorted({m for (_, w, m) in medians if w == workload})
        peers = sorted({p for (p, w, _) in medians if w == workload})
        out.append("")
        out.append(f"### Workload {workload} (medians)")
        out.append("")
        out.append("| peer | " + " | ".join(metrics) + " | runs |")
        out.append("|---|" + "---|" * (len(metrics) + 1))
        for peer in peers:
            cells = [fmt(medians.get((peer, workload, m), (None,))[0], 2) for m in metrics]
            runs = max((medians.get((peer, workload, m), (None, 0))[1] or 0) for m in metrics)
            out.append(f"| {peer} | " + " | ".join(cells) + f" | {runs} |")

    rota_runs = [r for r in results.get("runs", []) if str(r.get("peer", "")).startswith("rota") and r.get("workload") == "W"]
    if rota_runs:
        out.append("")
        out.append("### rota's W records (medians of the runs)")
        out.append("")
        out.append("| peer | lone p50 ms | rota CPU ms/wf | database CPU ms/wf | cores busy | durability | TLS |")
        out.append("|---|---|---|---|---|---|---|")
        for peer in sorted({r["peer"] for r in rota_runs}):
            runs = [r for r in rota_runs if r["peer"] == peer]
            extra = [r.get("extra", {}) for r in runs]
            cpu = [e.get("cpu", {}) for e in extra]
            durability = runs[0].get("settings", {}).get("durability", {})
            if "synchronous" in durability:
                stated = f"SQLite {durability.get('journal_mode')}, synchronous={durability.get('synchronous')}"
                if durability.get("flushed_before_reply"):
                    stated += ", WAL fdatasync before every reply that leaves the Scheduler"
            else:
                stated = f"fsync={durability.get('fsync')}, synchronous_commit={durability.get('synchronous_commit')}, autovacuum={durability.get('autovacuum')}"
            out.append(
                f"| {peer} | {fmt(median_of([e.get('lone_latency_p50_ms') for e in extra]), 2)} "
                f"| {fmt(median_of([c.get('rota_ms_per_workflow') for c in cpu]), 3)} "
                f"| {fmt(median_of([c.get('database_ms_per_workflow') for c in cpu]), 3)} "
                f"| {fmt(median_of([c.get('cores_busy') for c in cpu]), 2)} "
                f"| {stated}, meets rule: {durability.get('meets_rule')} | {durability.get('tls', '—')} |"
            )

    # Ratios: every rota peer against every other peer, per workload's throughput metric.
    throughput = {"Q": "drain_jobs_per_s", "W": "workflows_per_s"}
    for workload, metric in throughput.items():
        ours = {p: v[0] for (p, w, m), v in medians.items() if w == workload and m == metric and p.startswith("rota") and v[0]}
        theirs = {p: v[0] for (p, w, m), v in medians.items() if w == workload and m == metric and not p.startswith("rota") and v[0]}
        if not ours or not theirs:
            continue
        out.append("")
        out.append(f"### {workload}: rota's {metric} over each peer's")
        out.append("")
        out.append("| | " + " | ".join(sorted(theirs)) + " |")
        out.append("|---|" + "---|" * len(theirs))
        for peer in sorted(ours):
            out.append(f"| {peer} | " + " | ".join(f"{ours[peer] / theirs[p]:.1f}×" for p in sorted(theirs)) + " |")
    failures = results.get("failures", [])
    if failures:
        out.append("")
        out.append("Failures: " + "; ".join(f"{f.get('peer')} {f.get('workload')} run {f.get('run')}: {f.get('reason')}" for f in failures))
    print("\n".join(out))


if __name__ == "__main__":
    main()
