"""The paper's tables regenerated from an experiment's stores: `flywheel paper EXPERIMENT` (and the
`paper_report` asset) writes paper.md, paper.json and fig2_success_by_complexity.png.

- Table 1: per method, every registered benchmark's evaluation splits (`flywheel.core.metrics.result_columns`),
  each in its spec's `primary_metric` (success rate, or average reward).
- Table 2: the stage ablation: base, +stage 1, +stage 2, +stage 3 (k = 1..K).
- Table 4: SFT vs SFT+DPO vs SFT+GRPO vs BPO (on `envs.DEFAULT_BENCHMARK` when given, else the first
  experiment's benchmark).
- Table 5: tokens per step and success, fused vs full-history long thoughts (bpo-stage1 vs react-sft at k=0:
  the same expert data, the same SFT, only the prompt differs; bpo-stage2's k=0 where no bpo-stage1 arm ran).
- Fig. 2: success by complexity bucket (gold path length; the spec's `eval_bucket_edges`).

Each method's row is its last evaluated checkpoint. Every cell has n and a 95% interval: success rates
with Wilson intervals, mean rewards and tokens per step with a bootstrap over episodes (2,000
resamples, seeded), differences paired over the same tasks (`flywheel.core.quality.paired_difference`).
Reads the stores only; writes nothing to them. Notes on what differs from the paper: each spec's
`paper_notes`, then `NOTES`, then the presets' own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import envs
from flywheel.config.presets import RESULTS_DIR, Preset, load_preset
from flywheel.core.metrics import (
    PRIMARY_METRICS,
    ResultColumn,
    display_name,
    md_table,
    result_columns,
    success_cell,
)
from flywheel.core.provenance import read_arm
from flywheel.core.quality import BOOT, arm_checkpoints, paired_difference, rate
from flywheel.core.settings import DEFAULT_RUNS_DIR
from flywheel.core.store import READER_WAIT_S, Store, check_store
from flywheel.core.validation import ConfigurationError
from flywheel.orchestration.methods import METHODS, placed

NOTES = [
    "The policy is SmolLM2-135M trained on CPU (the paper trains Llama-3.1-8B and others on GPUs); the "
    "preset's limits (tasks, steps, SFT steps) are far below the paper's.",
    "The teacher is the scripted teacher (templated long thoughts and plans) unless the preset configures an "
    "OpenAI-compatible endpoint.",
    "Each method's row is its last evaluated checkpoint; rates are Wilson 95% intervals, means and tokens per "
    "step have a 95% bootstrap interval over episodes, differences are paired over the same tasks.",
]


def default_dirs(experiment: str, runs: str | Path | None = None, results: str | Path | None = None,
                 runs_root: Path = DEFAULT_RUNS_DIR) -> tuple[Path, Path]:
    preset = load_preset(experiment)
    return (Path(runs) if runs else runs_root / "experiments" / preset.name,
            Path(results) if results else RESULTS_DIR / preset.name / "paper")


def collect(presets: list[tuple[Preset, Path]], committed: Path | None = RESULTS_DIR) -> dict[str, Any]:
    """Every arm of every preset: its method, prompt shape and evaluated checkpoints, from its store in the
    runs folder, else from its committed results (`committed`/PRESET/arms/ARM.json, written by
    `flywheel experiment` in another sitting or on another machine); `origin` says which, with its provenance."""
    arms: list[dict[str, Any]] = []
    for preset, runs in presets:
        for arm in preset.arms:
            db_path = runs / arm / "flywheel.duckdb"
            sections = preset.arm_sections(arm)
            entry = {"preset": preset.name, "arm": arm, "benchmark": preset.benchmark, "method": preset.method(arm),
                     "history_mode": sections.get("policy", {}).get("history_mode", "fused"), "checkpoints": {},
                     "start_from": sections.get("method", {}).get("start_from"), "origin": "not run"}
            recorded = read_arm(committed / preset.name, arm) if committed is not None else None
            if db_path.exists():
                # Read whole, read-only: a damaged store is refused before anything is written; a writer is named.
                check_store(db_path, lock_timeout_s=READER_WAIT_S)
                entry.update(checkpoints=arm_checkpoints(Store.reader(db_path), preset.benchmark),
                             origin=f"store {db_path}")
            elif recorded is not None:
                entry.update(checkpoints={int(k): v for k, v in recorded["paper"].items()},
                             origin=f"committed {preset.name}/arms/{arm}.json")
            if recorded is not None:
                entry["provenance"] = recorded.get("provenance", {})
            arms.append(entry)
    return {"arms": arms, "presets": [p.name for p, _ in presets]}


# -- tables ----------------------------------------------------------------------------------
def _mean_cell(r: dict[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    if not r or r["value"] is None:
        return "-"
    return f"{scale * r['value']:.{digits}f} [{scale * r['ci_low']:.{digits}f}, {scale * r['ci_high']:.{digits}f}] (n={r['n']})"


def _diff_cell(d: dict[str, Any] | None) -> str:
    if not d or not d["n"]:
        return "-"
    return (f"{100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}] (n={d['n']}, "
            f"+{d['gained']}/-{d['lost']}, p={d['mcnemar_p']:.2g})")


def _label(arm: dict[str, Any], k: int | None = None, *, with_arm: bool = False) -> str:
    label = METHODS[arm["method"]].label
    if with_arm or arm["arm"] not in (arm["method"], label):
        label += f" (`{arm['arm']}`)"
    return label + (f", k={k}" if k is not None else "")


def _final(arm: dict[str, Any]) -> dict[str, Any] | None:
    return arm["checkpoints"][max(arm["checkpoints"])] if arm["checkpoints"] else None


def _all_outcomes(ck: dict[str, Any]) -> dict[str, bool]:
    return {f"{s}/{t}": ok for s, v in ck["splits"].items() for t, ok in v["outcomes"].items()}


def _paired(new: dict[str, Any] | None, old: dict[str, Any] | None) -> dict[str, Any] | None:
    if not new or not old:
        return None
    return paired_difference(_all_outcomes(new), _all_outcomes(old), n_boot=BOOT)


# A split's cell in a benchmark's primary metric (see PRIMARY_METRICS).
_METRIC_CELLS = {"success_rate": lambda s: success_cell(s["success"], counts=False), "avg_reward": lambda s: _mean_cell(s["reward"])}


def _table1_columns() -> list[tuple[ResultColumn, str]]:
    """(column, metric): every split in its benchmark's primary metric, followed by its success rate where the
    primary metric is another (average reward, then success %)."""
    return [(c, m) for c in result_columns()
            for m in dict.fromkeys((c.metric, "success_rate"))]


def _column_title(column: ResultColumn, metric: str) -> str:
    label = PRIMARY_METRICS[metric] or ("success %" if column.metric != metric else "")
    return " ".join(t for t in (column.title, label) if t)


def table1(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    columns = _table1_columns()
    by_method: dict[tuple[str, str], dict[tuple[str, str, str], str]] = {}
    for arm in data["arms"]:
        ck = _final(arm)
        row = by_method.setdefault((arm["method"], arm["arm"]), {})
        for c, metric in columns:
            if arm["benchmark"] != c.benchmark or not ck:
                continue
            s = ck["splits"].get(c.split)
            if s is None:
                continue
            row[(c.benchmark, c.split, metric)] = _METRIC_CELLS[metric](s) + f" k={ck['k']}"
    order = list(METHODS)
    rows = []
    for (method, arm_name), cells in sorted(by_method.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        arm = {"method": method, "arm": arm_name}
        rows.append([_label(arm)] + [cells.get((c.benchmark, c.split, m), "not run") for c, m in columns])
    return ["method"] + [_column_title(c, m) for c, m in columns], rows


def _arms(data: dict[str, Any], *methods: str, benchmark: str | None = None) -> list[dict[str, Any]]:
    return [a for a in data["arms"] if a["method"] in methods and a["checkpoints"]
            and (benchmark is None or a["benchmark"] == benchmark)]


def _root_start(data: dict[str, Any], arm: dict[str, Any]) -> str | None:
    """The arm whose k=0 `arm` starts from, following `start_from` through arms of its preset that start from
    another (`grpo-lr1e4` -> `grpo` -> `react-sft-r2`); `load_preset` refuses cycles."""
    by_name = {a["arm"]: a for a in data["arms"] if a["preset"] == arm["preset"]}
    start = arm.get("start_from")
    while start in by_name and by_name[start].get("start_from"):
        start = by_name[start]["start_from"]
    return start


def _splits(arms: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for a in arms:
        for ck in a["checkpoints"].values():
            seen += [s for s in ck["splits"] if s not in seen]
    return sorted(seen, key=lambda s: ("seen", "unseen").index(s) if s in ("seen", "unseen") else 2)


def _start(data: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any] | None:
    """The k=0 a stage-3 arm continued from: its own evaluated checkpoint 0, else its `start_from` arm's."""
    if 0 in arm["checkpoints"]:
        return arm["checkpoints"][0]
    source = next((a for a in data["arms"] if a["preset"] == arm["preset"] and a["arm"] == arm.get("start_from")),
                  None)
    return source["checkpoints"].get(0) if source else None


