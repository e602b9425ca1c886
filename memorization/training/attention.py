"""``causal_sdpa``: Hugging Face's SDPA attention, except that a plain causal training forward calls the causal
kernel itself -- ``scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)``, no mask tensor, K and
V at their own ``kv_heads`` -- also under ``torch.compile`` and whatever transformers version decides.

Why.  HF builds each forward's attention mask in ``masking_utils.create_causal_mask``.  It returns ``None`` (and
SDPA then runs ``is_causal=True``, which PyTorch dispatches to flash or cuDNN attention) only after reading tensor
*values*: whether the padding mask hides anything and whether the position ids restart (packed sequences).
While ``torch.compile`` traces it cannot read values, so it materialises a ``(B, 1, T, T)`` boolean mask
(transformers #48925); with a mask, HF's ``sdpa_attention_forward`` also repeats K and V to every head
(``use_gqa_in_sdpa`` is False for a masked call on CUDA), and no kernel can skip the upper triangle of a mask it
cannot know is causal: the step does about twice causal attention's work on ``heads / kv_heads`` times the K/V
bytes.

What.  Two registered functions under one name:

* the mask function (``AttentionMaskInterface``): for self-attention over whole rows -- no padding mask, no cache
  offset, ``q_length == kv_length``, no sliding window -- it returns ``None`` when the mask is known to be
  causal: HF found no packing (eager), or dynamo is tracing (HF could not look), or the caller declared
  :func:`unpacked_rows` (the trainer does: its rows never restart their positions, so the decision needs no
  value and no trace, also where a graph break runs this function outside the compiled graph).  Everything else
  (padded batches, KV-cache decoding, packed rows, sliding windows) goes to HF's ``sdpa_mask`` unchanged.
* the attention function (``AttentionInterface``): with no mask for a causal self-attention of more than one
  query it calls ``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)``
  directly (not through HF's version-dependent GQA and ``is_causal`` logic); anything else -- a mask, decoding,
  a sliding window narrower than the sequence (Mistral keeps its own path), position biases, soft-capping,
  attention sinks -- goes to HF's ``sdpa_attention_forward`` unchanged.

The contract.  Under ``torch.compile`` or inside :func:`unpacked_rows` the rows must not be packed with position
ids that restart inside a row.  :class:`memorization.training.train.Trainer` never passes position ids (HF's default is
``0..T-1`` per row), which is why it switches its model to this implementation and runs its steps inside
:func:`unpacked_rows`; a caller that packs with restarting position ids must keep ``"sdpa"``.

:func:`sdpa_recording_backend` is the check: a ``torch.compile`` backend that records each attention kernel op
the compiled forward dispatches (the aten op, ``is_causal``, whether a mask is passed, the heads of Q and of K/V);
:func:`compiled_step_attention` runs one trainer step under it and :func:`dispatch_problems` says what is wrong with
what it recorded (the test and ``benchmarks/attention_dispatch.py`` both use them).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

CAUSAL_SDPA = "causal_sdpa"
_registered = False
_unpacked = False  # set by unpacked_rows(); read by the mask function (a guarded global under torch.compile)

# keyword arguments HF attention modules pass that change what attention computes: with any of them set, HF's own
# sdpa function runs (sliding_window only when narrower than the keys; see causal_sdpa_attention)
_HF_ONLY_KWARGS = ("position_bias", "softcap", "s_aux", "sinks", "head_mask")


@contextlib.contextmanager
def unpacked_rows() -> Iterator[None]:
    """Within: every forward's rows are whole sequences at positions ``0..T-1`` (no packing, no restarts), so a
    mask request without padding, cache or window is plainly causal and gets no mask tensor (see module doc)."""
    global _unpacked
    saved, _unpacked = _unpacked, True
    try:
        yield
    finally:
        _unpacked = saved


def _causal_sdpa_mask(batch_size: int, q_length: int | None = None, kv_length: int = 0, q_offset=0, kv_offset=0,
                      mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs):
    """HF's ``sdpa_mask``, except that a plain causal mask is ``None`` also while tracing (see module doc)."""
    from transformers import masking_utils as mu

    mask_function = mask_function or mu.causal_mask_function
    # transformers 4.53-4.57 pass cache_position, not q_length/q_offset (a plain mask's is 0..T-1: q_offset 0)
    old_api = q_length is None
    if old_api:
        q_length = kwargs["cache_position"].shape[0]
    plain = (attention_mask is None and kwargs.get("local_size") is None
             and isinstance(q_offset, int) and isinstance(kv_offset, int) and q_offset == kv_offset == 0
             and q_length == kv_length)
    # eager: HF has read the position ids, and a plain causal mask function means no packing
    # tracing: HF wrapped it in its packed-sequence adapter because it could not read them
    # unpacked_rows(): the caller guarantees no packing, traced or not
    if plain and (mask_function is mu.causal_mask_function or _unpacked or torch.compiler.is_compiling()):
        return None
    if not old_api:
        kwargs.update(q_length=q_length, q_offset=q_offset)
    return mu.sdpa_mask(batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
                        attention_mask=attention_mask, **kwargs)


