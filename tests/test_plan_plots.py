"""The plots of `odmactl plan`'s HTML report (render/plan_plots.py), checked on matplotlib's objects:
the Pareto plot's axes fit its points (and stay readable when every overflow rate is 0, as under the
oracle predictor), the boundaries are a rug of one tick a boundary under the histogram (not
full-height lines over it) with the last refit's row only when the refit changed them, and pool
occupancy is a panel per policy on shared axes from 0 to 1."""

from __future__ import annotations

import base64
import copy

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from odmactl.render import plan_plots  # noqa: E402
from odmactl.rules.s3 import s3_capacities  # noqa: E402

POLICIES = ("odma", "static", "static+1024", "paged", "s3")
MAX_LEN = 8192


def _series(rng, start: float, end: float, n: int = 300, refits: list | None = None) -> dict:
    t = np.sort(rng.uniform(start, end, n))
    return {"time_s": t.tolist(), "pool_occupancy": np.clip(rng.normal(0.8, 0.1, n), 0, 1).tolist(),
            "batch_size": [10] * n, "queue_length": [0] * n, "bucket_boundaries": refits or []}


def _config(**extra) -> dict:
    return {"boundaries_tokens": [], "num_buckets": 4, "granularity_tokens": 16, "s3_num_buckets": 10,
            "refit": True, **extra}


def _doc(overflow=None, boundaries=None, last=None, seed=0) -> dict:
    """A plan document with what the plots read: 200 candidates' estimates, 6 replays (the third
    recommended), the held-out histogram and the validation replays of POLICIES."""
    rng = np.random.default_rng(seed)
    boundaries = list(range(144, 144 + 16 * 70, 16)) if boundaries is None else boundaries  # 70, a fine config
    if overflow is None:
        overflow = lambda n: np.where(rng.random(n) < 0.2, 0.0, 10 ** rng.uniform(-4, -0.2, n))  # noqa: E731
    est_x, rep_x = overflow(200), overflow(6)
    estimates = [{"label": f"c{i}",
                  "estimate": {"overflow_rate": float(x), "kv_utilization": float(rng.uniform(0.3, 0.95))}}
                 for i, x in enumerate(est_x)]
    replays = [{"label": f"r{i}", "estimate": {"overflow_rate": float(x), "kv_utilization": 0.8},
                "measured": {"overflow_rate": float(x), "kv_utilization": float(rng.uniform(0.8, 0.9))}}
               for i, x in enumerate(rep_x)]
    refits = [{"time_s": 10.0, "boundaries_tokens": boundaries}]
    if last is not None:
        refits.append({"time_s": 700.0, "boundaries_tokens": last})
    validation = {}
    for name in POLICIES:
        config = _config(boundaries_tokens=boundaries, num_buckets=128) if name == "odma" else _config()
        series = _series(rng, 10.0 if name == "odma" else 500.0, 1200.0 if name != "static" else 4000.0,
                         refits=refits if name == "odma" else None)
        validation[name] = {"config": config, "series": series, "metrics": {"pool_occupancy": 0.8}}
    counts, edges = np.histogram(rng.lognormal(7, 0.6, 1200).clip(0, MAX_LEN), bins=80, range=(0, MAX_LEN))
    return {"search": {"estimates": estimates, "replays": replays}, "chosen": {"label": "r2"},
            "max_overflow_rate": 0.005, "objective": "tps", "constraints_met_on_search": True,
            "max_model_len": MAX_LEN, "validation": validation,
            "holdout_histogram": {"edges_tokens": edges.tolist(), "counts": counts.tolist()}}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _points_x(ax) -> np.ndarray:
    return np.concatenate([c.get_offsets()[:, 0] for c in ax.collections if len(c.get_offsets())])


def _inside(values, lo, hi) -> bool:
    return bool(np.all((np.asarray(values) >= lo) & (np.asarray(values) <= hi)))