def _primary(arms: list[dict[str, Any]], method: str) -> dict[str, Any] | None:
    """The arm named after its method (`react-sft`), else the first: a variant (`react-sft-1pass`) is not the
    reference its method's comparisons are made against."""
    return next((a for a in arms if a["arm"] == method), arms[0] if arms else None)


def table2(data: dict[str, Any], benchmark: str) -> tuple[list[str], list[list[str]]]:
    """Base, + stage 1, + stage 2: each against the row before. Stage 3 (k = 1..K), per run: each k against
    that run's k-1, from the k=0 it continued from (a replicate that retrained its k=0 gets a stage-2 row)."""
    rows_ck: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
    refining = [m.name for m in placed(lambda p: p.ablation and p.ablation_per_k)]
    first = min((METHODS[m].paper.row for m in refining), default=None)
    stages = placed(lambda p: p.ablation and not p.ablation_per_k)
    # The k=0 stage the per-k rows continue from: the last one before them (stage 2).
    start = ([m for m in stages if first is None or m.paper.row < first] or stages or [None])[-1]
    prev = before_start = None
    for m in stages:
        if m is start:  # a replicate's own k=0 is compared with the stage before the one it continues from
            before_start = prev
        for a in _arms(data, m.name, benchmark=benchmark):
            ck = _final(a)
            rows_ck.append((m.paper.ablation + ("" if a["arm"] == m.name else f" (`{a['arm']}`)"), ck, prev))
            prev = ck
    for a in _arms(data, *refining, benchmark=benchmark):
        tag = "" if a["arm"] in refining else f" (`{a['arm']}`)"
        prev = _start(data, a)
        if 0 in a["checkpoints"] and start is not None:
            rows_ck.append((f"{start.paper.ablation}{tag}, its own k=0", a["checkpoints"][0], before_start))
        for k in sorted(k for k in a["checkpoints"] if k >= 1):
            rows_ck.append((f"{METHODS[a['method']].paper.ablation}, k={k}{tag}", a["checkpoints"][k], prev))
            prev = a["checkpoints"][k]
    splits = _splits([a for a in data["arms"] if a["benchmark"] == benchmark])
    rows = [[name] + [success_cell(ck["splits"].get(s, {}).get("success"), counts=False) for s in splits]
            + [_diff_cell(_paired(ck, before))] for name, ck, before in rows_ck]
    return (["row"] + [f"{s} success % [95% CI]" for s in splits]
            + ["vs the stage before, pts (paired, all splits)"], rows)


