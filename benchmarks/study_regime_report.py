"""The regime study's section of docs/results.md and its plots, from its saved records alone.

Written by ``python benchmarks/study.py --plan regime`` (``--report``: from the records saved so far,
running nothing); the numbers on the page all come from here, through :mod:`study_regime`'s
summaries of the records.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import study
import study_regime as rg

SECTION = "regime"


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _ci(xs: list[float]) -> str:
    m, h = study.mean_ci(xs)
    return f"{m:.3f}" + ("" if math.isnan(h) else f" ± {h:.3f}")


def _diff(c: tuple[float, float, float, float] | None) -> str:
    if c is None:
        return "-"
    d, lo, hi, p = c
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] {study._p(p)}"


def _scan_lookup(data: dict) -> dict[tuple[str, int, float, int], dict]:
    return {
        (r["setting"].workflow, r["setting"].epochs, r["setting"].lr, r["setting"].staleness): r for r in data["scan"]
    }


def _spread_points(scan: dict, obj: str, epochs: int, lr: float) -> dict[int, float]:
    """The summed log-ratio's spread at each K of the ``coord_par<K>`` workflows, for one objective and setting."""
    out = {}
    for wf in rg.SCAN_WORKFLOWS:
        row = scan.get((wf, epochs, lr, 0))
        if wf.startswith("coord_par") and row and obj in row["objectives"] and row["objectives"][obj]["spread"] > 0:
            out[row["k"]] = row["objectives"][obj]["spread"]
    return out


