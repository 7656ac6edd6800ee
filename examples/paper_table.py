"""The ODMA papers' comparison, replayed: DeepSeek-R1-Distill-Qwen-7B on a Cambricon MLU370-X4.

Run from the repository root (needs ../shared/traces; 53 s on 2 CPU cores from an empty --work,
`fit` and `plan` included, which later runs reuse from --work: delete it after changing either):

    python examples/paper_table.py --work /tmp/odmactl-paper --out examples/paper_table.md

For each trace it ingests the source, trains the length predictor (`odmactl fit`) on the earlier
requests, and replays the next 5,000 (with their own timestamps, re-based to 0), via the same code as
`odmactl replay --compare`. Every row runs under the same output cap N (vLLM's max_tokens, the
papers' static baseline's reservation): the N at which static's utilization (the papers' metric:
the KV the requests used over the KV reserved for them, sum (p + min(o, N)) / sum (p + N)) is the
papers' 55.05% (their Alpaca figure). Rows:

- static at prompt + N, the Cambricon-vLLM 0.6.2 pre-allocation the ODMA papers compare with;
- paged at vLLM's 16-token blocks;
- s3 as its paper runs it (s3_overflow = "preempt") and odmactl's copy variant ("migrate");
- odma with its default settings: oracle lengths under the papers' Task Pool and under vLLM's FCFS
  scheduler unchanged (the short paper's reading), and the fitted predictor (its default u, the
  headroom, and on alpaca_eval also the papers' u, the class entropy);
- odma with the config `odmactl plan` writes for the fitted predictor, planned on the last
  PLAN_ROWS training requests (alpaca_eval only: the papers' setting), and where plan chose
  `large_spill`, the same config with a full large pool's blocks waiting for it.

Below the alpaca_eval table, `_best_split` bounds what any reservation by the predictor's L_hat
can reach at the papers' 0.5% overflow rate, fitted in hindsight on the replayed requests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"
TRACES = {
    # name: (ingest arguments, requests to train on, max_model_len of the dynamic policies, fit's split)
    "servegen reason/deepseek-r1": (["servegen/reason/deepseek-r1", "--format", "servegen", "--duration", "21600"],
                                    60_000, 16_384, "time"),
    # offline (no timestamps), and the 805 instructions recur across the 66 generators: split by prompt
    "alpaca_eval": (["alpaca_eval_model_outputs.jsonl.gz", "--offline"], 40_000, 8_192, "prompt"),
}
REPLAY_REQUESTS = 5_000
PLAN_ROWS = 10_000  # the training requests plan searches and validates on (the last ones)
SAID_FORMAT = 3  # what --work's plan JSON holds; one of another format is planned again
PAPERS = {"static_utilization": 0.5505, "odma_utilization": 0.7245, "tps_gain": 0.23}  # seeds/001 §5, Alpaca
PAPER_STATIC_UTILIZATION = {"Alpaca": 0.5505, "Google-NQ": 0.4254}  # seeds/001 §5, Figure 5
WAITING_ROW = "odma, fitted, planned config, waiting"  # the same with large_spill off
SPLIT_GROUPS = (16, 128)  # the L_hat groups of `_best_split`'s ceilings
METRIC_KEYS = ("kv_utilization", "tps", "ttft_p99", "tpot_p99", "migration_rate", "preemptions", "stalls",
               "peak_concurrency")


def run(args: list[str]) -> None:
    from odmactl.cli import main

    code = main(args)
    if code != 0:
        raise SystemExit(f"odmactl {' '.join(args)} failed ({code})")


def prepare(work: Path, name: str, ingest_args: list[str], train_rows: int, max_len: int, split: str) -> tuple[Path, Path]:
    from odmactl.trace.schema import read_trace

    slug = name.split()[0].replace("/", "-")
    full, train, test, pred = (work / f"{slug}.parquet", work / f"{slug}-train.parquet", work / f"{slug}-replay.parquet",
                               work / f"{slug}-predictor")
    if not full.exists():
        run(["ingest", str(SHARED / ingest_args[0]), *ingest_args[1:], "--out", str(full), "--seed", "0", "--json"])
    if not test.exists():
        frame = read_trace(full)
        frame.head(train_rows).write_parquet(train)
        part = frame.slice(train_rows, REPLAY_REQUESTS)
        part.with_columns(pl.col("arrival_s") - part["arrival_s"].min()).write_parquet(test)
    if not pred.exists():
        run(["fit", str(train), "--out", str(pred), "--max-model-len", str(max_len), "--split-by", split, "--json"])
    return test, pred


def _shape(name: str, part: dict) -> list[str]:
    """The papers' figures beside odmactl's, and a paragraph on where they differ (seeds/001 §5)."""
    rows = part["rows"]
    n = part["max_new_tokens"]
    static = rows[f"static, prompt + {n:,}"]["metrics"]
    oracle, fitted = rows["odma, oracle"]["metrics"], rows["odma, fitted"]["metrics"]
    planned = rows.get("odma, fitted, planned config")
    fcfs = rows["odma, oracle, fcfs"]["metrics"]
    gain = oracle["tps"] / static["tps"] - 1.0
    table = [["static utilization", f"{PAPERS['static_utilization']:.2%}", f"{static['kv_utilization']:.1%}"],
             ["ODMA utilization", f"{PAPERS['odma_utilization']:.2%}",
              f"{oracle['kv_utilization']:.1%} oracle, {fitted['kv_utilization']:.1%} fitted"
              + (f", {planned['metrics']['kv_utilization']:.1%} planned" if planned else "")],
             ["ODMA TPS over static", f"+{PAPERS['tps_gain']:.0%}",
              f"{gain:+.1%} oracle, {fitted['tps'] / static['tps'] - 1.0:+.1%} fitted"
              + (f", {planned['metrics']['tps'] / static['tps'] - 1.0:+.1%} planned" if planned else "")]]
    from odmactl.render.markdown import markdown_table

    lines = [f"### {name}: the papers (seeds/001 §5, Alpaca, four MLU370-X4) and odmactl (one card)", ""]
    lines += markdown_table(["figure", "papers", "odmactl"], table) + [""]
    over = fitted["overflow_rate"]
    lines += [
        f"Under the same {n:,}-token cap, odma with oracle lengths and its default settings uses "
        f"{oracle['kv_utilization']:.1%} of the KV it reserves ({static['kv_utilization']:.1%} for static) and serves "
        f"{gain:+.1%} TPS, with {oracle['overflow_rate']:.2%} of requests outgrowing their block. "
        + _tps_note(static, oracle) + " The papers' scheduler reading matters little with exact lengths: vLLM's FCFS "
        f"unchanged gives {fcfs['kv_utilization']:.1%} and {fcfs['tps']:,.0f} tok/s. With the fitted predictor the "
        f"default settings reach {fitted['kv_utilization']:.1%}, but {over:.1%} of requests outgrow their block "
        f"(migrated into the large bucket, or stalled until it had room: {fitted['stalls']:,} stalls): the "
        "predictor odmactl trains on these prompts (Kendall tau and bucket accuracy in `fit`'s report) ranks "
        "lengths, but not sharply enough: reserving, in each of 16 equal groups of L_hat, that group's 99.5th "
        f"percentile of the outputs (in hindsight, on these requests) uses {part['hindsight_utilization']:.1%} of the "
        f"KV, about static's figure, since {part['share_at_cap']:.1%} of the outputs reach the cap; so no "
        "reservation rule on this predictor keeps overflows under 0.5% much above static (`plan` searches that "
        "constraint: its row)."]
    entropy = rows.get("odma, fitted, papers' u (entropy)")
    if entropy:
        e, routed = entropy["metrics"], entropy["allocator"]["policy_counters"]["routed_large"]
        lines[-1] += (f" With the papers' u (the class entropy, tau 0.8) {routed:,} of the {e['completed']:,} requests "
                      f"took large blocks: {e['kv_utilization']:.1%} utilization and {e['tps']:,.0f} tok/s.")
    if planned:
        m, said = planned["metrics"], part["plan"]
        verdict = ("passes plan's own held-out gate" if said["holds"] else
                   f"is plan's closest candidate, which `odmactl plan` would not write (it {said['failure']}; this "
                   "script writes it to --work to replay it)")
        alloc = planned["allocator"]
        large_tokens = alloc["regions"]["large"]["pool_bytes"] // alloc["bytes_per_token"]
        top = planned["config"]["boundaries_tokens"][-1]
        spilled = alloc["policy_counters"]["large_spills"]
        split = part["best_split_utilization"]
        lines[-1] += (f" The planned config ({said['chosen']}, scheduler {said['scheduler']}"
                      f"{', large_spill' if planned['config'].get('large_spill') else ''}) {verdict}; replayed on "
                      f"these requests it keeps {m['overflow_rate']:.2%} overflowing at {m['kv_utilization']:.1%} "
                      f"utilization and {m['tps']:,.0f} tok/s (static: {static['tps']:,.0f}). Its large pool is small for "
                      f"these requests: plan sized it ({large_tokens:,} tokens, "
                      f"{planned['config']['large_pool_fraction']:.1%} of the KV) from the share of block-time large "
                      f"blocks took on its search part; here {alloc['policy_counters']['routed_large']:,} requests are "
                      f"admitted to large blocks (their hedged reservation, prompt + {n:,} for most, passes the top "
                      f"boundary as the refits move it; it ends at {top:,} tokens) and {alloc['migrations']:,} more move "
                      f"there as they outgrow their bucket, at most {large_tokens // (n + 1):,} at a time in the pool "
                      f"(blocks of prompt + {n:,}); {spilled:,} large blocks spilled to the main pool, so its mean batch "
                      f"was {m['mean_batch']:.1f} against static's {static['mean_batch']:.1f}.")
        wait = rows.get(WAITING_ROW)
        if wait:
            lines[-1] += (f" Waiting for the large pool instead (the next row), the same config serves "
                          f"{wait['metrics']['tps']:,.0f} tok/s (mean batch {wait['metrics']['mean_batch']:.1f}): plan "
                          "ranks the spill and the wait by the worse of two replays on its search part, with its large "
                          "pool and with half of it (docs/plan.md).")
        lines[-1] += (" Its utilization and TPS pass the bar odmactl holds a fitted predictor to (at least 60% and "
                      "static's TPS, with at most 0.5% of requests outgrowing); its overflows do not, and no reservation by this "
                      "predictor's L_hat can without fitting the answers it is scored on: the most any rule reserving "
                      "prompt + r_g per equal group of L_hat reaches with at most 0.5% of these requests outgrowing, "
                      f"the r_g chosen in hindsight on these very requests, is {split[16]:.1%} with 16 groups, and "
                      f"passes 60% only with 128 groups of {m['completed'] // 128:,} requests ({split[128]:.1%}). "
                      "plan's hedge table is that rule fitted on the search part instead.")
    known = part.get("known_effects")
    if known:
        k = known["best_split_utilization"]
        lines[-1] += (f" Nor would a sharper predictor pass by much. The split leaves {known['share_unseen']:.1%} of "
                      f"the replayed requests to {known['unseen_generators']} of their {known['generators']} generators, "
                      f"none among the {known['training_generators']} the predictor was fitted on (the trace lists each "
                      f"generator's outputs in turn; {known['prompts_seen']:.0%} of the prompts are in the training "
                      "part), but that is not what holds it back: a score that knows, in hindsight, each replayed "
                      "generator's offset, plus each prompt's mean log output over the training generators, reaches "
                      f"{k[16]:.1%} by the same rule with 16 groups and {k[128]:.1%} with 128 (ceilings computed on the "
                      "requests, not replays; bucket rounding and refits only lower them). The rest of the spread is "
                      "each output's own departure from its prompt's and its generator's typical length.")
    return lines + [""]


def _note(part: dict) -> list[str]:
    """A trace outside the papers' setting: what odma did, in numbers."""
    rows, n = part["rows"], part["max_new_tokens"]
    static, oracle = rows[f"static, prompt + {n:,}"]["metrics"], rows["odma, oracle"]["metrics"]
    counters = rows["odma, oracle"]["allocator"]["policy_counters"]
    bpt = rows["odma, oracle"]["allocator"]["bytes_per_token"]
    return [f"Outside the papers' setting (long prompts, {part['mean_prompt_tokens']:,.0f} tokens on average): odma "
            f"with oracle lengths uses {oracle['kv_utilization']:.1%} of what it reserves against static's "
            f"{static['kv_utilization']:.1%}, at {oracle['tps']:,.1f} tok/s against {static['tps']:,.1f}. "
            + _tps_note(static, oracle) + f" {counters['routed_large']:,} requests outgrow the top boundary "
            f"({rows['odma, oracle']['config']['boundaries_tokens'][-1]:,} tokens, the {0.99:.0%} quantile of KV "
            f"lengths, capped at max_model_len) and take blocks of prompt + {n:,} in the large pool, which held at "
            f"most {counters['peak_large_bytes'] // bpt:,} tokens of them at once.", ""]


