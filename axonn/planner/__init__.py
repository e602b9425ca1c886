"""Performance model and planner for 4D (data × row × column × depth) AxoNN training.

    >>> from axonn.planner import plan, format_plan
    >>> res = plan("405b", seq=2048, global_batch=1024, gpus=4096, machine="frontier")
    >>> print(format_plan(res, top=5))

:func:`plan` enumerates every grid ``[D, R, C, Z]`` with ``D·R·C·Z = gpus``, rejects those that
do not divide the model or the batch or do not fit in memory, predicts the step time of the rest
(:mod:`axonn.planner.model`, :mod:`axonn.planner.memory`) and ranks them. Machine profiles live
in ``axonn/planner/profiles/*.yaml`` (:func:`load_profile`); ``python -m axonn.planner calibrate``
measures one. See ``docs/planner.md``.
"""
from .memory import MemoryBreakdown, MemoryConfig, memory_per_gpu
from .model import CostConfig, Grid, StepBreakdown, divisibility_problem, enumerate_grids, predict_step
from .profiles import MachineProfile, known_profiles, load_profile, save_profile
from .search import (GRAD_REDUCE_BYTES, PlanEntry, PlanError, PlanResult, Rejection, format_plan, plan,
                     resolve_shape, smallest_fitting_gpus)

__all__ = [
    "GRAD_REDUCE_BYTES", "CostConfig", "Grid", "MachineProfile", "MemoryBreakdown", "MemoryConfig", "PlanEntry", "PlanError",
    "PlanResult", "Rejection", "StepBreakdown", "divisibility_problem", "enumerate_grids", "format_plan",
    "known_profiles", "load_profile", "memory_per_gpu", "plan", "predict_step", "resolve_shape",
    "save_profile", "smallest_fitting_gpus",
]
