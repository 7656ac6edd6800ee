"""What binds a capacity answer: the zero-load floor of the SLO's terms, which term breaks above
the rate found, whether memory binds (the policies tie), and the headline that decides.

- **Zero-load floor.** Each request served alone (no queue, no other request in its batch): its
  TTFT is its prompt's prefill, its TPOT a batch-1 decode step at the middle of its output (a step
  grows linearly with the KV read, so that is its mean step). The floor is their p50 and p99 over
  the trace. An SLO limit under its floor fails at every rate; within 20% of it (NEAR_FLOOR) the
  search works in a narrow band and the answer moves with small changes of the limit, so the
  output warns.
- **What breaks.** The limits that fail at the first rate tried above the one found.
- **Memory binds** at a tp when static at max_model_len (the row "static": the most memory a
  request can reserve) serves less per engine than the best row by more than the search's
  tolerance: where it is within, the KV pool limits not even it, and what differences remain
  between the rows are their step times (paged reads blocks, contiguous policies one run). Without
  a static row, when any two rows differ so (memory or a step time: `rates_differ`). Devices for
  the target may differ either way (R engines behind the router, and each policy's step time).
- **Headline.** The fewest devices for the target over every (policy, tp) row (among rows that
  tie, the one with the fewest engines, then the lowest TTFT p99 and TPOT p99 at the target: ties
  are decided by latency), the rows that tie with it, and the saving against the best static row
  and the best paged row.
"""

from __future__ import annotations

import numpy as np

from odmactl.capacity.search import latency_order
from odmactl.hw.cost import KvLayout
from odmactl.render.metrics import compared
from odmactl.run.replay import ReplayContext

NEAR_FLOOR = 0.8  # a limit at most 1 / 0.8 = 1.25 times its floor (within 20%) is warned of


def zero_load(ctx: ReplayContext) -> dict:
    """The SLO terms with every request alone (the module docstring), in seconds, and the longest
    prompt's prefill."""
    cost, w = ctx.serving.cost, ctx.workload
    prompts = np.minimum(w.prompt_tokens.astype(np.int64), ctx.max_len - 1)
    outputs = np.minimum(w.output_tokens.astype(np.int64), ctx.max_len - prompts)
    if ctx.scheduler.max_new_tokens is not None:
        outputs = np.minimum(outputs, ctx.scheduler.max_new_tokens)
    ttft = np.array([cost.prefill.seconds(int(p), int(p) * int(p), 1) for p in prompts.tolist()])
    coeff = cost.step_coefficients(KvLayout.contiguous(), max_batch=1)  # the cheapest read: a lower bound for every policy
    multi = outputs > 1
    tpot = np.array([coeff.step_ps([int(p + o // 2)]) / 1e12 for p, o in zip(prompts[multi].tolist(), outputs[multi].tolist())])
    longest = int(np.argmax(prompts))
    out = {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
           "longest_prompt_tokens": int(prompts[longest]), "longest_prefill_s": float(ttft[longest])}
    out.update({"tpot_p50": float(np.percentile(tpot, 50)), "tpot_p99": float(np.percentile(tpot, 99))} if tpot.size
               else {"tpot_p50": 0.0, "tpot_p99": 0.0})
    return out


def near_floor(floor: dict, limits: tuple[tuple[str, float], ...]) -> list[str]:
    """The SLO terms whose limit is within 20% of (or under) the zero-load floor (the console tells
    the two apart)."""
    return [m for m, limit in limits if floor[m] >= NEAR_FLOOR * limit]


def floor_cause(floor: dict, limits: tuple[tuple[str, float], ...], chunked: bool) -> str:
    """Why no rate meets the SLO, from the floor: a term under its floor, else what queues."""
    under = [(m, limit) for m, limit in limits if floor[m] > limit]
    if under:
        parts = []
        for m, limit in under:
            why = (f"the longest prompt, {floor['longest_prompt_tokens']:,} tokens, prefills in "
                   f"{floor['longest_prefill_s']:.3g} s alone") if m.startswith("ttft") else \
                "each a batch-1 decode step, its read of the weights and KV alone"
            parts.append(f"{m} alone is " + " against ".join(compared(m, floor[m], limit)) + f" ({why})")
        return "; ".join(parts) + ": a looser limit, a larger tp or a faster device lifts it"
    stall = "" if chunked else (f"; without chunked prefill a decode waits for every prefill that joins its batch "
                                f"(the longest takes {floor['longest_prefill_s']:.3g} s): --engine vllm-v1 chunks them")
    return ("every term is under its limit for a request alone, so queueing breaks it: requests that arrive "
            "together (the trace's bursts; --arrivals poisson replays the same requests without them)" + stall
            + ", or a larger tp")


def breaking(probes: list[dict], next_scale: float | None) -> list[str]:
    """The limits that failed at the first rate tried above the one found."""
    above = next((p for p in probes if p["rate_scale"] == next_scale), None)
    return [] if above is None else [f[0] for f in above["failures"]]


def _rates_differ(rates: list, tolerance: float) -> bool:
    """Whether rates per engine differ by more than `tolerance` (a row without a rate differs from one with)."""
    known = [rate for rate in rates if rate is not None]
    return bool(known) and (len(known) < len(rates) or max(known) > (1 + tolerance) * min(known))


def rates_differ(rows: list[dict], tolerance: float) -> dict[int, bool]:
    """Per tp: whether the rows' rates per engine differ by more than the search's tolerance."""
    return {tp: _rates_differ([r["max_rate_per_replica"] for r in rows if r["tp"] == tp], tolerance)
            for tp in sorted({r["tp"] for r in rows})}


def memory_binding(rows: list[dict], tolerance: float) -> dict[int, bool]:
    """Per tp: whether memory binds one engine (the module docstring): static at max_model_len
    against the best row, else any two rows."""
    out = {}
    for tp, differ in rates_differ(rows, tolerance).items():
        mine = [r for r in rows if r["tp"] == tp]
        static = [r["max_rate_per_replica"] for r in mine if r["policy"] == "static"]
        best = max((r["max_rate_per_replica"] for r in mine if r["max_rate_per_replica"] is not None), default=None)
        out[tp] = differ if not static or best is None else _rates_differ([static[0], best], tolerance)
    return out


def headline(rows: list[dict]) -> dict | None:
    """The cheapest rows for the target and the savings (the module docstring); None when no row
    has devices for it."""
    feasible = [r for r in rows if r["devices_for_target"] is not None]
    if not feasible:
        return None
    fewest = min(r["devices_for_target"] for r in feasible)
    ties = [r for r in feasible if r["devices_for_target"] == fewest]
    def latency(r: dict) -> tuple:  # among ties, the fewest engines, then the lowest latencies at the target
        return r["replicas_for_target"], *latency_order(r.get("metrics_at_target")), r["tp"]

    best = min(ties, key=latency)

    def saving(prefix: str) -> dict | None:
        mine = [r for r in feasible if r["policy"] == prefix or r["policy"].startswith(prefix + "+")]
        if not mine:
            return None
        top = min(mine, key=lambda r: (r["devices_for_target"], r["tp"]))
        return {"policy": top["policy"], "tp": top["tp"], "devices": top["devices_for_target"],
                "saved": top["devices_for_target"] - fewest, "router": top["router"]}

    return {"devices": fewest, "policy": best["policy"], "tp": best["tp"], "replicas": best["replicas_for_target"],
            "router": best["router"],
            "ties": [f"{r['policy']} tp {r['tp']}" for r in ties if r is not best],
            "vs_static": saving("static"), "vs_paged": saving("paged")}
