"""Each rank writes its PID to $ORPHAN_DIR/rank<r>.pid once its grid exists, then waits to be killed: the test
kills its torchrun launcher with SIGKILL and checks that these workers end with it."""
from __future__ import annotations

import os
import time
from pathlib import Path

import axonn

grid = axonn.init(G_data=2)
Path(os.environ["ORPHAN_DIR"], f"rank{grid.rank}.pid").write_text(str(os.getpid()))
time.sleep(120)
