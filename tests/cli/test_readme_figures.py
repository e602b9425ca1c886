"""The README's main table is what `bash scripts/run.sh` prints: the default run, from the shipped corpus and
tokenizer under the pinned CPU numerics of scripts/run.sh, reproduces every figure of the table and the
McNemar p-value (slow: the whole default experiment, 3-6 minutes on 2 cores)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support import REPO


def readme_rows(results: dict) -> list[str]:
    """The README's table rows and McNemar sentence, formatted from a run's ``results.json``."""
    arms, rows = results["arms"], []
    for name, arm in arms.items():
        lo, hi = arm["exact_match_ci95"]
        cells = [f"{arm['exact_match']:.3f} ({lo:.2f}–{hi:.2f})", f"{arm['token_match']:.3f}",
                 f"{arm['rouge_l']:.3f}"]
        if name == "standard":
            rows.append(f"| standard | {' | '.join(cells)} | {arm['val_loss']:.3f} | 0 |")
        else:
            g, rel = arm["goldfish"], arm["val_loss"] / arms["standard"]["val_loss"] - 1
            rows.append(f"| goldfish (k={g['k']}, h={g['h']}, {g['strategy']}) | {' | '.join(cells)} | "
                        f"{arm['val_loss']:.3f} ({rel:+.1%}) | {arm['goldfish_drop_frac']:.1%} |")
    rows.append(f"exact McNemar p = {results['paired_exact_match']['p_value']:.1e}")
    return rows


@pytest.mark.slow
def test_the_default_run_reproduces_the_readme_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")}
    subprocess.run(["bash", str(REPO / "scripts" / "run.sh"), "--out", str(tmp_path / "run"), "--overwrite",
                    "--no-progress"], check=True, env={**env, "WANDB_MODE": "disabled"}, cwd=REPO, timeout=1500,
                   stdout=subprocess.DEVNULL)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    from memorization.data.corpus import PYDOCS_SHA256, TOKENIZER_SHA256

    assert (manifest["corpus_sha256"], manifest["tokenizer_sha256"]) == (PYDOCS_SHA256, TOKENIZER_SHA256)
    readme = (REPO / "README.md").read_text()
    missing = [row for row in readme_rows(results) if row not in readme]
    assert not missing, f"the README lacks what this run printed: {missing}"