def causal_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """HF's attention-function contract (``query (B, H, T, d)``, ``key``/``value (B, H_kv, S, d)`` -> output
    ``(B, T, H, d)``, no weights): causal SDPA with grouped K/V when no mask is given for a causal self-attention
    of ``T = S > 1`` queries, HF's ``sdpa_attention_forward`` otherwise (see module doc)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = kwargs.get("sliding_window")
    if (attention_mask is not None or not causal or q_len == 1 or q_len != kv_len
            or (window is not None and window < kv_len) or kwargs.get("output_attentions")
            or any(kwargs.get(k) is not None for k in _HF_ONLY_KWARGS)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling, is_causal=True,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> bool:
    """Register ``causal_sdpa`` with transformers (idempotent); False if this transformers lacks the interfaces."""
    global _registered
    if _registered:
        return True
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers < 4.53: no mask interface to extend
        return False
    AttentionInterface.register(CAUSAL_SDPA, causal_sdpa_attention)
    AttentionMaskInterface.register(CAUSAL_SDPA, _causal_sdpa_mask)
    _registered = True
    return True


def use_causal_sdpa(model: torch.nn.Module) -> bool:
    """Switch an ``"sdpa"`` HF model to ``causal_sdpa`` (see module doc); True if it now uses it.

    Models on another implementation (eager, flash_attention_2, ...) are left alone.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", CAUSAL_SDPA):
        return False
    if not register() or not hasattr(model, "set_attn_implementation"):
        return False
    try:
        model.set_attn_implementation(CAUSAL_SDPA)
    except (ValueError, ImportError):  # a transformers that validates names against its own list: keep sdpa
        return False
    return model.config._attn_implementation == CAUSAL_SDPA


# ---- the check: which attention kernel a compiled function dispatches -------------------------------------------

@dataclasses.dataclass(frozen=True)
class SdpaCall:
    """One attention kernel op of a compiled forward graph (aten level: after PyTorch chose the backend)."""

    op: str  # e.g. aten._scaled_dot_product_cudnn_attention.default
    is_causal: bool
    has_mask: bool  # an attn_mask / attn_bias tensor is passed
    q_heads: int
    kv_heads: int  # K's heads as the kernel receives them: kv_heads of the model unless K was repeated
    enable_gqa: bool | None  # None: the op has no such argument (its kernel takes grouped K/V as they come)


def _bound_args(node: torch.fx.Node) -> dict:
    """``node``'s arguments by their schema names, defaults filled in."""
    schema = node.target._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def sdpa_calls_of(gm: torch.fx.GraphModule) -> list[SdpaCall]:
    """The attention kernel ops of an aten-level FX graph (AOTAutograd's forward graph), in order."""
    calls = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or not hasattr(n.target, "_schema") or "scaled_dot_product" not in str(n.target):
            continue
        a = _bound_args(n)
        mask = a.get("attn_mask", a.get("attn_bias"))
        q, k = a["query"].meta["val"], a["key"].meta["val"]
        calls.append(SdpaCall(op=str(n.target), is_causal=bool(a.get("is_causal", False)), has_mask=mask is not None,
                              q_heads=int(q.shape[1]), kv_heads=int(k.shape[1]),
                              enable_gqa=bool(a["enable_gqa"]) if "enable_gqa" in a else None))
    return calls


def sdpa_recording_backend() -> tuple[Callable, list[SdpaCall]]:
    """``(backend, calls)``: a ``torch.compile`` backend (AOTAutograd, graphs run eagerly, no Inductor) that appends
    to ``calls`` the attention kernel ops of every forward graph it compiles."""
    from torch._dynamo.backends.common import aot_autograd

    calls: list[SdpaCall] = []

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs):
        calls.extend(sdpa_calls_of(gm))
        return gm

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, example_inputs: gm), calls


def compiled_step_attention(trainer) -> list[SdpaCall]:
    """The attention kernel ops of one training step of ``trainer`` (a :class:`~memorization.training.train.Trainer`)
    with its forward and loss compiled by :func:`sdpa_recording_backend` (dynamo's caches reset first, so the
    step is traced afresh); the trainer keeps that compiled forward."""
    from .loss import causal_lm_loss_sum

    backend, calls = sdpa_recording_backend()
    torch._dynamo.reset()
    trainer.forward = torch.compile(causal_lm_loss_sum, backend=backend)
    trainer.train_step()
    return calls


def dispatch_problems(calls: list[SdpaCall], config) -> list[str]:
    """What keeps ``calls`` (one forward of a model with HF ``config``) from being causal flash attention on grouped
    K/V: not one op per layer, a mask tensor or ``is_causal=False``, K/V repeated to more heads than the model's
    ``num_key_value_heads``.  Empty when there is nothing wrong."""
    out = []
    if len(calls) != config.num_hidden_layers:
        out.append(f"{len(calls)} attention ops for {config.num_hidden_layers} layers")
    for c in dict.fromkeys(calls):  # distinct, in order
        if c.has_mask or not c.is_causal:
            out.append(f"{c.op} with a mask tensor / is_causal=False")
        if c.kv_heads != config.num_key_value_heads:
            out.append(f"{c.op} gets K/V with {c.kv_heads} heads, the model has {config.num_key_value_heads}")
    return out
