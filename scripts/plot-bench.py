#!/usr/bin/env python3
"""Plots the records of scripts/bench-growth.sh: one PNG per scenario
(throughput, p50/p99 latency, the idle claim/receive probes, peak RSS and
store size against the grown quantity), both backends on the same axes
when both record sets are present.

    plot-bench.py RECORDS_DIR [--images docs/images] [--tables]

RECORDS_DIR holds sqlite/ and/or postgres/ (as bench-growth.sh writes
them). --tables also prints a Markdown table per scenario to stdout.
"""

import argparse
import json
import pathlib
import sys

SCENARIOS = {
    "pending": ("pending workflows in the store", "drain of the first 2,000"),
    "future": ("workflows due in an hour", "W on top"),
    "paused": ("workflows of a paused workflow", "W on top"),
    "delayed": ("messages visible in an hour", "Q on top"),
    "queues": ("queues, one consumer each", "Q spread over them"),
    "steps": ("steps per workflow", "W"),
    "input": ("input bytes per workflow", "W"),
    "lanes": ("lanes (workflows in flight)", "W"),
}
BACKENDS = {"sqlite": "tab:blue", "postgres": "tab:orange"}


def figures(record):
    """The plotted figures of one record, by name (None: not measured)."""
    metrics, extra = record["metrics"], record["extra"]
    probes = extra.get("idle_probes") or {}
    mib = lambda b: None if b is None else b / 2**20
    if record["workload"] == "W":
        figs = {
            "throughput": metrics.get("workflows_per_s"),
            "p50": metrics.get("latency_p50_ms"),
            "p99": metrics.get("latency_p99_ms"),
            "claim_p50": probes.get("claim_p50_ms"),
        }
    else:
        figs = {
            "throughput": metrics.get("drain_jobs_per_s"),
            "enqueue": metrics.get("enqueue_jobs_per_s"),
            "p50": metrics.get("pickup_p50_ms"),
            "p99": metrics.get("pickup_p99_ms"),
        }
    figs["receive_p50"] = probes.get("receive_p50_ms")
    figs["rss_mib"] = mib(extra.get("rss_peak_bytes"))
    figs["store_mib"] = mib(extra.get("store_bytes"))
    return figs


def load(root):
    """{scenario: {backend: [(x, figures, record)]}}, sorted by x."""
    runs = {}
    for backend in BACKENDS:
        for path in sorted((root / backend).glob("*.json")):
            record = json.loads(path.read_text())
            growth = record.get("growth")
            if not growth:
                continue
            runs.setdefault(growth["scenario"], {}).setdefault(backend, []).append((growth["x"], figures(record), record))
    for by_backend in runs.values():
        for points in by_backend.values():
            points.sort(key=lambda point: point[0])
    return runs


def scale_x(ax, xs):
    low, high = min(xs), max(xs)
    if high >= 100 * max(low, 1):
        if low <= 0:
            ax.set_xscale("symlog", linthresh=max(1, sorted(set(xs))[1] if len(set(xs)) > 1 else 1))
        else:
            ax.set_xscale("log")


def plot(scenario, by_backend, images):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    what, how = SCENARIOS.get(scenario, (scenario, ""))
    panels = [
        ("throughput", "per second", [("throughput", "-", "o"), ("enqueue", ":", "^")]),
        ("latency", "ms", [("p50", "-", "o"), ("p99", "--", "s")]),
        ("idle claim / receive (p50)", "ms", [("claim_p50", "-", "o"), ("receive_p50", "--", "s")]),
        ("peak RSS", "MiB", [("rss_mib", "-", "o")]),
        ("store size after the run", "MiB", [("store_mib", "-", "o")]),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    xs = [x for points in by_backend.values() for x, _, _ in points]
    for ax, (title, unit, series) in zip(axes, panels):
        drawn = False
        for backend, points in by_backend.items():
            for name, style, marker in series:
                data = [(x, figs[name]) for x, figs, _ in points if figs.get(name) is not None]
                if not data:
                    continue
                ax.plot([d[0] for d in data], [d[1] for d in data], linestyle=style, marker=marker,
                        color=BACKENDS[backend], label=f"{backend} {name}")
                drawn = True
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_xlabel(what)
        scale_x(ax, xs)
        values = [figs[name] for points in by_backend.values() for _, figs, _ in points for name, _, _ in series
                  if figs.get(name)]
        if title.startswith("store") and values and max(values) >= 100 * min(values):
            ax.set_yscale("log")  # sizes spanning decades: a straight line is linear growth
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
    fig.suptitle(f"{scenario}: {what} ({how})", fontsize=11)
    fig.tight_layout()
    path = images / f"growth-{scenario}.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def fmt(value, digits=1):
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(scenario, by_backend):
    w = any(r["workload"] == "W" for points in by_backend.values() for _, _, r in points)
    head = "| Backend | x | " + ("workflows/s | p50 ms | p99 ms | claim ms |" if w else "drain jobs/s | enqueue/s | pickup p50 ms | p99 ms | receive ms |")
    head += " RSS MiB | store MiB |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for backend, points in by_backend.items():
        for x, f, _ in points:
            cells = [backend, f"{x:,}"]
            if w:
                cells += [fmt(f["throughput"]), fmt(f["p50"]), fmt(f["p99"]), fmt(f["claim_p50"], 2)]
            else:
                cells += [fmt(f["throughput"]), fmt(f["enqueue"]), fmt(f["p50"]), fmt(f["p99"]), fmt(f["receive_p50"], 2)]
            cells += [fmt(f["rss_mib"]), fmt(f["store_mib"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=pathlib.Path)
    parser.add_argument("--images", type=pathlib.Path, default=pathlib.Path("docs/images"))
    parser.add_argument("--tables", action="store_true")
    args = parser.parse_args()
    runs = load(args.records)
    if not runs:
        sys.exit(f"plot-bench.py: no records under {args.records}/sqlite or {args.records}/postgres")
    args.images.mkdir(parents=True, exist_ok=True)
    for scenario in [s for s in SCENARIOS if s in runs] + [s for s in runs if s not in SCENARIOS]:
        path = plot(scenario, runs[scenario], args.images)
        print(f"wrote {path}", file=sys.stderr)
        if args.tables:
            print(f"\n### {scenario}\n\n{table(scenario, runs[scenario])}")


if __name__ == "__main__":
    main()