def _tps_note(static: dict, odma: dict) -> str:
    """Why odma's TPS gain is what it is: the batch it ran against static's, and the step time."""
    batch = odma["mean_batch"] / static["mean_batch"] - 1.0
    step = odma["tpot_p50"] / static["tpot_p50"] - 1.0
    if batch <= 0:
        said = "so the memory it saves did not buy a larger batch here"
    elif odma["tps"] >= static["tps"]:
        said = "so the memory it saves buys that much more throughput"
    else:
        said = "so the memory it saves buys a larger batch, but not more throughput"
    return (f"TPS is output tokens over the run: odma's mean batch was {batch:+.1%} against static's "
            f"({odma['mean_batch']:.1f} and {static['mean_batch']:.1f} requests; peak {odma['peak_concurrency']:,} and "
            f"{static['peak_concurrency']:,}) and its median time per output token {step:+.1%}, {said}.")


def _max_new_at(prompt, output, target: float) -> int:
    """The max_new_tokens N at which static's utilization, sum (p + min(o, N)) / sum (p + N), is
    closest to `target` (it falls as N grows past the outputs, so the first N at or below it)."""
    import numpy as np

    p, o = prompt.astype(np.float64), output.astype(np.float64)
    lo, hi = 1, 1 << 24
    while lo < hi:
        mid = (lo + hi) // 2
        if (p + np.minimum(o, mid)).sum() / (p + mid).sum() <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _groups_of(frame, pred: Path, cap: int, groups: int):
    """(prompt, capped output, the group of each request: `groups` equal groups of the predictor's L_hat)."""
    import numpy as np

    from odmactl.predict.artifact import read_artifact

    l_hat, _ = read_artifact(pred).predict(frame)
    prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
    output = np.minimum(frame["output_tokens"].to_numpy(), cap).astype(np.int64)
    edges = np.quantile(l_hat, np.arange(1, groups) / groups)
    return prompt, output, np.searchsorted(edges, l_hat, side="right")


