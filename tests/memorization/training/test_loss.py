"""The chunked causal-LM loss (memorization/training/loss.py): the fused head + cross-entropy equals the plain one."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import memorization.training.loss as loss_mod
from memorization.training.goldfish import IGNORE_INDEX

B, T, H, V = 3, 41, 48, 503


def _ce(logits, y):
    return F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) / H**0.5)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[torch.rand(B, T, generator=g) < 0.25] = IGNORE_INDEX  # Goldfish drops
    return head, hidden, labels


def _full_logits_loss(hidden, head, labels):
    """The definition: all logits at once, plain cross-entropy over positions :-1 -> labels 1:."""
    return _ce(head(hidden[:, :-1].reshape(-1, H)).float(), labels[:, 1:].reshape(-1))


def _loss_and_grads(fn, head, hidden, labels, autocast=False):
    hidden.grad = head.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = fn(hidden, head, labels)
    (0.37 * loss).backward()  # a scale, as the trainer's 1/kept-labels
    return loss.detach(), hidden.grad.clone(), head.weight.grad.clone()


@pytest.mark.parametrize("chunk", [7, 40, 1000])  # uneven chunks, ~3 chunks, one chunk
def test_fused_head_cross_entropy_equals_full_logits_in_fp32(chunk):
    head, hidden, labels = _case()
    ref = _loss_and_grads(_full_logits_loss, head, hidden, labels)
    got = _loss_and_grads(lambda h, m, y: loss_mod.chunked_lm_loss_sum(h, m, y, _ce, chunk), head, hidden, labels)
    for r, g in zip(ref, got):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    assert (labels[:, 1:] == IGNORE_INDEX).any()


def test_fused_under_bf16_autocast_is_as_accurate_as_the_autocast_reference():
    """bf16 matmuls: the fused gradients differ from the autocast reference by bf16 rounding only: against the
    fp32 truth, their error is no larger than the reference's own."""
    head, hidden, labels = _case(1)
    truth = _loss_and_grads(_full_logits_loss, head, hidden, labels)
    ref = _loss_and_grads(_full_logits_loss, head, hidden, labels, autocast=True)
    got = _loss_and_grads(lambda h, m, y: loss_mod.chunked_lm_loss_sum(h, m, y, _ce, 40), head, hidden, labels,
                          autocast=True)
    # The same bf16 logits, but two computations: the per-chunk GEMMs may round a logit to the other bf16
    # neighbour (2^-8 relative; on a target logit ~2^-8·3/538 ≈ 2e-5 of the sum) and the ~90 per-position
    # losses are summed in another order (≤ 90·2^-24 ≈ 5e-6 relative).  Which bits come out depends on the
    # CPU (538.4656 vs 538.4655 seen), so: within 5e-5 relative, a few such roundings.
    torch.testing.assert_close(got[0], ref[0], rtol=5e-5, atol=0)
    for i in (1, 2):
        err = lambda x: ((x[i] - truth[i]).norm() / truth[i].norm()).item()  # noqa: E731
        assert 1e-4 < err(ref) < 1e-2  # bf16 really was used
        assert err(got) <= 1.2 * err(ref)
        assert got[i].dtype == torch.float32


def test_fused_path_runs_the_head_gemm_three_times_not_four():
    """The checkpointed chunk loop recomputes each chunk's logits in the backward (4 m·h·V GEMMs in all); the
    fused loss computes dL/dh and dL/dW while the logits exist (3), with any number of chunks."""
    head, hidden, labels = _case()
    gemm = 2 * B * (T - 1) * H * V

    def flops(fuse: bool) -> int:
        with FlopCounterMode(display=False) as fc:
            loss_mod.chunked_lm_loss_sum(hidden, head, labels, _ce, 40, fuse=fuse).backward()
        return fc.get_total_flops()

    assert flops(True) == 3 * gemm
    assert flops(False) == 4 * gemm


def test_no_grad_and_biased_heads_take_the_plain_path():
    head, hidden, labels = _case()
    with torch.no_grad():
        a = loss_mod.chunked_lm_loss_sum(hidden, head, labels, _ce, 40)
    torch.testing.assert_close(a, _full_logits_loss(hidden, head, labels).detach(), rtol=1e-5, atol=1e-5)
    assert not loss_mod.fusable(torch.nn.Linear(H, V, bias=True))
    seen = []
    head.register_forward_hook(lambda *_: seen.append(1))  # a hooked head is called, so its hooks run
    loss_mod.chunked_lm_loss_sum(hidden, head, labels, _ce, 40).backward()
    assert seen