def plot(data: dict, img_dir: Path) -> list[Path]:
    """Clip share and held-out area against epochs, one column per workflow (set size), one line per
    objective (solid lr 1e-3, dashed 3e-3); and the summed log-ratio's spread against K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    scan = _scan_lookup(data)
    wfs = rg.SCAN_WORKFLOWS
    colour = {o: f"C{i}" for i, o in enumerate(rg.OBJECTIVES)}
    fig, axes = plt.subplots(2, len(wfs), figsize=(3.3 * len(wfs), 6.2), squeeze=False)
    for j, wf in enumerate(wfs):
        k = rg.Setting(wf, 1, 1e-3).k
        for lr, ls in ((1e-3, "-"), (3e-3, "--")):
            for obj in rg.Setting(wf, 1, lr).cells():
                pts = [(e, scan[(wf, e, lr, 0)]["objectives"].get(obj)) for e in (1, 2, 4, 8) if (wf, e, lr, 0) in scan]
                pts = [(e, o) for e, o in pts if o]
                if not pts:
                    continue
                xs = [e for e, _ in pts]
                lab = f"{rg.LABEL[obj]}" if lr == 1e-3 else None
                axes[0][j].plot(
                    xs, [100 * o["clip"] for _, o in pts], ls=ls, marker="o", ms=3, color=colour[obj], label=lab
                )
                axes[1][j].plot(xs, [o["area"] for _, o in pts], ls=ls, marker="o", ms=3, color=colour[obj], label=lab)
        axes[0][j].axhline(100 * rg.CLIP_BAR, color="grey", ls=":", lw=1)
        axes[1][j].axhline(rg.CHANCE, color="grey", ls=":", lw=1)
        axes[0][j].set_title(f"{wf} (largest set K = {k})", fontsize=9)
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
            ax.set_xlabel("epochs per batch", fontsize=8)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"% of size-K items clipped\n(dotted: the {100 * rg.CLIP_BAR:.0f}% bar)", fontsize=8)
    axes[1][0].set_ylabel("held-out accuracy, area\n(mean of steps 20/40/60; dotted: chance)", fontsize=8)
    for ax in (axes[0][0], axes[0][-1]):  # the mixed workflow's panel has its own `independent` line
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(
        f"regime scan: mean over seeds 0..{rg.SCAN_SEEDS - 1}; solid lr 1e-3, dashed lr 3e-3"
        + (" (PARTIAL)" if data["todo"] else ""),
        fontsize=9,
    )
    fig.tight_layout()
    scan_png = img_dir / "study_regime_scan.png"
    fig.savefig(scan_png, dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), squeeze=False)
    for ax, e in zip(axes[0], (2, 4, 8)):
        for obj in ("srpo_sum", "srpo", "srpo_mean", "grpo"):
            spread = _spread_points(scan, obj, e, 1e-3)
            if spread:
                ax.plot(list(spread), list(spread.values()), marker="o", color=colour[obj], label=rg.LABEL[obj])
                if obj == "srpo_sum":
                    k0, v0 = next(iter(spread.items()))
                    ax.plot(list(spread), [v0 * (kk / k0) ** 0.5 for kk in spread], color="grey", ls=":", label="∝ √K")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([2, 3, 5, 8], ["2", "3", "5", "8"])
        ax.set_xticks([], minor=True)
        ax.set_title(f"{e} epochs, lr 1e-3", fontsize=9)
        ax.set_xlabel("set size K", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("rms of the summed member\nlog-ratio (K^alpha x logged)", fontsize=8)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    spread_png = img_dir / "study_regime_spread.png"
    fig.savefig(spread_png, dpi=90)
    plt.close(fig)
    return [scan_png, spread_png]


def _scan_table(data: dict) -> list[str]:
    objs = ("srpo_sum", "srpo", "srpo_mean", "grpo")
    lines = [
        "| workflow (K) | epochs | lr | stale | clipped at K: sum / √K / mean / GRPO "
        "| spread at K: sum / √K / mean / GRPO "
        "| steps over the grad-norm clip: sum / √K / mean / GRPO | grad-norm CV (√K) | area: sum / √K / mean / GRPO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["scan"]:
        s, per = row["setting"], row["objectives"]

        def cols(field: str, fmt, per=per) -> str:
            return " / ".join(fmt(per[o][field]) if o in per else "-" for o in objs)

        if not per:
            lines.append(f"| {s.workflow} ({row['k']}) | {s.epochs} | {s.lr:g} | {s.staleness} | not run yet | | | | |")
            continue
        lines.append(
            f"| {s.workflow} ({row['k']}) | {s.epochs} | {s.lr:g} | {s.staleness} | {cols('clip', _pct)} | "
            f"{cols('spread', lambda v: f'{v:.3f}')} | {cols('grad_clipped', _pct)} | "
            f"{study._fmt(per.get('srpo', {}).get('grad_cv'), 2)} | "
            f"{cols('area', lambda v: f'{v:.3f}')} |"
        )
    return lines


def _slopes(data: dict) -> list[str]:
    """The spread of the summed log-ratio against K (coord_par2..8): its log-log slope per objective."""
    scan = _scan_lookup(data)
    lines = [
        "| epochs, lr | " + " | ".join(rg.LABEL[o] for o in ("srpo_sum", "srpo", "srpo_mean", "grpo")) + " |",
        "|---|---|---|---|---|",
    ]
    for e, lr in ((2, 1e-3), (4, 1e-3), (8, 1e-3), (2, 3e-3), (4, 3e-3)):
        cells = []
        for obj in ("srpo_sum", "srpo", "srpo_mean", "grpo"):
            pts = _spread_points(scan, obj, e, lr)
            cells.append(f"{rg.spread_slope(pts):.2f}" if len(pts) > 1 else "-")
        lines.append(f"| {e}, {lr:g} | " + " | ".join(cells) + " |")
    return lines


def _staleness(data: dict) -> list[str]:
    scan = _scan_lookup(data)
    lines = [
        "| workflow | staleness | importance-weight sd at K: sum / √K / mean / GRPO | clipped: sum / √K / mean / GRPO "
        "| area: sum / √K / mean / GRPO |",
        "|---|---|---|---|---|",
    ]
    for wf in ("coord_par3", "coord_par5"):
        for st in (0, 1, 2):
            row = scan.get((wf, 2, 1e-3, st))
            if not row or not row["objectives"]:
                continue
            per = row["objectives"]

            def cols(field: str, fmt, per=per) -> str:
                return " / ".join(
                    fmt(per[o][field]) if o in per else "-" for o in ("srpo_sum", "srpo", "srpo_mean", "grpo")
                )

            lines.append(
                f"| {wf} | {st} | {cols('is_std', lambda v: f'{v:.3f}')} | {cols('clip', _pct)} | "
                f"{cols('area', lambda v: f'{v:.3f}')} |"
            )
    return lines


def report_same(recs: list[dict], a: str, b: str) -> int:
    """:func:`_same_runs` over the records of several settings (a seed counts once per setting)."""
    return sum(
        _same_runs([r for r in recs if r.get("workflow") == wf], a, b) for wf in {r.get("workflow") for r in recs}
    )


def _same_runs(recs: list[dict], a: str, b: str) -> int:
    """The number of seeds on which ``a`` and ``b`` ran, when every one of them gave both the same evaluations
    (0 when one differs or none ran both)."""
    by = {(r["objective"], r["seed"]): r["eval"] for r in recs}
    both = [s for o, s in by if o == a and (b, s) in by]
    return len(both) if both and all(by[(a, s)] == by[(b, s)] for s in both) else 0


def _compare(data: dict) -> tuple[list[str], list[dict]]:
    seeds = list(range(rg.COMPARE_SEEDS))
    lines: list[str] = []
    for s in data["chosen"]:
        recs = [r for r in data["records"][(s.workflow, s.name)] if r["seed"] in seeds]
        lines += [
            f"**{s.workflow} (K = {s.k}), {s.epochs} epochs, lr {s.lr:g}**, seeds "
            f"{study.seed_ranges(sorted({r['seed'] for r in recs}))}:",
            "",
            "| objective | seeds | clipped at K | spread at K | grad-norm CV | area (95% CI) | final (95% CI) |",
            "|---|---|---|---|---|---|---|",
        ]
        for obj in s.cells():
            rs = [r for r in recs if r["objective"] == obj]
            if not rs:
                continue
            lines.append(
                f"| {rg.LABEL[obj]} | {len(rs)} | "
                f"{_pct(statistics.mean(rg.clip_share(r['diagnostics']).get(s.k, 0) for r in rs))} | "
                f"{statistics.mean(rg.raw_spread(r['diagnostics'], obj).get(s.k, 0) for r in rs):.3f} | "
                f"{statistics.mean(r['grad_norm_cv'] or 0 for r in rs):.2f} | "
                f"{_ci([study.mean_accuracy(r) for r in rs])} | {_ci([study.final_accuracy(r) for r in rs])} |"
            )
        same = _same_runs(recs, "independent", "grpo")
        if same:
            lines += [
                "",
                f"(`independent` gave `grpo`'s numbers on all {same} seeds both ran: with one-token members and "
                "the one reward at the episode's end, a member's ratio is its token's and its set's advantage is "
                "the episode's, so the two are one run here, as `dr_mas` is `grpo`'s by `study.same_as`.)",
            ]
        lines.append("")
    rows = data["compare"]
    if rows:
        lines += [
            f"Contrasts (a - b, paired by seed; bootstrap 95% interval, exact sign-flip p; *needed*: seeds that would "
            f"resolve the observed area gap at its spread; replication on seeds {rg.REPLICATION_OFFSET}.."
            f"{rg.REPLICATION_OFFSET + rg.COMPARE_SEEDS - 1}, run only for contrasts with area p < 0.05):",
            "",
            "| setting | a - b | area | final | needed | replication: area | replicated |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in rows:
            again = c.get("again")
            rep = rg.replicated(c, again)
            lines.append(
                f"| {c['workflow']} {c['setting']} | {c['a']} - {c['b']} | {_diff(c['area'])} | {_diff(c['final'])} | "
                f"{c['area_needed'] if c['area_needed'] < 999 else '>999'} | "
                f"{_diff(again['area']) if again else '-'} | "
                f"{'-' if rep is None else 'yes' if rep else 'no'} |"
            )
        lines.append("")
    return lines, rows


def _reading(data: dict) -> list[str]:
    """What the scan says about the mechanism, each number computed from the records."""
    scan = _scan_lookup(data)
    full = [r for r in data["scan"] if not r["setting"].staleness and all(o in r["objectives"] for o in rg.ALPHA)]
    ordered = [
        r
        for r in full
        if r["setting"].epochs > 1
        and r["objectives"]["srpo_sum"]["clip"]
        >= r["objectives"]["srpo"]["clip"]
        >= r["objectives"]["srpo_mean"]["clip"]
    ]
    multi = [r for r in full if r["setting"].epochs > 1]
    lines = ["### Reading the scan", ""]
    if multi:
        lines.append(
            f"- **alpha sets how much of the update the clip removes, in the designed order**: sum clips at least "
            f"as much as √K, and √K as much as mean, in {len(ordered)} of the {len(multi)} scanned settings with "
            "more than one epoch. What drives sets into the clip is the number of epochs and the learning rate "
            "(the first epoch is on-policy: at one epoch nothing is clipped, whatever alpha)."
        )
    found = [scan.get((wf, 8, 1e-3, 0)) for wf in rg.SCAN_WORKFLOWS if wf.startswith("coord_par")]
    e8 = {r["k"]: r for r in found if r and all(o in r["objectives"] for o in rg.ALPHA)}
    if len(e8) > 1:
        ks = sorted(e8)

        def swing(o: str) -> float:
            return max(e8[k]["objectives"][o]["clip"] for k in ks) - min(e8[k]["objectives"][o]["clip"] for k in ks)

        level = swing("srpo") < swing("srpo_sum")
        lines.append(
            "- **Across K at 8 epochs (lr 1e-3), √K "
            + ("keeps the clip rate more level than sum does" if level else "does not keep the clip rate more level")
            + f"**: from K = {ks[0]} to "
            f"K = {ks[-1]} the clipped share goes "
            + "; ".join(
                f"{rg.LABEL[o].split(' (')[0]} {', '.join(_pct(e8[k]['objectives'][o]['clip']) for k in ks)}"
                for o in rg.ALPHA
            )
            + f" (K = {', '.join(map(str, ks))})."
        )
    one = [r for r in full if r["setting"].epochs == 1 and r["setting"].workflow.startswith("coord_par")]
    if one:
        share = {o: statistics.mean(r["objectives"][o]["grad_clipped"] for r in one) for o in rg.ALPHA}
        recs = [x for r in one for x in data["records"][(r["setting"].workflow, r["setting"].name)]]
        same = report_same(recs, "srpo_mean", "grpo")
        lines.append(
            "- **A second channel: the global grad-norm clip** (`optim.grad_clip` = "
            f"{rg.GRAD_CLIP:g}, the trainer's default). On a one-size workflow the set gradient is K^(1-alpha) "
            "times the mean member's, so the steps whose norm the clip rescales (before Adam) depend on alpha: at "
            f"1 epoch, where the set clip never binds, {_pct(share['srpo_sum'])} of the steps under sum, "
            f"{_pct(share['srpo'])} under √K and {_pct(share['srpo_mean'])} under mean are over it (mean over "
            "the coord_par workflows). A clipped step reaches Adam at another scale than its neighbours, so "
            "Adam's cancellation of the K^-alpha factor holds only while no step is over the clip"
            + (
                f"; mean's 1-epoch runs gave GRPO's evaluations in all {same} (workflow, seed) pairs: at ratio 1 "
                "the mean of one-token member log-ratios has GRPO's gradient, so the grad-norm clip treats both alike"
                if same
                else ""
            )
            + "."
        )
    slopes = {o: rg.spread_slope(_spread_points(scan, o, 8, 1e-3)) for o in ("srpo_sum", "srpo", "srpo_mean", "grpo")}
    slopes2 = {o: rg.spread_slope(_spread_points(scan, o, 2, 1e-3)) for o in ("srpo_sum", "srpo", "srpo_mean", "grpo")}
    if all(math.isfinite(v) for v in slopes.values()):
        lines.append(
            "- **The summed log-ratio "
            + ("spreads like √K" if abs(slopes["srpo_sum"] - 0.5) < 0.2 else "does not spread like √K")
            + " under sum (as K independent members would) here.** Its log-log slope "
            f"against K at 8 epochs is {slopes['srpo_sum']:.2f} under sum, {slopes['srpo']:.2f} under √K and "
            f"{slopes['srpo_mean']:.2f} under mean ({slopes['grpo']:.2f} for one member under GRPO); at 2 epochs "
            f"{slopes2['srpo_sum']:.2f} / {slopes2['srpo']:.2f} / {slopes2['srpo_mean']:.2f} / {slopes2['grpo']:.2f}. "
            "A reading, not tested here: with one policy shared by all K members and Adam fixing the step's "
            "size, the members' log-ratios move together, not independently; and once the clip binds it holds "
            "the *normalised* log-ratio near the clip range, so the summed one grows roughly like K^alpha: "
            "flat under sum, about √K under √K, towards K under mean. The normalisation then decides how far a "
            "batch's later epochs may move a large set, not how the members' noise adds up."
        )
    found = [scan.get((wf, 2, 1e-3, k)) for wf in ("coord_par3", "coord_par5") for k in (1, 2)]
    st = [r for r in found if r and all(o in r["objectives"] for o in rg.ALPHA)]
    if st:
        top = max(max(o["clip"] for o in r["objectives"].values()) for r in st)
        sd = {o: statistics.mean(r["objectives"][o]["is_std"] for r in st) for o in rg.ALPHA}
        lines.append(
            f"- **Staleness 1-2 does not bring sets into the clip** (at most {_pct(top)} clipped at 2 epochs): with "
            "the decoupled correction the clip is taken against the proximal policy (the weights at the update), "
            "and the staleness enters as a separate behaviour weight. That weight is a set ratio too, and alpha "
            f"shapes it the same way: its spread at K averages {sd['srpo_sum']:.3f} under sum, {sd['srpo']:.3f} under "
            f"√K and {sd['srpo_mean']:.3f} under mean over these runs. Learning is not resolved there: K = 3 and "
            f"5 at 2 epochs barely learn at this budget (the areas of these runs are at most "
            f"{max(o['area'] for r in st for o in r['objectives'].values()):.3f}, chance {rg.CHANCE})."
        )
    return lines + [""]


def _guidance(data: dict, rows: list[dict]) -> list[str]:
    """Which objective when, from the records: where the clip is substantial, what replicated, the paper's ordering."""
    scan = data["scan"]
    reach = sorted(
        (r for r in scan if not r["setting"].staleness and "srpo" in r["objectives"]),
        key=lambda r: (r["setting"].workflow, r["setting"].epochs, r["setting"].lr),
    )
    over = [r for r in reach if r["objectives"]["srpo"]["clip"] >= rg.CLIP_BAR]
    under2 = [r for r in reach if r["setting"].epochs <= 2 and r["setting"].lr == 1e-3]
    max2 = max((r["objectives"]["srpo"]["clip"] for r in under2), default=float("nan"))
    held = [c for c in rows if rg.replicated(c, c.get("again"))]
    failed = [c for c in rows if rg.replicated(c, c.get("again")) is False]
    lines = ["### Which objective when", ""]
    lines.append(
        f"- **At 1-2 epochs per batch and lr 1e-3 the set clip barely binds**: √K's runs clip at most "
        f"{_pct(max2)} of the largest sets in any workflow. There alpha acts on a one-size workflow only through "
        "the global grad-norm clip (above); the k5 study's 20 seeds (search, 2 epochs, lr 1e-4) found no "
        "difference between sum, √K and mean there, and this scan's two seeds per cell are a map, not a "
        "comparison. At the usual "
        "budget (1-2 epochs, on-policy) any of them will do; √K is the paper's default and costs nothing."
    )
    if over:
        names = ", ".join(
            f"{r['setting'].workflow} {r['setting'].epochs} ep lr {r['setting'].lr:g} "
            f"({_pct(r['objectives']['srpo']['clip'])})"
            for r in over
        )
        lines.append(
            f"- **Where the clip is substantial** (√K clips >= {_pct(rg.CLIP_BAR)} of the largest sets): {names}."
        )
    else:
        lines.append(f"- **No scanned setting reached the {_pct(rg.CLIP_BAR)} bar under √K.**")
    chosen = {(x.workflow, x.name): x for x in data["chosen"]}

    def clip_area(c: dict, o: str, seeds: list[int]) -> str:
        x = chosen[(c["workflow"], c["setting"])]
        rs = [r for r in data["records"][(x.workflow, x.name)] if r["objective"] == o and r["seed"] in seeds]
        clip = statistics.mean(rg.clip_share(r["diagnostics"]).get(x.k, 0.0) for r in rs)
        grad = statistics.mean(rg.grad_clipped_share(r["grad_norm"]) for r in rs)
        area = _ci([study.mean_accuracy(r) for r in rs])
        return (
            f"{rg.LABEL[o].split(' (')[0]} clips {_pct(clip)} of its size-{x.k} sets and has {_pct(grad)} of its "
            f"steps over the grad-norm clip, area {area}"
        )

    def abl_area(abl: dict, o: str) -> list[float]:
        return [study.mean_accuracy(r) for r in abl["records"] if r["objective"] == o and r["seed"] in abl["seeds"]]

    def without(c: dict) -> str:
        abl = next(
            (
                a
                for a in data.get("ablation", [])
                if (a["workflow"], a["of"], a["a"], a["b"]) == (c["workflow"], c["setting"], c["a"], c["b"])
            ),
            None,
        )
        if abl is None:
            return " Its run without the grad-norm clip is not saved yet."
        kept = abl["area"][3] < 0.05 and (abl["area"][0] > 0) == (c["area"][0] > 0)
        return (
            f" Without the grad-norm clip (`optim.grad_clip=0`, the same seeds) the gap is {_diff(abl['area'])}: "
            + (
                "it holds, so the set clip (or the set ratio itself), not the grad-norm clip, carries it."
                if kept
                else "it does not hold as significant, so the grad-norm clip, which alpha also decides, is part "
                "of the effect (the areas without it: "
                + ", ".join(f"{rg.LABEL[o].split(' (')[0]} {_ci(abl_area(abl, o))}" for o in (c["a"], c["b"]))
                + ")."
            )
        )

    first_seeds = list(range(rg.COMPARE_SEEDS))
    for c in held:
        better, worse = (c["a"], c["b"]) if c["area"][0] > 0 else (c["b"], c["a"])
        lines.append(
            f"- **Replicated: {rg.LABEL[better]} learns faster than {rg.LABEL[worse]} on {c['workflow']} "
            f"{c['setting']}**: area {_diff(c['area'])} on seeds 0..{rg.COMPARE_SEEDS - 1}, "
            f"{_diff(c['again']['area'])} on the fresh seeds. There {clip_area(c, worse, first_seeds)}; "
            f"{clip_area(c, better, first_seeds)} (seeds 0..{rg.COMPARE_SEEDS - 1})."
            + without(c)
            + f" So with many epochs per batch and large sets, under the trainer's default grad-norm clip, "
            f"{rg.LABEL[worse].split(' (')[0]} is the objective to avoid."
        )

    def here(x: rg.Setting) -> list[dict]:
        return [c for c in rows if (c["workflow"], c["setting"]) == (x.workflow, x.name)]

    quiet = [x for x in data["chosen"] if not any(c["area"][3] < 0.05 for c in here(x))]
    for x in quiet:
        cs = here(x)
        if cs:
            lines.append(
                f"- **{x.workflow} {x.name}: nothing separates** although √K clips "
                f"{_pct(next(r for r in scan if r['setting'] == x)['objectives']['srpo']['clip'])} of its size-{x.k} "
                f"sets in the scan: every contrast has area p >= 0.05 on seeds 0..{rg.COMPARE_SEEDS - 1}, and the "
                f"observed gaps would take {min(c['area_needed'] for c in cs)} or more seeds to resolve at their "
                "spread: the objectives differ here by less than this task's seed-to-seed spread."
            )
    if not held and rows:
        lines.append(
            "- **No contrast replicated** in the compared settings"
            + (f" ({len(failed)} significant on the first seeds did not hold on fresh ones)" if failed else "")
            + ": even where the clip is substantial, these objectives are not separated at this model's scale "
            "and seed budget (see *needed* for the seeds a separation of the observed size would take)."
        )
    paper = []
    for s in data["chosen"]:
        per = next(r for r in scan if r["setting"] == s)["objectives"]
        recs = [r for r in data["records"][(s.workflow, s.name)] if r["seed"] < rg.COMPARE_SEEDS]
        m = {
            o: statistics.mean(study.mean_accuracy(r) for r in recs if r["objective"] == o)
            for o in rg.ALPHA
            if o in per
        }
        if len(m) == 3:
            order = " > ".join(rg.LABEL[o].split(" (")[0] for o in sorted(m, key=lambda o: -m[o]))
            paper.append((s, order, m["srpo"] > m["srpo_sum"] > m["srpo_mean"]))

    def holds(s: rg.Setting, a: str, b: str) -> bool:
        c = next((c for c in rows if (c["workflow"], c["setting"], c["a"], c["b"]) == (s.workflow, s.name, a, b)), None)
        return bool(c and rg.replicated(c, c.get("again")) and c["area"][0] > 0)

    if paper:
        shown = [s for s, _, _ in paper if holds(s, "srpo", "srpo_sum") and holds(s, "srpo_sum", "srpo_mean")]
        lines.append(
            "- **The paper's ordering (√K > sum > mean)**, in the compared settings' mean areas over seeds "
            f"0..{rg.COMPARE_SEEDS - 1}: "
            + "; ".join(f"{s.workflow} {s.name}: {o}" + (" (its order)" if ok else "") for s, o, ok in paper)
            + ". "
            + "".join(
                f"The one replicated step between these three runs against it: {rg.LABEL[c['b']].split(' (')[0]} "
                f"beat {rg.LABEL[c['a']].split(' (')[0]} on {c['workflow']} {c['setting']}. "
                for c in held
                if (c["a"], c["b"]) in (("srpo", "srpo_sum"), ("srpo_sum", "srpo_mean"), ("srpo", "srpo_mean"))
                and c["area"][0] < 0
            )
            + (
                f"Both of its steps replicated as contrasts in {', '.join(f'{s.workflow} {s.name}' for s in shown)}."
                if shown
                else "As a replicated result (both steps, √K > sum and sum > mean, significant on the first seeds "
                "and again on fresh ones) it appears in no setting. For it to appear, alpha would have to change "
                "which sets are clipped (true here in the settings listed above, where the clip binds on >= 10% "
                "of sets), sum would have to over-clip the informative sets of large K while √K keeps the clip "
                "rate level across K (see the reading of the scan), mean's loose clip would have to cost it "
                "learning"
                + "".join(
                    f" (here, without the grad-norm clip, sum - mean was {_diff(a['area'])} on {a['workflow']})"
                    for a in data.get("ablation", [])
                    if (a["a"], a["b"]) == ("srpo_sum", "srpo_mean")
                )
                + ", and these "
                "differences in the update would have to change learning by more than the seed-to-seed spread "
                "of this task (large here: see *needed*): a model and task that learn steadily at large K, with "
                "multi-token members whose log-ratios move far from 1, and sets of several sizes in one batch, "
                "where alpha also reweights the sizes."
            )
        )
    lines.append(
        "- **Caveat of scale**: a 134k-parameter random-init model on one-token members, 60 steps; with one "
        "set size per workflow, alpha acts only through the set clip, the grad-norm clip and the behaviour "
        "weight. Large models with long members move their log-ratios differently; these results say where "
        "to look, not what an 8B model will do."
    )
    return lines