def _hindsight(frame, pred: Path, cap: int, groups: int = 16, level: float = 0.995) -> float:
    """The KV utilization of reserving prompt + the `level` quantile of the (capped) outputs of each
    of `groups` equal groups of the predictor's L_hat, fitted on these very requests: a ceiling for
    any rule that reserves by L_hat and lets at most 1 - level of them outgrow it."""
    import numpy as np

    prompt, output, group = _groups_of(frame, pred, cap, groups)
    need = np.zeros(output.size)
    for g in np.unique(group):
        need[group == g] = np.quantile(output[group == g], level)
    return float((prompt + output).sum() / (prompt + need).sum())


def _best_split(frame, pred: Path, cap: int, groups: int, share: float = 0.005) -> float:
    """The most KV utilization any rule that reserves prompt + r_g for the requests of each of
    `groups` equal groups of L_hat reaches with at most `share` of these requests outgrowing r_g,
    the r_g and how many outgrow in each group chosen in hindsight, on these very requests (exact:
    a knapsack over the groups of how many of the overflow budget each spends). Bucket rounding,
    refits and the large pool only lower it."""
    prompt, output, group = _groups_of(frame, pred, cap, groups)
    return _best_reservation(prompt, output, group, share)


def _best_reservation(prompt, output, group, share: float = 0.005) -> float:
    """`_best_split`'s knapsack for any grouping of the requests (`group`: one label each)."""
    import numpy as np

    budget = int(share * output.size)
    best = np.zeros(budget + 1)  # the fewest reserved output tokens over the groups so far, per overflows spent
    for g in np.unique(group):
        o = np.sort(output[group == g])[::-1]
        # spending j: r_g is the (j + 1)-th longest output (those equal to it do not outgrow, so at
        # most j do), or 0 when j covers the whole group
        cost = np.array([o.size * o[j] if j < o.size else 0 for j in range(budget + 1)], dtype=np.float64)
        best = np.array([min(best[k - j] + cost[j] for j in range(k + 1)) for k in range(budget + 1)])
    return float((prompt + output).sum() / (prompt.sum() + best.min()))


