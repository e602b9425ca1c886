"""Performance model and planner for 4D (data × row × column × depth) AxoNN training.

    >>> from axonn.planner import plan, format_plan
    >>> res = plan("405b", seq=2048, global_batch=1024, gpus=4096, machine="frontier")
    >>> print(format_plan(res, top=5))

:func:`plan` enumerates every grid ``[D, R, C, Z]`` (a :class:`GridShape`) with ``D·R·C·Z = gpus``,
rejects those that do not divide the model or the batch or do not fit in memory, predicts the step time
of the rest (:mod:`axonn.planner.model`, :mod:`axonn.planner.memory`) and ranks them. Machine profiles live
in ``axonn/planner/profiles/*.yaml`` (:func:`load_profile`); ``python -m axonn.planner calibrate``
measures one. See ``docs/planner.md``.

:func:`plan_inference` picks the grid to evaluate a model on (``eval/*.py --plan``): the weights and KV
cache per GPU for a batch and context (:mod:`axonn.planner.inference`), the smallest model-parallel group
that fits, and as many data replicas as the GPUs allow.
"""
from axonn.grid_shape import GridShape

from .memory import MemoryBreakdown, MemoryConfig, memory_per_gpu
from .inference import (INFERENCE_DTYPES, InferenceDtype, InferenceEntry, InferenceMemory, InferencePlan,
                        format_inference_plan, inference_memory_per_gpu, kv_cache_bytes, plan_inference,
                        smallest_inference_gpus)
from .model import CostConfig, StepBreakdown, divisibility_problem, predict_step
from .profiles import MachineProfile, known_profiles, load_profile, save_profile
from .search import (GRAD_REDUCE_BYTES, PlanEntry, PlanError, PlanResult, Rejection, format_plan, load_machine,
                     plan, resolve_shape, smallest_fitting_gpus)

__all__ = [
    "GRAD_REDUCE_BYTES", "INFERENCE_DTYPES", "CostConfig", "GridShape", "InferenceDtype", "InferenceEntry",
    "InferenceMemory", "InferencePlan", "MachineProfile", "MemoryBreakdown", "MemoryConfig", "PlanEntry", "PlanError",
    "PlanResult", "Rejection", "StepBreakdown", "divisibility_problem", "format_inference_plan",
    "format_plan", "inference_memory_per_gpu", "known_profiles", "kv_cache_bytes", "load_machine", "load_profile",
    "memory_per_gpu", "plan", "plan_inference", "predict_step", "resolve_shape", "save_profile",
    "smallest_fitting_gpus", "smallest_inference_gpus",
]