def test_pareto_axes_fit_the_points_and_the_limit():
    doc = _doc()
    fig = plan_plots.pareto_figure(doc)
    ax, near = fig.axes  # every candidate, and the replayed zoomed
    assert ax.get_xscale() == "symlog"  # some points at 0
    lo, hi = ax.get_xlim()
    xs = _points_x(ax)
    assert lo < 0 < hi and _inside(xs, lo, hi) and lo < doc["max_overflow_rate"] < hi
    # no more than a decade and a half past the largest point: the axis fits, it does not pad to 1
    assert hi <= max(xs.max(), doc["max_overflow_rate"]) * 1.5 + 1e-12
    ylo, yhi = ax.get_ylim()
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert _inside(ys, ylo, yhi) and yhi - ylo < 1.0
    limits = [line for line in ax.get_lines() if line.get_label().startswith("overflow-rate limit")]
    assert len(limits) == 1 and limits[0].get_xdata()[0] == doc["max_overflow_rate"]
    assert any(t.get_text().startswith("recommended: r2") for t in fig.legends[0].get_texts())
    # the zoomed panel: linear, fits the replayed (x and y) closely, the recommendation on it
    rx = [r["measured"]["overflow_rate"] for r in doc["search"]["replays"]]
    ry = [r["measured"]["kv_utilization"] for r in doc["search"]["replays"]]
    lo, hi = near.get_xlim()
    assert near.get_xscale() == "linear" and _inside(rx, lo, hi) and hi - lo < 1.3 * (max(rx) - min(rx)) + 1e-12
    ylo, yhi = near.get_ylim()
    assert _inside(ry, ylo, yhi) and yhi - ylo < 1.3 * (max(ry) - min(ry))
    assert ry[2] in near.collections[-1].get_offsets()[:, 1]  # the star, the third replayed


def test_pareto_without_zeros_is_logarithmic():
    doc = _doc(overflow=lambda n: np.geomspace(1e-3, 0.3, n))
    ax, near = plan_plots.pareto_figure(doc).axes
    lo, hi = ax.get_xlim()
    assert ax.get_xscale() == "log" and 0 < lo < 1e-3 and 0.3 < hi < 0.5


def test_the_zoom_shows_the_limit_only_when_it_is_near_the_replayed():
    """Replays at 0.42% and 0.46% under a 0.5% limit (a fitted predictor's): the zoom spans the
    limit; replays at 10 to 30%: the limit is left off the zoom (it is on the main panel)."""
    near_limit = _doc(overflow=lambda n: np.linspace(0.0042, 0.0046, n))
    far = _doc(overflow=lambda n: np.linspace(0.1, 0.3, n))
    for doc, shown in ((near_limit, True), (far, False)):
        ax, near = plan_plots.pareto_figure(doc).axes
        lo, hi = near.get_xlim()
        assert (lo <= doc["max_overflow_rate"] <= hi) == shown and len(near.get_lines()) == 1 + shown  # front + limit
        assert len(ax.get_lines()) == 2  # the front and the limit, on the main panel either way


def test_pareto_with_every_overflow_rate_zero_is_not_degenerate():
    """The oracle predictor: every candidate at 0. The axis still spans 0 and the limit (0 clear
    of the spine), and the title says there is no trade-off."""
    doc = _doc(overflow=lambda n: np.zeros(n))
    assert plan_plots.pareto_axis(np.zeros(10), 0.005)["degenerate"]
    fig = plan_plots.pareto_figure(doc)
    ax, = fig.axes  # no zoomed panel: nothing to zoom into
    lo, hi = ax.get_xlim()
    assert ax.get_xscale() == "symlog" and lo < 0 < hi and lo < doc["max_overflow_rate"] < hi
    assert hi <= 0.05  # a decade past the limit at most, not out to 100%
    # 0 sits well inside the axis, not on its left spine: at least a tenth of the width from it
    left, right = (ax.transData.transform([[v, 0]])[0, 0] for v in (lo, hi))
    zero = ax.transData.transform([[0.0, 0]])[0, 0]
    assert (zero - left) / (right - left) > 0.1
    assert "overflow rate 0" in fig.get_suptitle() and "does not bind" in fig.get_suptitle()


def test_pareto_legend_is_outside_the_data():
    fig = plan_plots.pareto_figure(_doc())
    fig.canvas.draw()
    assert len(fig.axes) == 2 and len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent()
    for ax in fig.axes:
        assert ax.get_legend() is None and not legend.overlaps(ax.get_window_extent())
    assert len(fig.legends[0].get_texts()) == 5  # each thing once, though the zoom draws the replayed again
    assert legend.x0 >= 0 and legend.x1 <= fig.bbox.width  # not clipped by the figure


def _rug_rows(rug) -> dict:
    return {c.get_label(): c for c in rug.collections}


