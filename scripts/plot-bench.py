#!/usr/bin/env python3
"""Plots the records of scripts/bench-growth.sh: one PNG per scenario
(throughput, p50/p99 latency, the idle claim/receive probes, peak RSS and
store size against the grown quantity), both backends on the same axes
when both record sets are present.

    plot-bench.py RECORDS_DIR [--images docs/images] [--tables] [--peers RESULTS.json]

RECORDS_DIR holds sqlite/ and/or postgres/ (as bench-growth.sh writes
them). --tables also prints a Markdown table per scenario to stdout.
--peers draws, on each throughput panel, the peers' medians from a
results file of ../shared/bench/peers/run.sh (their default shape: the
point where a scenario's grown quantity has the harness's value).
For the steps scenario, throughput and CPU are per step, so that a
cost growing linearly with the steps draws a flat line.
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
            "cpu_ms": (extra.get("cpu") or {}).get("total_ms_per_workflow"),
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


def per_step(scenario, by_backend):
    """The steps scenario's throughput and CPU per step (x is the steps)."""
    if scenario != "steps":
        return by_backend
    scaled = {}
    for backend, points in by_backend.items():
        scaled[backend] = []
        for x, figs, record in points:
            figs = dict(figs)
            if figs.get("throughput") is not None:
                figs["throughput"] *= x
            if figs.get("cpu_ms") is not None:
                figs["cpu_ms"] /= x
            scaled[backend].append((x, figs, record))
    return scaled


def peer_lines(peers, workload):
    """[(peer, median)] of the throughput metric of `workload` in a harness
    results file, rota's own entries left out (they are the plotted ones)."""
    if not peers:
        return []
    metric = "workflows_per_s" if workload == "W" else "drain_jobs_per_s"
    lines = []
    for entry in peers.get("medians", []):
        if entry.get("workload") == workload and entry.get("metric") == metric and entry.get("median") is not None:
            if not str(entry.get("peer", "")).startswith("rota"):
                lines.append((entry["peer"], entry["median"]))
    return lines


def plot(scenario, by_backend, images, peers=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    what, how = SCENARIOS.get(scenario, (scenario, ""))
    by_backend = per_step(scenario, by_backend)
    unit = "steps" if scenario == "steps" else "workflows"
    panels = [
        ("throughput", "steps per second" if scenario == "steps" else "per second", [("throughput", "-", "o"), ("enqueue", ":", "^")]),
        ("latency", "ms", [("p50", "-", "o"), ("p99", "--", "s")]),
        ("idle claim / receive (p50)", "ms", [("claim_p50", "-", "o"), ("receive_p50", "--", "s")]),
        (f"CPU per {unit[:-1]} (all processes)", "ms", [("cpu_ms", "-", "o")]),
        ("peak RSS", "MiB", [("rss_mib", "-", "o")]),
        ("store size after the run", "MiB", [("store_mib", "-", "o")]),
    ]
    fig, grid = plt.subplots(2, (len(panels) + 1) // 2, figsize=(13, 7))
    axes = list(grid.flat)
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
        if title == "throughput" and scenario != "steps":
            workload = next(r["workload"] for points in by_backend.values() for _, _, r in points)
            for (peer, median), color in zip(peer_lines(peers, workload), ["tab:gray", "tab:green", "tab:red", "tab:purple", "tab:brown"]):
                ax.axhline(median, linestyle=":", color=color, label=f"{peer} (harness)")
                drawn = True
        ax.set_title(title, fontsize=10)
        if not drawn:
            # A drain times no workflow of its own, so it has no latency.
            ax.text(0.5, 0.5, "not measured in this scenario", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        ax.set_ylabel(unit)
        ax.set_xlabel(what)
        scale_x(ax, xs)
        if min(xs) <= 0:
            ax.set_xlim(left=0)
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
    head = "| Backend | x | " + ("workflows/s | p50 ms | p99 ms | claim ms | CPU ms/wf |" if w else "drain jobs/s | enqueue/s | pickup p50 ms | p99 ms | receive ms |")
    head += " RSS MiB | store MiB |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for backend, points in by_backend.items():
        for x, f, _ in points:
            cells = [backend, f"{x:,}"]
            if w:
                cells += [fmt(f["throughput"]), fmt(f["p50"]), fmt(f["p99"]), fmt(f["claim_p50"], 2), fmt(f["cpu_ms"], 2)]
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
    parser.add_argument("--peers", type=pathlib.Path, help="a results file of the peer harness")
    args = parser.parse_args()
    runs = load(args.records)
    if not runs:
        sys.exit(f"plot-bench.py: no records under {args.records}/sqlite or {args.records}/postgres")
    args.images.mkdir(parents=True, exist_ok=True)
    try:
        peers = json.loads(args.peers.read_text()) if args.peers else None
    except (OSError, json.JSONDecodeError) as err:
        sys.exit(f"plot-bench.py: --peers {args.peers}: {err}")
    for scenario in [s for s in SCENARIOS if s in runs] + [s for s in runs if s not in SCENARIOS]:
        path = plot(scenario, runs[scenario], args.images, peers)
        print(f"wrote {path}", file=sys.stderr)
        if args.tables:
            print(f"\n### {scenario}\n\n{table(scenario, runs[scenario])}")


if __name__ == "__main__":
    main()
