"""AxoNN-style 4D (data × depth × row × column) parallel training core.

Public API (names follow upstream AxoNN)::

    grid = axonn.init(G_data, G_intra_r, G_intra_c, G_intra_d)   # process grid
    grid = axonn.init(axonn.GridShape.parse("2,2,1,2"))          # the same from --grid D,R,C,Z; grid.shape
    axonn.get_grid(); axonn.batch_slice(global_batch)
    model = axonn.parallelize(LlamaForCausalLM(...))             # in place
    with accelerate.init_empty_weights(): m = LlamaForCausalLM(cfg)  # or: no full copy anywhere
    axonn.parallelize(m); axonn.load_shards(m, read)               # each rank fills its own shards
    loss = model(input_ids=x, labels=y).loss; loss.backward()
    axonn.enable_activation_checkpointing(model)                   # layer inputs sharded over row x col
    axonn.sync_gradients(model); axonn.clip_grad_norm_(model.parameters(), 1.0)
    axonn.full_state_dict(model); axonn.checkpoint.save/load/export_hf
    axonn.optimize_communication(overlap_all_reduce=True, ...)
"""
from __future__ import annotations

from . import intra_layer
from .recompute import enable_activation_checkpointing
from .grid import Grid, GridShape, batch_slice, get_grid, init
from .intra_layer import auto_parallelize, optimize_communication, vocab_parallel_cross_entropy
from .parallelize import (clip_grad_norm_, full_grad_dict, full_state_dict, grad_norm, is_meta, is_tied, load_shards,
                          materialize, param_specs, parallelize, spec_of, sync_gradients)

__all__ = ["Grid", "GridShape", "init", "get_grid", "batch_slice", "parallelize", "full_state_dict", "full_grad_dict",
           "param_specs", "spec_of", "is_meta", "is_tied", "materialize", "load_shards", "sync_gradients", "clip_grad_norm_",
           "grad_norm", "optimize_communication", "auto_parallelize", "vocab_parallel_cross_entropy", "intra_layer",
           "checkpoint", "enable_activation_checkpointing"]


def __getattr__(name: str):
    if name == "checkpoint":  # lazy: keeps `import axonn` light
        import importlib
        return importlib.import_module(".checkpoint", __name__)
    raise AttributeError(name)
