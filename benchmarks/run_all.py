"""`make bench`: run every benchmark script in turn, then print one summary table.

Each script prints its own table and writes benchmarks/results/<name>.json;
this file only sequences them (one at a time: they measure the same machine)
and summarises the headline ratio of each against its target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, print_table, write_json

HERE = Path(__file__).resolve().parent
SCRIPTS = {
    "env_speed": [],
    "rollout_throughput": [],
    "fusion_tokens": [],
    "store_write": [],
    "orchestration": [],
    "webshop_speed": [],
    "webshop_oracle": [],
    "alfworld_speed": [],
    "ray_rollouts": [],
    "vllm_rollouts": [],
    "sft_memory": [],
    "sft_packing": [],
}
# Scripts that need something `make install` does not build: skipped, naming the fix, when it is missing.
REQUIRES = {"vllm_rollouts": (HERE.parent / ".venv-vllm" / "bin" / "python", "run `make vllm` first")}


def headline(name: str, data: dict) -> list:
    """(figure, measured, target, met) for the summary, read from a result file (or a list of them)."""
    def get(*path, default=None):
        cur = data
        for p in path:
            if not isinstance(cur, dict) or p not in cur:
                return default
            cur = cur[p]
        return cur

    if name == "env_speed":
        speed = get("scienceworld_speed", default={})
        mem = get("scienceworld_memory", "configs", default={})
        rows = []
        if speed:
            r, shipped = speed["speedup_stock_over_fast"], speed.get("speedup_package_as_shipped_over_fast")
            rows.append(["ScienceWorld step vs stock env.step()",
                         f"{r}x (package as shipped: {shipped}x); identical: {speed['equal']}", ">= 10x, identical",
                         str(r >= 10 and speed["equal"])])
        adapter = next((v for k, v in mem.items() if "adapter default" in k), None)
        package = next((v for k, v in mem.items() if k.startswith("package")), None)
        if adapter and package:
            rows.append(["ScienceWorld peak RSS per env",
                         f"{adapter['peak_jvm_rss_mib']} vs {package['peak_jvm_rss_mib']} MiB; "
                         f"{adapter['envs_in_24_gib']} vs {package['envs_in_24_gib']} envs in 24 GiB", "<= 600 MB",
                         str(adapter["peak_jvm_rss_mib"] <= 600 * 10**6 / 2**20)])
        return rows or [name, "see results/env_speed.json", "", ""]
    if name == "store_write":
        return ["store write, 10k steps", f"{data['write_s']:.2f} s ({data['speedup']:.0f}x vs row-by-row)", "< 1 s",
                str(data["target_write_under_1s"])]
    if name == "fusion_tokens":
        r = get("by_step", "20", "ratio") or get("by_step", 20, "ratio")
        return ["fusion: prompt tokens at t=20", f"{r:.2f}x fewer" if r else "n/a", ">= 4x", str(bool(r and r >= 4))]
    if name == "orchestration":
        o = data["overhead_fraction"]
        return ["Dagster overhead", f"{o:.1%}", "<= 5%", str(o <= 0.05)]
    if name == "ray_rollouts":
        return ["Ray backend vs local threads, episodes/min (same tasks, model)",
                f"{data['ratio_ray_over_local']:.2f}x (cluster start {data['cluster_start_s']:.0f} s apart)",
                "small overhead", str(data["ratio_ray_over_local"] >= 0.8)]
    if name == "rollout_throughput":
        s = data.get("speedup_at_8", {})
        return ["batched rollouts (8 envs) vs sequential", ", ".join(f"{k}: {v:.2f}x" for k, v in s.items()), ">= 3x",
                str(all(v >= 3 for v in s.values()) if s else False)]
    if name == "vllm_rollouts":
        r = data.get("ratios", {})
        return ["managed vLLM rollouts (8 envs) vs transformers",
                f"{r.get('vllm8_over_transformers8', float('nan')):.2f}x vs 8 envs, "
                f"{r.get('vllm8_over_transformers1', float('nan')):.2f}x vs sequential",
                ">= 3x and >= 6x", str(bool(data.get("target_met")))]
    if name == "sft_memory":
        mib, ratio = data["lowest_peak_mib"], data["speed_ratio_whole_over_micro"]
        return [f"SFT peak RSS, steps of {data['batch_size']} (micro-batch {data['lowest_peak_micro_batch']})",
                f"{mib / 1024:.1f} GiB; step time whole-batch / micro: {ratio}x", "< 8 GiB, >= 1x",
                str(mib < data["target_mib"] and (ratio or 0) >= 1)]
    if name == "sft_packing":
        rows = get("results", default=[])
        cells = "; ".join(f"{r['preset']}: tokens {r['token_ratio']:.2f}x, wall {r['step_time_ratio']:.2f}x"
                          for r in rows)
        gated = [r for r in rows if "webshop" not in r["preset"]]  # WebShop is reported, not targeted
        met = bool(gated) and all(r["token_ratio"] >= 2 and r["step_time_ratio"] >= 1.8 for r in gated)
        return ["packed SFT vs per step, identical steps (per step / packed)", cells,
                ">= 2x tokens, >= 1.8x wall (ScienceWorld, ALFWorld)", str(met)]
    if name == "webshop_oracle":
        mism = sum(get("differential", "project_vs_reference_mismatches", default={}).values())
        o = get("oracle", default={})
        return ["WebShop reward vs a port of the published one; oracle success",
                f"{mism} mismatches on {sum(get('differential', 'cases', default={}).values())} purchases; "
                f"oracle {o.get('successes')}/{o.get('goals')}", "0 mismatches", str(mism == 0)]
    return [name, "see results/" + name + ".json", "", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(SCRIPTS))
    ap.add_argument("--summary-only", action="store_true", help="re-read results/*.json; run nothing")
    args = ap.parse_args(argv)
    ran = {}
    if args.summary_only:
        ran = {name: {"returncode": 0, "seconds": None} for name in args.only}
    for name in [] if args.summary_only else args.only:
        script = HERE / f"{name}.py"
        if not script.exists():
            print(f"skip {name}: {script.name} not present")
            continue
        if name in REQUIRES and not REQUIRES[name][0].exists():
            print(f"skip {name}: {REQUIRES[name][0]} missing ({REQUIRES[name][1]})")
            continue
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(script), *SCRIPTS.get(name, [])], cwd=HERE.parent)
        ran[name] = {"returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
    rows = []
    for name in ran:
        path = RESULTS / f"{name}.json"
        if ran[name]["returncode"] == 0 and path.exists():
            got = headline(name, json.loads(path.read_text()))
            rows.extend(got if got and isinstance(got[0], list) else [got])
        else:
            rows.append([name, f"FAILED (exit {ran[name]['returncode']})", "", ""])
    print_table("Summary (each figure is a ratio measured in the same run)", ["figure", "measured", "target", "met"], rows)
    if not args.summary_only:
        write_json("summary", {"scripts": ran, "rows": rows})
    return 0 if all(r["returncode"] == 0 for r in ran.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
