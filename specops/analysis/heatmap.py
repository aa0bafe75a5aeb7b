"""The acceptance heatmap as a PNG: token class × draft position, one panel per draft."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write(drafts: dict[str, dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = sorted({c for d in drafts.values() for c in d["class_by_position"]})
    fig, axes = plt.subplots(1, len(drafts), figsize=(3.4 * len(drafts) + 2.2, 0.45 * len(classes) + 1.8), squeeze=False,
                             sharey=True)
    for ax, (name, d) in zip(axes[0], drafts.items()):
        width = len(d["accepted_per_pos"])  # γ, or more where schema-forced tokens lengthened rounds
        grid = np.array([[np.nan if v is None else v for v in d["class_by_position"].get(c, [None] * width)]
                         for c in classes], dtype=float)
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(width), [str(p + 1) for p in range(width)])
        ax.set_yticks(range(len(classes)), classes)
        ax.tick_params(axis="y", labelleft=ax is axes[0][0])
        ax.set_xlabel("draft position")
        ax.set_title(f"{name}\nacceptance {d['acceptance_rate']:.2f}", fontsize=10)
        for i in range(len(classes)):
            for j in range(width):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), label="kept when reached")
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