def test_boundaries_are_a_rug_of_one_tick_each_under_the_histogram():
    doc = _doc()
    start = doc["validation"]["odma"]["config"]["boundaries_tokens"]
    fig = plan_plots.boundaries_figure(doc)
    hist, rug = fig.axes
    assert len(hist.patches) == 80  # the bars, unhidden: no boundary drawn over them
    assert not hist.get_lines() and not hist.collections and hist.get_legend() is None
    rows = _rug_rows(rug)
    assert set(rows) == {"odma_start", "s3"}  # one set of ODMA's: the refits did not change them
    assert len(rows["odma_start"].get_segments()) == len(start) == 70
    assert sorted(seg[0][0] for seg in rows["odma_start"].get_segments()) == start
    assert len(rows["s3"].get_segments()) == len(s3_capacities(MAX_LEN, 10))
    assert rows["odma_start"].get_color()[0].tolist() != rows["s3"].get_color()[0].tolist()  # S3 distinct
    labels = [t.get_text() for t in rug.get_yticklabels()]
    assert any("70 boundaries" in text for text in labels)
    assert "128 buckets give 70 distinct boundaries" in rug.get_title()
    lo, hi = hist.get_xlim()
    assert lo == 0 and hi >= MAX_LEN and hist.get_shared_x_axes().joined(hist, rug)


def test_boundaries_show_the_last_refit_when_it_changed_them():
    last = [256, 512, 1024, 2048]
    doc = _doc(boundaries=[128, 256, 384, 4096], last=last)
    hist, rug = plan_plots.boundaries_figure(doc).axes
    rows = _rug_rows(rug)
    assert list(rows) == ["odma_start", "odma_last", "s3"]
    assert sorted(seg[0][0] for seg in rows["odma_last"].get_segments()) == last
    assert any("(690 s): 4" in t.get_text() for t in rug.get_yticklabels())  # 700 s less the series' start
    assert "changed them once" in rug.get_title()
    # a few boundaries are also drawn faintly behind the bars
    faint = hist.get_lines()
    assert len(faint) == 4 and all(line.get_alpha() <= 0.3 and line.get_zorder() < 2 for line in faint)


def test_boundaries_without_s3():
    doc = _doc()
    del doc["validation"]["s3"]
    _, rug = plan_plots.boundaries_figure(doc).axes
    assert set(_rug_rows(rug)) == {"odma_start"}


def test_occupancy_is_a_panel_per_policy_on_shared_axes_from_0_to_1():
    doc = _doc()
    fig = plan_plots.occupancy_figure(doc)
    axes = fig.axes
    assert len(axes) == len(POLICIES)
    assert [ax.get_ylabel().split("\n")[0] for ax in axes] == list(POLICIES)
    for ax in axes:
        assert ax.get_ylim() == pytest.approx((0, 1.02))
        assert ax.get_shared_x_axes().joined(ax, axes[0]) and ax.get_shared_y_axes().joined(ax, axes[0])
        raw, smooth = ax.get_lines()  # every sample thin, the moving mean thick
        assert raw.get_linewidth() < smooth.get_linewidth() and raw.get_xdata()[0] == 0
        assert _inside(smooth.get_ydata(), 0, 1)
    # the window is a round one within a 40th of the longest replay (about 3,500 s here), and stated
    longest = max(v["series"]["time_s"][-1] - v["series"]["time_s"][0] for v in doc["validation"].values())
    assert 3000 < longest < 3990 and plan_plots.smoothing_window(longest) == 60 and "60 s window" in axes[0].get_title()
    assert axes[0].get_xlim()[0] == 0 and axes[0].get_xlim()[1] >= longest


def test_moving_mean_is_time_weighted():
    """A step at 0 until 10 s, then 1 until 20 s: a 2 s window's mean is 0 before 9, 1 past 11."""
    t, m = plan_plots.moving_mean(np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 1.0]), 2.0)
    assert np.all(m[t < 8.9] == 0) and np.allclose(m[(t > 11.1) & (t < 19)], 1)


def test_the_pngs_are_pngs_and_close_their_figures():
    doc = _doc(overflow=lambda n: np.zeros(n))
    before = plt.get_fignums()
    for fn in (plan_plots.pareto_png, plan_plots.boundaries_png, plan_plots.occupancy_png):
        assert base64.b64decode(fn(copy.deepcopy(doc)))[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == before