def _known_effects(train, frame, cap: int) -> dict:
    """How far the replayed requests' generators are from the fit's, and `_best_split`'s ceiling
    for a score no fit could have: each prompt's mean log (capped) output over the training
    generators, less their means (every replayed prompt is in the training part), plus each
    replayed generator's median offset from it, taken in hindsight on these very requests."""
    import numpy as np

    log_out = pl.col("output_tokens").clip(upper_bound=cap).log()
    seen = set(train["model"].drop_nulls().unique().to_list())
    offsets = train.with_columns(log_out.alias("lo")).with_columns(
        (pl.col("lo") - pl.col("lo").mean().over("model")).alias("d"))
    effect = offsets.group_by("prompt_text").agg(pl.col("d").mean().alias("effect"))
    replayed = frame.join(effect, on="prompt_text", how="left", maintain_order="left").with_columns(log_out.alias("lo"))
    score = replayed.with_columns(
        (pl.col("effect") + (pl.col("lo") - pl.col("effect")).median().over("model")).alias("score"))["score"]
    prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
    output = np.minimum(frame["output_tokens"].to_numpy(), cap).astype(np.int64)
    ceilings = {}
    for groups in SPLIT_GROUPS:
        edges = np.quantile(score.to_numpy(), np.arange(1, groups) / groups)
        ceilings[groups] = _best_reservation(prompt, output, np.searchsorted(edges, score.to_numpy(), side="right"))
    return {"generators": frame["model"].n_unique(), "unseen_generators": len(set(frame["model"].unique()) - seen),
            "training_generators": len(seen), "share_unseen": float((~frame["model"].is_in(list(seen))).mean()),
            "prompts_seen": float(frame["prompt_text"].is_in(train["prompt_text"].unique().implode()).mean()),
            "best_split_utilization": ceilings}