def table4(data: dict[str, Any], benchmark: str) -> tuple[list[str], list[list[str]]]:
    """Each method against one ReAct SFT: the one the DPO, GRPO and RFT arms continued from when they share
    one (their paired difference is then their own gain), else the arm `react-sft`."""
    reference = [m.name for m in placed(lambda p: p.reference)]
    sfts = _arms(data, *reference, benchmark=benchmark)
    continuing = [m.name for m in placed(lambda p: p.continues_reference)]
    starts = {_root_start(data, a) for a in _arms(data, *continuing, benchmark=benchmark)}
    sft = (next((a for a in sfts if len(starts) == 1 and a["arm"] in starts), None)
           or _primary(sfts, reference[0] if reference else ""))
    sft_ck = _final(sft) if sft else None
    splits = _splits([a for a in data["arms"] if a["benchmark"] == benchmark])
    rows = []
    for m in placed(lambda p: p.comparison):
        for a in _arms(data, m.name, benchmark=benchmark):
            ck = _final(a)
            rows.append([f"{m.paper.comparison}" + ("" if a["arm"] == m.name else f" (`{a['arm']}`)") + f", k={ck['k']}"]
                        + [success_cell(ck["splits"].get(s, {}).get("success"), counts=False) for s in splits]
                        + [_diff_cell(_paired(ck, sft_ck)) if a is not sft else "-"])
    header_sft = f"vs SFT (`{sft['arm']}`)" if sft else "vs SFT"
    return ["method"] + [f"{s} success % [95% CI]" for s in splits] + [f"{header_sft}, pts (paired, all splits)"], rows


