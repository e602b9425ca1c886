"""Peak host memory a ``ckpt.save`` adds, as a fraction of the state it writes (one process).

Prints ``growth <fraction>``: the rise of the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs``) during a save of 8 Linear(2048, 2048) layers with AdamW state (400 MB),
over the bytes of that state.  A save that copies everything before writing is about 1.0.
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import axonn  # noqa: E402
import axonn.checkpoint as ckpt  # noqa: E402


def vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


grid = axonn.init()
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, 2048)).sum().backward()
opt.step()
state = sum(p.numel() * p.element_size() * 3 for p in model.parameters())  # weights, exp_avg, exp_avg_sq
with tempfile.TemporaryDirectory() as d:
    small = torch.nn.Linear(8, 8)  # warm-up (imports, first writes) on a model that leaves no heap behind
    ckpt.save(small, torch.optim.AdamW(small.parameters()), Path(d) / "w", grid=grid)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    base = vm("VmRSS")
    ckpt.save(model, opt, Path(d) / "c", grid=grid)
    print(f"growth {(vm('VmHWM') - base) / state:.4f}", flush=True)
