"""``causal_sdpa``: Hugging Face's SDPA attention, but a plain causal training forward keeps flash attention
under ``torch.compile``.

Why.  HF builds each forward's attention mask in ``masking_utils.create_causal_mask``.  It
returns ``None`` (and SDPA then runs ``is_causal=True``, which PyTorch dispatches to the flash
kernel) only after reading tensor *values*: whether the padding mask hides anything and
whether the position ids restart (packed sequences).  While ``torch.compile`` traces it cannot
read values, so it always materialises a ``(B, 1, T, T)`` boolean mask (transformers #48925).
SDPA with an explicit mask cannot use flash attention, and no kernel can skip the upper triangle
of a mask it cannot know is causal: on a GPU the step does about twice causal flash's attention
work, reads a ``B·T²`` mask in every layer and, for GQA models, expands K and V to every head.

What.  The same attention function as ``"sdpa"`` with its own mask function (the
``AttentionMaskInterface`` extension point).  For self-attention over whole rows without a
padding mask, cache offset or sliding window it returns ``None`` while tracing, where HF's
check cannot decide; everything else (padded batches, KV-cache decoding, packed rows in eager
mode) goes to HF's ``sdpa_mask`` unchanged.

The contract.  Under ``torch.compile`` the rows must not be packed with position ids that
restart inside a row.  The trainer never passes position ids (HF's default is ``0..T-1`` per
row), which is why :class:`memorization.train.Trainer` switches its model to this
implementation; a caller that packs with restarting position ids must keep ``"sdpa"``.
"""
from __future__ import annotations

import torch

CAUSAL_SDPA = "causal_sdpa"
_registered = False


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
    if plain and (mask_function is mu.causal_mask_function or torch.compiler.is_compiling()):
        return None
    if not old_api:
        kwargs.update(q_length=q_length, q_offset=q_offset)
    return mu.sdpa_mask(batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
                        attention_mask=attention_mask, **kwargs)


def register() -> bool:
    """Register ``causal_sdpa`` with transformers (idempotent); False if this transformers lacks the interfaces."""
    global _registered
    if _registered:
        return True
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers < 4.53: no mask interface to extend
        return False
    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
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