def table5(data: dict[str, Any], benchmark: str) -> tuple[list[str], list[list[str]]]:
    # The fused k=0 is bpo-stage1's (the same expert data as react-sft); without that arm, bpo-stage2's (the
    # same prompt shape with stage 2's synthetic tasks added: the mode column says so).
    def shaped(shape: str) -> list[dict[str, Any]]:
        return _arms(data, *[m.name for m in placed(lambda p: p.prompt_shape == shape)], benchmark=benchmark)

    fused = shaped("fused") or shaped("fused, else")
    pick = fused + shaped("react")
    if not pick:  # any k=0 SFT of either prompt shape
        pick = [a for a in data["arms"] if a["benchmark"] == benchmark and 0 in a["checkpoints"]
                and METHODS[a["method"]].trains]
    splits = _splits(pick)
    rows = []
    for a in pick:
        if 0 not in a["checkpoints"]:
            continue
        ck = a["checkpoints"][0]
        mode = "fused (plan + action history)" if a["history_mode"] == "fused" else "full history (ReAct, long thoughts)"
        mode += METHODS[a["method"]].paper.prompt_note
        for s in splits:
            v = ck["splits"].get(s)
            if v:
                rows.append([_label(a, 0), mode, s, _mean_cell(v["prompt_tokens_per_step"], digits=0),
                             _mean_cell(v["tokens_per_step"], digits=0), _mean_cell(v["mean_steps"], digits=2),
                             success_cell(v["success"], counts=False)])
    return ["method", "prompt", "split", "prompt tokens/step [95% CI] (n episodes)", "tokens/step [95% CI]",
            "steps/episode", "success % [95% CI]"], rows


def fig2_rows(data: dict[str, Any], benchmark: str) -> list[dict[str, Any]]:
    """Per method (last checkpoint) and bucket: successes / episodes summed over the evaluation splits."""
    out = []
    for a in data["arms"]:
        ck = _final(a)
        if a["benchmark"] != benchmark or not ck:
            continue
        agg: dict[str, list[Any]] = {}
        for b in ck["buckets"]:
            cell = agg.setdefault(b["bucket"], [0, 0, b["lo"], b["hi"]])
            cell[0] += int(b["successes"])
            cell[1] += int(b["episodes"])
        for bucket, (s, n, lo, hi) in agg.items():
            out.append({"arm": a["arm"], "method": a["method"], "label": _label(a, ck["k"]), "bucket": bucket,
                        "gold_steps": _range(lo, hi), **rate(s, n)})
    return out


def _range(lo: float | None, hi: float | None) -> str:
    if lo is None and hi is None:
        return "no gold path"
    if lo is None:
        return f"<= {hi:g}"
    return f"> {lo:g}" if hi is None else f"{lo:g} < n <= {hi:g}"


