"""Draw docs/img/provenance.png: which rewards an event is credited with (docs/algorithm.md).

    python scripts/draw_provenance.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "provenance.png"

# (name, x, y, kind, label)
NODES = [
    ("a", 0.0, 1.5, "agent", "a"), ("b", 0.0, 0.0, "agent", "b"),
    ("ta", 1.2, 1.5, "tr", "ta\nr=1"), ("tb", 1.2, 0.0, "tr", "tb\nr=0"),
    ("c", 2.4, 0.0, "agent", "c"), ("tc", 3.6, 0.0, "tr", "tc\nr=1"),
    ("end", 4.8, 0.75, "end", "end\nterminal T"),
]
ARCS = [("a", "ta", "consumed"), ("b", "tb", "consumed"), ("tb", "c", "activated"), ("c", "tc", "consumed"),
        ("ta", "end", ""), ("tc", "end", "")]
RETURNS = {"ta": "R(ta) = 1 + T", "tb": "R(tb) = 0 + γ·1 + γ·T", "tc": "R(tc) = 1 + T"}


def main() -> None:
    fig, ax = plt.subplots(figsize=(8.4, 3.8), dpi=130)
    pos = {n: (x, y) for n, x, y, _, _ in NODES}
    for n, x, y, kind, label in NODES:
        if kind == "agent":
            ax.add_patch(FancyBboxPatch((x - 0.3, y - 0.18), 0.6, 0.36, boxstyle="round,pad=0.02",
                                        fc="#dbe9f6", ec="#2b6cb0"))
        elif kind == "tr":
            ax.add_patch(FancyBboxPatch((x - 0.08, y - 0.28), 0.16, 0.56, boxstyle="square,pad=0",
                                        fc="#333333", ec="#333333"))
        else:
            ax.add_patch(FancyBboxPatch((x - 0.4, y - 0.2), 0.8, 0.4, boxstyle="round,pad=0.02",
                                        fc="#eeeeee", ec="#777777"))
        dy = 0.42 if kind == "tr" else 0
        ax.text(x, y + dy, label, ha="center", va="center", fontsize=9, color="black")
        if n in RETURNS:
            ax.text(x, y - 0.48, RETURNS[n], ha="center", va="center", fontsize=8.5, color="#9b2c2c")
    for s, t, label in ARCS:
        (x0, y0), (x1, y1) = pos[s], pos[t]
        ax.add_patch(FancyArrowPatch((x0 + 0.3, y0), (x1 - 0.3, y1), arrowstyle="-|>", mutation_scale=12,
                                     color="#2f855a" if label == "activated" else "#555555"))
        if label:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.1, label, ha="center", fontsize=7.5, color="#555555")
    ax.text(-0.35, 2.25, "start: a, b  (parallel, independent branches)", fontsize=9)
    ax.text(-0.35, -0.85, "provenance arc tb → tc: tb activated c, and tc consumed c's output.\n"
            "ta has no descendant, so tc's reward never reaches it (firing order would give it).", fontsize=8,
            color="#2f855a", va="top")
    ax.set_xlim(-0.6, 5.4)
    ax.set_ylim(-1.3, 2.4)
    ax.axis("off")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
