"""Second walkthrough (session 25): eval/mia.py, eval/downstream.py, eval/hpc_code.py, the sweep, the planner
and the job generator, run as a user would.

* ``python -m axonn.planner --micro-batch 3 --global-batch 128 --gpus 8`` refused the batch with "use a global
  batch that is a multiple of one of them" after listing the grids' data×depth products 1, 2, 4, 8 -- of which
  128 already is a multiple. With a micro-batch the batch must divide by data×depth×micro-batch, and those are
  the products the message now lists (3, 6, 12, 24).
* ``--machine my_profile.yaml`` with a YAML syntax error, or a figure written as a string (``memory_gib: "80"``),
  crashed with a traceback (yaml's ScannerError; ``TypeError: '>' not supported between 'str' and 'int'``)
  instead of the planner's "error: ..." and exit status 2 that every other bad profile gets.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from axonn.planner import PlanError, plan
from axonn.planner.profiles import PROFILE_DIR, load_profile

REPO = Path(__file__).resolve().parents[1]


def _products(msg: str) -> list[int]:
    m = re.search(r"products: ([\d, ]+)\)", msg)
    assert m, msg
    return [int(x) for x in m.group(1).split(",")]


@pytest.mark.parametrize("micro_batch", [3, 5])
def test_batch_error_with_micro_batch_lists_the_products_the_batch_must_divide_by(micro_batch):
    with pytest.raises(PlanError) as ei:
        plan("8b", 2048, 128, 8, machine="frontier", micro_batch=micro_batch)
    msg = str(ei.value)
    assert ei.value.kind == "batch", msg
    prods = _products(msg)
    # the advice "use a global batch that is a multiple of one of them" must not be met by the refused batch
    assert not any(128 % p == 0 for p in prods), msg
    assert all(p % micro_batch == 0 for p in prods), msg
    assert "data×depth×micro-batch" in msg
    suggested = int(re.search(r"e\.g\. (\d+)", msg).group(1))
    assert any(suggested % p == 0 for p in prods)
    assert plan("8b", 2048, suggested, 8, machine="frontier", micro_batch=micro_batch).ranked


def test_batch_error_without_micro_batch_is_unchanged():
    with pytest.raises(PlanError) as ei:
        plan("8b", 2048, 256, 6, machine="frontier")
    msg = str(ei.value)
    assert ei.value.kind == "batch" and "(their data×depth products: 3, 6)" in msg, msg


@pytest.mark.parametrize("edit, match", [
    (lambda t: t + "oops: [1, 2\n", r"not valid YAML"),
    (lambda t: t.replace("memory_gib: 80", 'memory_gib: "80"'), r"memory_gib must be a number, got '80'"),
    (lambda t: t.replace("gpus_per_node: 4", "gpus_per_node: 4.5"), r"gpus_per_node must be an integer"),
])
def test_bad_profile_yaml_is_a_plan_error_not_a_traceback(tmp_path, edit, match):
    text = (PROFILE_DIR / "perlmutter.yaml").read_text()
    path = tmp_path / "my_profile.yaml"
    path.write_text(edit(text))
    with pytest.raises(PlanError, match=match) as ei:
        plan("8b", 2048, 128, 8, machine=path)
    assert ei.value.kind == "machine"
    proc = subprocess.run([sys.executable, "-m", "axonn.planner", "--size", "8b", "--gpus", "8",
                           "--machine", str(path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(match, proc.stderr), proc.stderr


def test_bundled_and_numeric_profiles_still_load():
    import numpy as np

    for name in ("frontier", "alps", "perlmutter", "perlmutter-40", "h100-node"):
        load_profile(name)
    from dataclasses import replace
    p = load_profile("alps")
    assert replace(p, gpus_per_node=np.int64(4), memory_gib=np.float64(96.0)).gpus_per_node == 4