def write(data: dict, runs_dir: Path, out: Path, command: str) -> None:
    """The ``regime`` section of ``out`` and its plots (``docs/img/study_regime_*.png``)."""
    images = plot(data, out.parent / "img")
    every = [r for v in data["records"].values() for r in v]
    every += [r for a in {a["setting"]: a for a in data.get("ablation", [])}.values() for r in a["records"]]
    n_runs = len(every)
    lines = [
        f"<!-- study:{SECTION} -->",
        f"## The regime study: where the set ratio's normalisation matters (`{command}`)",
        "",
    ]
    if data["todo"]:
        todo = data["todo"]
        by_stage: dict[str, int] = {}
        for wf, name, obj, seed in todo:
            stage = (
                "scan"
                if seed < rg.SCAN_SEEDS
                and (wf, name) in {(s.workflow, s.name) for s in rg.SCAN}
                and not any(s.workflow == wf and s.name == name for s in data["chosen"])
                else "compare/replication"
            )
            by_stage[stage] = by_stage.get(stage, 0) + 1
        lines += [
            f"**PARTIAL: {n_runs} runs saved, {len(todo)} still to run** ("
            + ", ".join(f"{v} {k}" for k, v in by_stage.items())
            + "; the first missing: "
            + ", ".join(f"{wf} {name} {obj} seed {seed}" for wf, name, obj, seed in todo[:6])
            + "). Rerun the command to resume; the tables hold only what is saved.",
            "",
        ]
    lines += [
        "Issue 38. The k5 study found nothing between sum, √K and mean because, with one set size per "
        "workflow, Adam cancels alpha's uniform scale of the gradient and the clip touched <= 3% of sets. "
        "This plan looks for the regime where the clip binds and compares the objectives there. Every run: "
        f"the tiny model (random init, 134k parameters) on a coordination task, 8 tasks x 8 samples a step, "
        f"{rg.BASE.coord_steps} steps, held-out accuracy on 64 tasks x {rg.BASE.eval_samples} samples at steps "
        "20, 40 and 60 (*area*: their mean; *final*: the mean of the last two). `coord_par<K>`: K one-token "
        "agents consumed as one set (K = 2, 3, 5, 8), where `independent` = `grpo` = `dr_mas` bit for bit; "
        "`coord_mixed`: a pair (K = 2) then a closer (K = 1) in every episode, where `independent` is its own "
        "run and `dr_mas` is `grpo`'s. *Clipped*: the share of the largest sets' items the clip touched (upper + "
        "lower), over all epochs of every step (epoch 1 is on-policy, so at 1 epoch it is 0 by construction); "
        "*spread*: the root mean square of the set's summed member log-ratio (the logged normalised one times "
        "K^alpha). Staleness k >= 1 runs overlapped rollouts in a rollout worker with the correction the "
        "config defaults set (`loss.mismatch = decoupled`). "
        f"{n_runs} runs saved, {sum(r['seconds'] for r in every) / 60:.0f} min of run time in all (one torch "
        "thread each, two at a time, much of it beside a CI run on the same two cores).",
        "",
        f"### Stage 1: the scan (seeds 0..{rg.SCAN_SEEDS - 1})",
        "",
        f"![{images[0].stem}](img/{images[0].name})",
        "",
        *_scan_table(data),
        "",
        "The spread of the summed log-ratio against K (log-log slope over K = 2, 3, 5, 8; 0.5 is what a sum "
        "of K independent member log-ratios of equal spread gives, the motivation for √K):",
        "",
        *_slopes(data),
        "",
        f"![{images[1].stem}](img/{images[1].name})",
        "",
        "Staleness (2 epochs, lr 1e-3): the importance weight's spread at K and what it does:",
        "",
        *_staleness(data),
        "",
        f"### Stage 2: the objectives where the clip binds (seeds 0..{rg.COMPARE_SEEDS - 1})",
        "",
        f"The settings compared: per workflow, the scanned setting (staleness 0) whose √K runs clip the largest "
        f"share of the largest sets, among those at >= {_pct(rg.CLIP_BAR)} where some objective's area is at "
        f"least {rg.LEARN_BAR} above chance; then the {rg.MAX_SETTINGS} that clip most: "
        + (", ".join(f"{s.workflow} {s.name}" for s in data["chosen"]) or "none yet (the scan is not complete)")
        + ".",
        "",
    ]
    compare_lines, rows = _compare(data)
    lines += compare_lines
    if data.get("ablation"):
        lines += [
            "Each replicated contrast again on seeds 0.."
            f"{rg.COMPARE_SEEDS - 1} with the global grad-norm clip off (`optim.grad_clip=0`; a channel alpha also "
            "acts through, see the reading below):",
            "",
            "| setting | a - b | area | final |",
            "|---|---|---|---|",
            *(
                f"| {a['workflow']} {a['setting']} | {a['a']} - {a['b']} | {_diff(a['area'])} | {_diff(a['final'])} |"
                for a in data["ablation"]
            ),
            "",
        ]
    lines += _reading(data)
    lines += _guidance(data, rows)
    lines += [
        "",
        f"Records: `{runs_dir.relative_to(study.ROOT) if runs_dir.is_relative_to(study.ROOT) else runs_dir}`.",
        "",
        f"<!-- end study:{SECTION} -->",
        "",
    ]
    study.put_section(out, SECTION, "\n".join(lines))
    print(f"wrote the {SECTION} section of {out}")
