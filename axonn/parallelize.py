"""Whole-model parallelisation of HF causal LMs by their parallel plan, and grid-wide gradient utilities.

The layout of each family is a table in :mod:`axonn.plans`; :func:`parallelize` applies it.  Llama's
(``Gr`` = row, ``Gc`` = col axis)::

    x (full hidden, replicated over row/col; batch slice of this data/depth rank)
    ├─ input_layernorm ─ drop(col) ─► q,k,v  (non-transposed: in=hidden/Gc, out=heads/Gr)
    │     attention on the local heads (heads/Gr and kv_heads/Gr, GQA ratio unchanged)
    │  ◄─ gather(col) ─ o_proj (transposed: in=heads/Gr, out=hidden/Gc)
    ├─ post_attention_layernorm ─ drop(col) ─► gate, up (non-transposed: out=ffn/Gr)
    │  ◄─ gather(col) ─ down_proj (transposed: in=ffn/Gr, out=hidden/Gc)
    final norm ─ drop(col) ─► lm_head (non-transposed: out=vocab/Gr) ─► vocab-sharded logits

``embed_tokens`` is vocab-parallel over row × col.  Logits stay sharded over the
row group when gradients are enabled (the loss is
:func:`~axonn.intra_layer.vocab_parallel_cross_entropy`) and are all-gathered to
the full vocabulary under ``torch.no_grad()`` (evaluation, ``generate``).
Norm weights are replicated everywhere.  The other families differ as their plans say (Qwen3's per-head
and OLMo 2's row-sharded q/k norms, OLMo 2's cut of the block input before attention and MLP).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .communication import all_reduce
from .grid import AXES, Grid, divisor_hint, get_grid
from .intra_layer import Embedding, Linear, drop, finish_pending_grads, vocab_parallel_cross_entropy
from .intra_layer.overlap import CONFIG as COMM_CONFIG
from .intra_layer.primitives import reduce_both, slice_replicated
from .plans import PLANS, TRANSPOSED, ModelPlan, dims_of_config, plan_of_model
from .sharding import ShardSpec, gather_full


def spec_of(p: torch.Tensor) -> ShardSpec:
    """Shard spec of a parameter (replicated when it was not created by an axonn layer)."""
    s = getattr(p, "_axonn_spec", None)
    return s if s is not None else ShardSpec.replicated(p.shape)


def _check_model(model: nn.Module, grid: Grid) -> ModelPlan:
    """The model's plan, after checking that the grid's axes divide every field the plan names."""
    plan = plan_of_model(model)
    if plan is None:
        supported = ", ".join(p.hf_class for p in PLANS.values())
        raise TypeError(f"axonn.parallelize supports {supported}, got {type(model).__name__}; "
                        "for plain nn.Linear models build them inside axonn.intra_layer.auto_parallelize()")
    c = model.config
    for rule in plan.requires:
        n, g = getattr(c, rule.field), grid.size(rule.axes)
        if n % g:
            if len(rule.axes) == 1:
                ax = rule.axes[0]
                raise ValueError(f"{rule.label}={n} is not divisible by the {ax} ({_AXIS_ARG[ax]}) axis size {g}"
                                 + divisor_hint(n, g, ax))
            names = " x ".join(rule.axes)
            args = "*".join(_AXIS_ARG[a] for a in rule.axes)
            raise ValueError(f"{rule.label}={n} is not divisible by the {names} ({args}) axis size {g}; "
                             "pad the vocabulary to a multiple of it")
    dims = dims_of_config(c)
    block = getattr(getattr(model, plan.backbone), plan.layers)[0]
    for rule in plan.linears():
        lin = block.get_submodule(rule.path)
        if (lin.out_features, lin.in_features) != (dims[rule.out], dims[rule.in_]):
            raise ValueError(f"unexpected {rule.name} shape {lin.out_features} x {lin.in_features} for the "
                             f"config's head_dim (want {rule.out} x {rule.in_} = {dims[rule.out]} x {dims[rule.in_]})")
    return plan


_AXIS_ARG = {"row": "G_intra_r", "col": "G_intra_c", "depth": "G_intra_d", "data": "G_data"}


def _swap(old: nn.Linear, grid: Grid, transpose: bool, device: torch.device, **kw) -> Linear:
    """The axonn twin of ``old`` on ``device``: its shards copied from ``old``, or left empty when ``old`` is meta."""
    meta = old.weight.is_meta
    new = Linear(old.in_features, old.out_features, bias=old.bias is not None, transpose=transpose,
                 expert_mode=True, grid=grid, device=device, dtype=old.weight.dtype, init=False, **kw)
    if not meta:
        new.load_full(old.weight.data, None if old.bias is None else old.bias.data)
    return new


def is_tied(model: nn.Module) -> bool:
    """True when the model's LM head and input embedding are one parameter (``tie_word_embeddings``, tied)."""
    plan = plan_of_model(model)
    if plan is None or not getattr(model.config, "tie_word_embeddings", False):
        return False
    return getattr(model, plan.head).weight is getattr(getattr(model, plan.backbone), plan.embedding).weight