def render_fig2(rows: list[dict[str, Any]], out: Path, benchmark: str) -> bool:
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets = [b for b in ("easy", "medium", "hard", "unknown") if any(r["bucket"] == b for r in rows)]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(buckets) * max(1, len(labels)) / 3), 4.5))
    for i, label in enumerate(labels):
        xs, ys, lo, hi = [], [], [], []
        for j, b in enumerate(buckets):
            r = next((r for r in rows if r["label"] == label and r["bucket"] == b), None)
            if r and r["n"]:
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(100 * r["rate"])
                lo.append(max(0.0, 100 * (r["rate"] - r["ci_low"])))
                hi.append(max(0.0, 100 * (r["ci_high"] - r["rate"])))
        ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=label)
    names = {b: f"{b}\n{next(r['gold_steps'] for r in rows if r['bucket'] == b)} gold steps" for b in buckets}
    ax.set_xticks(range(len(buckets)), [names[b] for b in buckets])
    ax.set_ylabel("success % (95% Wilson CI)")
    ax.set_title(f"Fig. 2: success by task complexity ({benchmark})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def _display(benchmark: str) -> str:
    return display_name(envs.get_benchmark(benchmark))


def paper_notes() -> list[str]:
    """The registered specs' `paper_notes`, benchmarks in name order (Table 1 shows them all)."""
    return [n for name in sorted(envs.REGISTRY) for n in getattr(envs.get_benchmark(name), "paper_notes", ())]


def render(data: dict[str, Any], presets: list[Preset]) -> str:
    benches = list(dict.fromkeys(p.benchmark for p in presets))
    # Table 4's benchmark (the paper's is envs.DEFAULT_BENCHMARK, ScienceWorld).
    table4_bench = envs.DEFAULT_BENCHMARK if envs.DEFAULT_BENCHMARK in benches else benches[0]
    rewards = " and ".join(dict.fromkeys(_display(c.benchmark) for c in result_columns() if c.metric == "avg_reward"))
    parts = [f"# The paper's tables: {', '.join(data['presets'])}", "",
             "Regenerated by `flywheel paper " + " ".join(data["presets"]) + "` from the experiments' stores. "
             "Cells: value [95% interval] (n). Success rates in percent with Wilson intervals; "
             + (f"{rewards} average reward, " if rewards else "")
             + "tokens per step and steps per episode with a 95% bootstrap interval over episodes; "
             "differences in points, paired over the same tasks (bootstrap interval, tasks gained/lost, exact "
             "McNemar p).", ""]
    h, r = table1(data)
    parts += ["## Table 1: main results (last checkpoint of each method)", "", md_table(h, r), ""]
    for b in benches:
        h, r = table2(data, b)
        parts += [f"## Table 2: stage ablation ({b})", "", md_table(h, r) if r else "No ablation arms were run.", ""]
    h, r = table4(data, table4_bench)
    parts += [f"## Table 4: SFT vs SFT+DPO vs SFT+GRPO vs BPO ({table4_bench})", ""]
    if table4_bench != envs.DEFAULT_BENCHMARK:
        parts += [f"(No {_display(envs.DEFAULT_BENCHMARK)} experiment given: shown on this benchmark.)", ""]
    parts += [md_table(h, r) if r else "No SFT/DPO/GRPO/BPO arms were run.", ""]
    for b in benches:
        h, r = table5(data, b)
        parts += [f"## Table 5: fused vs full-history long thoughts ({b}, k=0: same expert data, only the prompt "
                  "differs)", "", md_table(h, r) if r else "No k=0 SFT arms were run.", ""]
    for b in benches:
        rows = data["fig2"].get(b, [])
        parts += [f"## Fig. 2: success by complexity bucket ({b}; gold path length)", ""]
        parts += [md_table(["method", "bucket", "gold steps", "success % [95% CI]"],
                      [[x["label"], x["bucket"], x["gold_steps"], success_cell(x, counts=False)] for x in rows]) if rows
                  else "No bucketed evaluation yet.", ""]
        if data["figures"].get(b):
            parts += [f"![Fig. 2]({data['figures'][b]})", ""]
    notes = paper_notes() + NOTES + [n for p in presets for n in p.notes]
    parts += ["## What differs from the paper", ""] + [f"- {n}" for n in dict.fromkeys(notes)] + [""]
    return "\n".join(parts)


def write_paper(experiments: str | list[str], *, runs: Path | None = None, results: Path | None = None,
                runs_root: Path = DEFAULT_RUNS_DIR) -> dict[str, Any]:
    """paper.md, paper.json and the Fig. 2 PNG(s) for one or more experiments into `results`."""
    names = [experiments] if isinstance(experiments, str) else list(experiments)
    if runs is not None and len(names) > 1:
        raise ConfigurationError("--runs-dir names one experiment's runs; give one experiment with it")
    loaded = []
    for name in names:
        preset = load_preset(name)
        r, _ = default_dirs(name, runs, results, runs_root=runs_root)
        loaded.append((preset, r))
    if not any((r / arm / "flywheel.duckdb").exists() or read_arm(RESULTS_DIR / p.name, arm) is not None
               for p, r in loaded for arm in p.arms):
        looked = "; ".join(f"{r}/{{{','.join(p.arms)}}}/flywheel.duckdb" for p, r in loaded)
        raise ConfigurationError(f"no experiment store or committed arm results found (looked for {looked} and "
                                 f"{RESULTS_DIR}/NAME/arms/): run `python -m flywheel.cli "
                                 f"experiment {names[0]}` first, or point --runs-dir (or the profile's runs_dir) at its runs")
    results = results or (RESULTS_DIR / loaded[0][0].name / "paper" if len(names) == 1
                          else RESULTS_DIR / ("paper-" + "-".join(p.name for p, _ in loaded)))
    data = collect(loaded)  # first: a damaged store is refused before the results folder is made
    results.mkdir(parents=True, exist_ok=True)
    data["fig2"], data["figures"] = {}, {}
    for bench in dict.fromkeys(p.benchmark for p, _ in loaded):
        rows = fig2_rows(data, bench)
        data["fig2"][bench] = rows
        name = "fig2_success_by_complexity.png" if len(loaded) == 1 else f"fig2_success_by_complexity_{bench}.png"
        if render_fig2(rows, results / name, bench):
            data["figures"][bench] = name
    md = render(data, [p for p, _ in loaded])
    (results / "paper.md").write_text(md + "\n")
    (results / "paper.json").write_text(json.dumps(data, indent=1, default=str))
    data["methods"] = sorted({a["method"] for a in data["arms"]})
    data["results_dir"] = str(results)
    return data
