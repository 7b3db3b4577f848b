"""Aggregates tools/cpu_timing.py records: totals, per-file table, top-N tests by wall.

    python tools/test_times.py DIR [N]     (DIR: the CPU_TIMING_DIR of a run; docs/testing.md)"""
import collections, glob, json, os, sys

d = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
recs = [json.loads(l) for f in glob.glob(os.path.join(d, "*.jsonl")) for l in open(f)]
tot_wall = sum(r["wall"] for r in recs); tot_cpu = sum(r["self_cpu"] + r["child_cpu"] for r in recs)
print(f"{len(recs)} tests; sum of test wall {tot_wall/60:.1f} min; CPU {tot_cpu/60:.1f} min "
      f"(in-process {sum(r['self_cpu'] for r in recs)/60:.1f}, subprocesses {sum(r['child_cpu'] for r in recs)/60:.1f})")
per = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
for r in recs:
    p = per[r["id"].split("::")[0]]
    p[0] += 1; p[1] += r["wall"]; p[2] += r["self_cpu"]; p[3] += r["child_cpu"]
print("\n| file | tests | wall s | CPU s (in-process + subprocesses) |\n|---|---:|---:|---:|")
for f, (k, w, s, c) in sorted(per.items(), key=lambda kv: -(kv[1][2] + kv[1][3])):
    print(f"| {f.replace('tests/', '')} | {k} | {w:.0f} | {s + c:.0f} ({s:.0f} + {c:.0f}) |")
print(f"\n| # | test | wall s | CPU s |\n|---:|---|---:|---:|")
for i, r in enumerate(sorted(recs, key=lambda r: -r["wall"])[:n], 1):
    print(f"| {i} | {r['id'].replace('tests/', '')} | {r['wall']:.1f} | {r['self_cpu'] + r['child_cpu']:.1f} |")