def is_meta(model: nn.Module) -> bool:
    """True when some parameter of ``model`` has no storage (built on the ``meta`` device)."""
    return any(p.is_meta for p in model.parameters())


def materialize(model: nn.Module, device: torch.device | str) -> nn.Module:
    """Give every ``meta`` parameter empty (uninitialised) storage on ``device`` and move buffers there.

    Parameters that already have storage are left alone.  Fill the new ones with :func:`load_shards`.
    Buffers must be real: build the model under ``accelerate.init_empty_weights()`` (parameters on
    meta, buffers such as the rotary frequencies computed as usual), not under ``torch.device("meta")``.
    """
    device = torch.device(device)
    made: dict[int, nn.Parameter] = {}  # a parameter shared by two modules (tied embeddings) stays shared
    for mname, mod in model.named_modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                new = made.get(id(p))
                if new is None:
                    new = nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
                    if hasattr(p, "_axonn_spec"):
                        new._axonn_spec = p._axonn_spec
                    made[id(p)] = new
                mod._parameters[name] = new
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_meta:
                raise ValueError(f"buffer {mname}.{name} is on the meta device and its values are lost: build the "
                                 "model under accelerate.init_empty_weights() (buffers stay real), "
                                 "not torch.device('meta')")
            if b is not None:
                mod._buffers[name] = b.to(device)
    return model


@torch.no_grad()
def load_shards(model: nn.Module, read: Callable[[str, ShardSpec], torch.Tensor]) -> None:
    """Set every parameter to ``read(name, spec)``: this rank's local shard of the full tensor ``name``.

    ``read`` sees the HF parameter name and the shard spec (:func:`axonn.sharding.shard_from_rows`
    builds the shard from the rows it needs), so no rank has to hold a full tensor.
    """
    for name, p in model.named_parameters():
        t = read(name, spec_of(p))
        if t.numel() != p.numel():
            raise ValueError(f"{name}: the reader returned {t.numel()} elements for a local shard of {p.numel()}")
        p.copy_(t.reshape(p.shape))


def _drop_col_hook(grid: Grid):
    def hook(module, args, output):
        return drop(output, "col", grid)
    return hook