def _without_spill(config: Path) -> Path | None:
    """A copy of plan's config with a full large pool's blocks waiting for it (`large_spill` out of
    [allocator]), beside it; None where plan chose waiting."""
    text = config.read_text()
    start = text.index("\n[allocator]\n")
    end = text.find("\n[", start + 1)
    section = text[start:end]
    if "\nlarge_spill = true\n" not in section:
        return None
    copy = config.with_name(config.stem + "-waiting.toml")
    copy.write_text(text[:start] + section.replace("\nlarge_spill = true\n", "\n", 1) + text[end:])
    return copy


def _entropy_predictor(work: Path, name: str, max_len: int, split: str) -> Path:
    """The predictor `prepare` fits, fitted again with the papers' u (`fit --uncertainty entropy`)."""
    slug = name.split()[0].replace("/", "-")
    pred = work / f"{slug}-predictor-entropy"
    if not pred.exists():
        run(["fit", str(work / f"{slug}-train.parquet"), "--out", str(pred), "--max-model-len", str(max_len),
             "--split-by", split, "--uncertainty", "entropy", "--json"])
    return pred


def _plan(work: Path, name: str, train: Path, pred: Path, max_len: int, cap: int) -> tuple[Path, dict]:
    """`odmactl plan` on the last PLAN_ROWS training requests, fitted predictor, outputs capped at
    `cap`: the config it recommends (written to --work even when its gate fails, which `plan` itself
    would not write) and what plan said of it (reused from --work)."""
    from odmactl.allocator import AllocatorConfig
    from odmactl.plan.config import config_document, config_text
    from odmactl.plan.search import plan
    from odmactl.plan.spec import PlanSpec
    from odmactl.render.plan_text import config_heading, unmet
    from odmactl.trace.schema import read_trace

    slug = name.split()[0].replace("/", "-")
    config, said = work / f"{slug}-plan-{cap}.toml", work / f"{slug}-plan-{cap}.json"
    if not config.exists() or not said.exists() or json.loads(said.read_text()).get("format") != SAID_FORMAT:
        frame = read_trace(train).tail(PLAN_ROWS)
        spec = PlanSpec(device=DEVICE, model=MODEL, predictor=str(pred), max_model_len=max_len, max_new_tokens=cap)
        doc, setup = plan(frame, spec)
        document = config_document(doc, setup, "examples/paper_table.py", str(pred), str(train),
                                   AllocatorConfig.from_mapping(doc["validation"]["odma"]["config"]))
        config.write_text(config_text(document, config_heading(doc)))
        said.write_text(json.dumps({"holds": doc["holds"], "chosen": doc["chosen"]["label"],
                                    "scheduler": doc["scheduler"],
                                    "failure": None if doc["holds"] else unmet(doc), "format": SAID_FORMAT}))
    return config, json.loads(said.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] + " Needs ../shared/traces beside the "
                                     "repository; the first run fits two predictors and plans (about a minute on 2 "
                                     "cores), later runs reuse them from --work (delete it after changing fit or plan).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/odmactl-paper"),
                        help="folder for the ingested traces, their cuts, the fitted predictors and the plan (reused)")
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "paper_table.md",
                        help="the markdown table (and .json beside it); the default replaces the shipped one")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    from odmactl.render.json import to_json
    from odmactl.render.markdown import markdown_table
    from odmactl.render.metrics import METRICS, format_metric
    from odmactl.run.replay import run_policies
    from odmactl.run.spec import ReplaySpec
    from odmactl.trace.schema import read_trace

    lines = [f"# {MODEL} on {DEVICE}: static, paged, s3 and odma under one output cap", "",
             "Made by `python examples/paper_table.py` (see its docstring). Each row replays the same "
             f"{REPLAY_REQUESTS:,} requests, every policy under the same output cap N (vLLM's max_tokens), N set so "
             "that static at prompt + N has the papers' 55.05% utilization. \"fitted\": the length predictor "
             "fitted on the trace's earlier requests.", ""]
    everything = {}
    for name, (ingest_args, train_rows, max_len, split) in TRACES.items():
        test, pred = prepare(args.work, name, ingest_args, train_rows, max_len, split)
        frame = read_trace(test)
        prompt, output = frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy()
        cap = _max_new_at(prompt, output, PAPERS["static_utilization"])
        planned, planned_said = _plan(args.work, name, args.work / f"{name.split()[0].replace('/', '-')}-train.parquet",
                                      pred, max_len, cap) if name == "alpaca_eval" else (None, None)
        runs = [
            (f"static, prompt + {cap:,}", "static", str(pred), None, {}),
            ("paged (16-token blocks)", "paged", str(pred), None, {}),
            ("s3, preempt (its paper)", "s3", str(pred), None, {"s3_overflow": "preempt"}),
            ("s3, migrate (copy)", "s3", str(pred), None, {"s3_overflow": "migrate"}),
            ("odma, oracle", "odma", "oracle", None, {}),
            ("odma, oracle, fcfs", "odma", "oracle", None, {"[scheduler]": "fcfs"}),
            ("odma, fitted", "odma", str(pred), None, {}),
        ]
        if name == "alpaca_eval":  # the papers' u, the class entropy (the default is the headroom u: docs/policies.md)
            entropy = _entropy_predictor(args.work, name, max_len, split)
            runs.insert(7, ("odma, fitted, papers' u (entropy)", "odma", str(entropy), None, {}))
        if planned is not None:
            runs.append(("odma, fitted, planned config", "odma", str(pred), planned, {}))
            waiting = _without_spill(planned)
            if waiting is not None:
                runs.append((WAITING_ROW, "odma", str(pred), waiting, {}))
        rows = {}
        for label, policy, predictor, config, settings in runs:
            if settings:
                config = args.work / f"settings-{'-'.join(f'{k.strip(chr(91) + chr(93))}-{v}' for k, v in settings.items())}.toml"
                text = "".join(f'[scheduler]\npolicy = "{v}"\n' if k == "[scheduler]" else f'[allocator]\n{k} = "{v}"\n'
                               for k, v in settings.items())
                config.write_text(text)
            doc = run_policies(frame, [policy], ReplaySpec(device=DEVICE, model=MODEL, predictor=predictor,
                                                           max_model_len=max_len, config=config, max_new_tokens=cap,
                                                           allow_mismatch=config is not None))
            r = doc["results"][policy]
            r.pop("series")
            rows[label] = r
        everything[name] = {"rows": rows, "max_new_tokens": cap, "max_model_len": max_len,
                            "hindsight_utilization": _hindsight(frame, pred, cap),
                            "best_split_utilization": {g: _best_split(frame, pred, cap, g) for g in SPLIT_GROUPS},
                            "known_effects": (_known_effects(read_trace(args.work / "alpaca_eval-train.parquet"), frame,
                                                             cap) if name == "alpaca_eval" else None),
                            "share_at_cap": float((output >= cap).mean()),
                            "mean_output_tokens": float(output.mean()), "mean_prompt_tokens": float(prompt.mean()),
                            "plan": planned_said}
        table = [[key, r["scheduler"]] + [format_metric(k, r["metrics"][k]) for k in METRIC_KEYS]
                 + [f"{r['metrics'][k]:,}" for k in ("recomputed_tokens", "rejections", "truncated", "completed")]
                 for key, r in rows.items()]
        lines += [f"## {name}: max_model_len {max_len:,}, outputs capped at {cap:,}", ""]
        lines += markdown_table(["policy", "scheduler", *(METRICS[k].header for k in METRIC_KEYS), "recomputed",
                                 "rejected", "truncated", "completed"], table)
        lines += ["", f"Mean output {output.mean():,.0f} tokens (before the cap), mean prompt {prompt.mean():,.0f}; "
                  "truncated: outputs cut at the cap; rejected: prompts past max_model_len.", ""]
        lines += _shape(name, everything[name]) if name == "alpaca_eval" else _note(everything[name])
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(to_json(everything) + "\n")
    print("\n".join(lines))
    print(json.dumps({"written": [str(args.out), str(args.out.with_suffix('.json'))]}))


if __name__ == "__main__":
    main()
