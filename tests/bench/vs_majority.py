#!/usr/bin/env python3
"""vs_majority.py - a classify cell's final accuracy against always answering the most frequent
test label, on the same test examples: a paired percentile bootstrap of the difference.

    python3 tests/bench/vs_majority.py results/tuxpaint_animals lr=1e-3

The trials of RESULTS_DIR (trial-*.h5) whose /config attributes equal every KEY=VALUE given form
the cell (numbers compared as numbers); each test example is scored by the fraction of the cell's
trials right on it, as `gemmarun table` scores a cell. On unbalanced classes the majority rate,
not chance, is what a classifier must beat; the table's † compares with the model before
fine-tuning instead. 10,000 resamples of the test examples, seeded (the same numbers every run).
Needs h5py and numpy (Debian python3-h5py: setup.sh installs it).
"""
import glob
import sys

import h5py
import numpy as np


def matches(attrs, want):
    for key, value in want.items():
        if key not in attrs:
            return False
        have = attrs[key]
        have = have.decode() if isinstance(have, bytes) else have
        try:
            if abs(float(have) - float(value)) > 1e-9 * max(1.0, abs(float(value))):
                return False
        except (TypeError, ValueError):
            if str(have) != value:
                return False
    return True


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    folder, want = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
    right, ref = [], None
    for path in sorted(glob.glob(f"{folder}/trial-*.h5")):
        if path.endswith(".ckpt.h5"):
            continue
        with h5py.File(path, "r") as f:
            if not matches(f["config"].attrs, want) or "eval/final" not in f:
                continue
            e = f["eval/final"]
            order = np.argsort(e["example_index"][:])
            r = e["references"][:][order]
            if ref is not None and not np.array_equal(r, ref):
                sys.exit(f"{path}: other test examples than the cell's first trial")
            ref = r
            labels = [s.decode() if isinstance(s, bytes) else str(s) for s in e["labels"][:]]
            right.append((e["predictions"][:][order] == r).astype(float))
    if not right:
        sys.exit(f"no finished trial in {folder} with {want}")
    model = np.mean(right, axis=0)
    top = int(np.bincount(ref).argmax())
    major = (ref == top).astype(float)
    idx = np.random.default_rng(0).integers(0, len(ref), size=(10000, len(ref)))
    d = model[idx].mean(1) - major[idx].mean(1)
    p = min(1.0, 2 * min((d <= 0).mean(), (d >= 0).mean()))
    print(f"{len(right)} trial{'s' if len(right) != 1 else ''}, {len(ref)} test examples: accuracy {100 * model.mean():.1f}%; always '{labels[top]}' "
          f"{100 * major.mean():.1f}%; difference {100 * (model.mean() - major.mean()):+.1f} points, 95% interval "
          f"[{100 * np.percentile(d, 2.5):+.1f}, {100 * np.percentile(d, 97.5):+.1f}] (paired bootstrap), "
          f"two-sided p = {p:.2f}")


if __name__ == "__main__":
    main()