def _drop_col_pre_hook(grid: Grid):
    """Cut a block module's input (``hidden_states``, positional or keyword) to this rank's column shard."""
    def hook(module, args, kwargs):
        if args:
            return (drop(args[0], "col", grid), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": drop(kwargs["hidden_states"], "col", grid)}
    return hook


def _shard_norm_over_row(norm: nn.Module, grid: Grid) -> None:
    """Make an RMSNorm whose input is this rank's row shard of its width normalise over the full width.

    The sum of squares is all-reduced over row and the (replicated) weight cut to the shard; the
    weight's gradient is summed over row in the backward, so it stays the full, replicated gradient.
    The module keeps its parameter and its name.
    """
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        ss = reduce_both(x.pow(2).sum(-1, keepdim=True), "row", grid)
        x = x * torch.rsqrt(ss / norm.weight.shape[-1] + eps)
        return (slice_replicated(norm.weight, "row", grid) * x).to(dtype)

    norm.forward = forward


def _sum_over_row_hook(grid: Grid):
    """Gradient hook of a replicated weight used on the rank's row shard (its heads): sum it over row."""
    def hook(g: torch.Tensor) -> torch.Tensor:
        return all_reduce(g.clone(), "row", grid=grid)
    return hook


def _make_loss(grid: Grid):
    def loss_fn(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, num_items_in_batch=None,
                ignore_index: int = -100, shift_labels: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """HF ``ForCausalLMLoss`` semantics on vocab-sharded (or full) logits."""
        if shift_labels is None:
            labels = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        shift_labels = shift_labels.to(logits.device)
        gr = grid.size("row")
        if gr > 1 and logits.shape[-1] == vocab_size:  # full (gathered) logits: take our shard
            n = vocab_size // gr
            i = grid.index("row")
            logits = logits[..., i * n:(i + 1) * n]
        per_tok = vocab_parallel_cross_entropy(logits, shift_labels, ignore_index, reduction="none",
                                               axes="row", grid=grid)
        if num_items_in_batch is not None:
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(per_tok.device)
            return per_tok.sum() / num_items_in_batch
        n_valid = (shift_labels != ignore_index).sum()
        return per_tok.sum() / n_valid  # nan when nothing is valid, like F.cross_entropy
    return loss_fn


def parallelize(model: nn.Module, grid: Grid | None = None, device: torch.device | str | None = None) -> nn.Module:
    """Turn an unmodified HF causal LM of a family with a plan (:mod:`axonn.plans`: ``LlamaForCausalLM``,
    Mistral, Qwen2, Qwen3, OLMo 2, GPT-NeoX) into its 4D-parallel form, in place.

    Raises ``TypeError`` for a model without a plan, and before touching the model ``ValueError`` if a
    dimension is not divisible by the axis that splits it.  Parameter names stay HF's
    (``model.layers.0.self_attn.q_proj.weight``), so :func:`full_state_dict` returns an HF state dict.

    Two ways in:

    * a real model: every rank must hold the same full model (same seed or checkpoint), on any
      device; each layer's shards are copied out of it onto ``device`` (default: the grid's), and
      the rest of the model (norms, buffers) is moved there, so a full model on the host becomes
      a GPU model holding only its shards;
    * a model whose parameters are on the ``meta`` device (``accelerate.init_empty_weights()``):
      nothing full is ever allocated; every rank creates only its own shards, empty, on
      ``device`` (default: the grid's), and the caller fills them with :func:`load_shards`.
      This is how a 70B or 405B model is built: no rank, host or GPU, holds more than its shards.
    """
    grid = grid or get_grid()
    if getattr(model, "_axonn_grid", None) is not None:
        raise ValueError("model is already parallelized")
    plan = _check_model(model, grid)
    meta = is_meta(model)
    device = torch.device(device) if device is not None else grid.device
    model._axonn_grid = grid
    if grid.size(("row", "col", "depth")) == 1:
        # Nothing is sharded: keep HF's own (compile-friendly) modules; every parameter is
        # replicated, so sync_gradients is a data-parallel all-reduce and checkpoints still work.
        return materialize(model, device) if meta else model.to(device)
    linears: list[Linear] = []
    backbone = getattr(model, plan.backbone)
    for layer in getattr(backbone, plan.layers):
        for rule in plan.linears():
            parent, _, name = rule.path.rpartition(".")
            owner = layer.get_submodule(parent) if parent else layer
            kw = {"gather_output": True} if rule.kind == TRANSPOSED else {}
            new = _swap(getattr(owner, name), grid, rule.kind == TRANSPOSED, device, **kw)
            setattr(owner, name, new)
            linears.append(new)
        for path in plan.drop_after:
            layer.get_submodule(path).register_forward_hook(_drop_col_hook(grid))
        for path in plan.drop_before:
            layer.get_submodule(path).register_forward_pre_hook(_drop_col_pre_hook(grid), with_kwargs=True)
        for path in plan.row_sharded_norms:
            _shard_norm_over_row(layer.get_submodule(path), grid)
    getattr(backbone, plan.final_norm).register_forward_hook(_drop_col_hook(grid))
    old = getattr(backbone, plan.embedding)
    tied = is_tied(model)
    head = _swap(getattr(model, plan.head), grid, False, device, gather_output="auto")
    if tied:  # one parameter in the head's layout, used by both (axonn.intra_layer.embedding)
        emb = Embedding.tied(head, old.padding_idx)
    else:
        emb = Embedding(old.num_embeddings, old.embedding_dim, old.padding_idx, grid=grid,
                        device=device, dtype=old.weight.dtype, init=False)
        if not meta:
            emb.load_full(old.weight.data)
    setattr(backbone, plan.embedding, emb)
    setattr(model, plan.head, head)
    linears.append(head)
    for a, b in zip(linears[:-1], linears[1:]):
        object.__setattr__(a, "_next_layer", b)  # plain attributes, not submodules
        object.__setattr__(b, "_prev_layer", a)
    for name, mod in model.named_modules():
        if isinstance(mod, (Linear, Embedding)):
            mod.axonn_name = name
    model.loss_function = _make_loss(grid)
    model = materialize(model, device) if meta else model.to(device)
    for layer in getattr(backbone, plan.layers):  # after materialize: hooks belong to the final Parameters
        for path in plan.per_head_norms:
            for p in layer.get_submodule(path).parameters():
                p.register_hook(_sum_over_row_hook(grid))
    return model


def param_specs(model: nn.Module) -> dict[str, ShardSpec]:
    return {n: spec_of(p) for n, p in model.named_parameters()}


def full_state_dict(model: nn.Module, rank0_only: bool = False, grid: Grid | None = None) -> dict[str, torch.Tensor]:
    """Gather the full HF-named state dict (collective: every rank must call it).

    Returns it on every rank, or only on global rank 0 (others get ``{}``) with ``rank0_only``.
    """
    grid = grid or getattr(model, "_axonn_grid", None) or get_grid()
    out: dict[str, torch.Tensor] = {}
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head is listed under both names
    for name, t in model.state_dict().items():
        p = params.get(name)
        full = gather_full(t, spec_of(p), grid) if p is not None else t.detach().clone()
        if not rank0_only or grid.rank == 0:
            out[name] = full
    return out


def full_grad_dict(model: nn.Module, grid: Grid | None = None) -> dict[str, torch.Tensor]:
    """Gather every parameter's full gradient (zeros where ``.grad`` is None); collective."""
    grid = grid or getattr(model, "_axonn_grid", None) or get_grid()
    return {n: gather_full(p.grad if p.grad is not None else torch.zeros_like(p), spec_of(p), grid)
            for n, p in model.named_parameters()}


def _params(obj) -> list[torch.nn.Parameter]:
    if isinstance(obj, nn.Module):
        return [p for p in obj.parameters() if p.requires_grad]
    if isinstance(obj, torch.Tensor):
        return [obj]
    return [p for p in obj if p.requires_grad]


GRAD_BUCKET_ELEMENTS = 1 << 26  # 64 Mi elements (256 MiB in fp32) per all-reduce in sync_gradients


@torch.no_grad()
def sync_gradients(model_or_params, grid: Grid | None = None, bucket_elements: int = GRAD_BUCKET_ELEMENTS,
                   reduce_dtype: torch.dtype | None = None) -> None:
    """Average gradients over the data (and, where needed, depth) axes; call after backward.

    * depth-sharded weights (already summed over depth by the backward
      reduce-scatter): all-reduce over ``data``;
    * everything else (biases, norms, embedding): all-reduce over ``data × depth``;
    then divide by ``G_data·G_intra_d``.  Gradients sharing a group and a dtype are flattened
    into buckets of at most ``bucket_elements`` (one larger gradient travels alone), so the
    transient copy is one bucket, not a second copy of every gradient.  ``reduce_dtype``
    (default: ``optimize_communication``'s ``grad_reduce_dtype``, else each gradient's own) is
    the buckets' dtype on the wire; the averaged result is copied back into each ``.grad`` in
    its own dtype.  Waits for overlapped reduce-scatters first.  No-op when
    ``G_data = G_intra_d = 1``.
    """
    finish_pending_grads()
    grid = grid or getattr(model_or_params, "_axonn_grid", None) or get_grid()
    n = grid.size(("data", "depth"))
    if n == 1:
        return
    wire = reduce_dtype or COMM_CONFIG.grad_reduce_dtype
    buckets: dict[tuple, list[list[torch.nn.Parameter]]] = {}  # (axes, dtype) -> buckets, same order on every rank
    filled: dict[tuple, int] = {}
    for p in _params(model_or_params):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        axes = ("data",) if spec_of(p).flat is not None else ("data", "depth")
        key = (axes, wire if wire is not None and grid.size(axes) > 1 else p.grad.dtype)  # no rounding without traffic
        bs = buckets.setdefault(key, [[]])
        if bs[-1] and filled[key] + p.numel() > bucket_elements:
            bs.append([])
            filled[key] = 0
        bs[-1].append(p)
        filled[key] = filled.get(key, 0) + p.numel()
    for (axes, dtype), groups in buckets.items():
        for group in groups:
            flat = torch.empty(sum(p.numel() for p in group), dtype=dtype, device=group[0].grad.device)
            off = 0
            for p in group:  # one bucket-sized buffer, cast while copying
                flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
                off += p.numel()
            all_reduce(flat, axes, grid=grid)
            flat.div_(n)
            off = 0
            for p in group:
                k = p.grad.numel()
                p.grad.copy_(flat[off:off + k].view_as(p.grad))
                off += k


@torch.no_grad()
def grad_norm(parameters, norm_type: float = 2.0, grid: Grid | None = None) -> torch.Tensor:
    """The norm of all gradients over the whole grid (call after :func:`sync_gradients`).

    ``total = (Σ_shards Σ_p ‖g_p‖_q^q)^(1/q)`` with each distinct shard counted once: the
    per-parameter norms (``torch._foreach_norm``, one kernel per group of gradients that share a
    device, a dtype and the axes they are sharded on; accumulated in fp32) are raised to ``q`` and
    summed per group.  A shard split over axes ``S`` is held by ``world / |S|`` ranks (its copies
    over the other axes, equal after :func:`sync_gradients`), so each rank weights its group sums
    by ``|S| / world`` and **one** all-reduce over the world adds them up: one collective on the
    world's communicator per step, not one per subset of the axes (each subset's group would start
    a communicator of its own, with its buffers, for a scalar).  ``q = inf`` takes a MAX
    all-reduce over the world instead.  Returns the total norm as a 0-dim fp32 device tensor,
    the same value on every rank (no host synchronisation).
    """
    grid = grid or get_grid()
    return _grad_norm(_grad_groups(parameters, grid), float(norm_type), grid)


def _grad_groups(parameters, grid: Grid) -> dict[tuple, list[torch.Tensor]]:
    """The gradients by (axes they are sharded on, device, dtype)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in _params(parameters):
        if p.grad is not None:
            axes = tuple(a for a in spec_of(p).shard_axes if grid.size(a) > 1)
            groups.setdefault((axes, p.grad.device, p.grad.dtype), []).append(p.grad.detach())
    return groups


def _grad_norm(groups: dict[tuple, list[torch.Tensor]], norm_type: float, grid: Grid) -> torch.Tensor:
    dev = next(iter(groups))[1] if groups else grid.device
    zero = torch.zeros((), device=dev, dtype=torch.float32)
    if math.isinf(norm_type):
        local = torch.stack([torch.stack(torch._foreach_norm(gs, norm_type, dtype=torch.float32)).max().to(dev)
                             for gs in groups.values()]).max() if groups else zero
        return all_reduce(local.reshape(1).clone(), AXES, op=torch.distributed.ReduceOp.MAX, grid=grid)[0]
    local = zero
    for (axes, _, _), gs in groups.items():
        s = torch.stack(torch._foreach_norm(gs, norm_type, dtype=torch.float32)).pow(norm_type).sum().to(dev)
        local = local + s * (grid.size(axes) / grid.world_size)
    return all_reduce(local.reshape(1).clone(), AXES, grid=grid)[0].pow(1.0 / norm_type)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, grid: Grid | None = None) -> torch.Tensor:
    """Clip gradients by their norm over the whole grid (call after :func:`sync_gradients`): the
    :func:`grad_norm` ``total``, then every gradient is scaled by ``min(1, max_norm / (total + 1e-6))``
    with ``torch._foreach_mul_``; the scale stays on the device (no host synchronisation; ``× 1.0``
    leaves the gradients bit-identical).  Returns the total norm (fp32, the same value on every rank).
    """
    grid = grid or get_grid()
    groups = _grad_groups(parameters, grid)
    total = _grad_norm(groups, float(norm_type), grid)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for (_, device, dtype), gs in groups.items():
        torch._foreach_mul_(gs, coef.to(device=device, dtype=dtype))
    return total
