"""Memorization during training: the tracked labels are split by the mask each target gets in its training rows,
the losses are the model's, and the trainer tracks on schedule without changing the training."""
import pytest
import torch
import torch.nn.functional as F

from memorization.training.goldfish import IGNORE_INDEX, GoldfishConfig, apply_goldfish
from memorization.data.mixture import MixtureConfig, build_mixture
from memorization.training.models import build_model
from memorization.training.tracking import goldfish_label_masks, target_losses, tracked_targets


@pytest.mark.parametrize("gf", [GoldfishConfig(k=3, h=4), GoldfishConfig(k=3, h=4, doc_start="static"),
                                GoldfishConfig(k=3, h=4, doc_start="stream"), GoldfishConfig(k=3, strategy="static")],
                         ids=["keep", "doc-static", "doc-stream", "static"])
def test_tracked_split_is_the_mask_every_exposure_of_the_target_trains_with(tokenizer, corpus, gf):
    """For every exposure of every target, the labels the trainer drops inside the target (its row, hashed with
    the row's stream context as in training) are exactly the ones goldfish_label_masks calls dropped."""
    mix = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=128, batch_size=4, exposures=(3,),
                                                               num_targets=5, num_nonmembers=2, seed=2))
    for t in mix.targets:
        ids = torch.tensor(t["token_ids"])[None]
        kept, dropped = goldfish_label_masks(ids, torch.tensor([ids.shape[1]]), gf)
        assert kept.sum() + dropped.sum() == ids.shape[1] - 1 and dropped.any()
        for r in t["rows"]:
            row = mix.input_ids[r : r + 1]
            ctx = mix.row_context.rows(slice(r, r + 1))
            labels, _ = apply_goldfish(row.clone(), row, gf, mix.doc_ids[r : r + 1], ctx)
            trained_drop = labels[0, 1 : ids.shape[1]] == IGNORE_INDEX
            assert torch.equal(trained_drop, dropped[0, 1:]), (t["id"], r)


def test_target_losses_are_the_models_mean_token_losses():
    """target, kept and dropped losses equal the mean -log p of those labels computed from the full logits;
    the standard loss (k = 0) has no dropped labels (None)."""
    torch.manual_seed(0)
    model = build_model("tiny", 300, seed=0)
    g = torch.Generator().manual_seed(1)
    targets = [{"id": str(i), "token_ids": [1] + torch.randint(3, 300, (n,), generator=g).tolist()}
               for i, n in enumerate([30, 17, 41])]
    gf = GoldfishConfig(k=3, h=4)
    got = target_losses(model, targets, gf, torch.device("cpu"), batch_size=2)
    sums = {"all": [0.0, 0], "kept": [0.0, 0], "dropped": [0.0, 0]}
    for t in targets:
        ids = torch.tensor(t["token_ids"])[None]
        with torch.no_grad():
            logp = F.log_softmax(model(ids).logits.float(), -1)[0, :-1].gather(1, ids[0, 1:, None])[:, 0]
        kept, dropped = goldfish_label_masks(ids, torch.tensor([ids.shape[1]]), gf)
        for name, m in (("all", kept | dropped), ("kept", kept), ("dropped", dropped)):
            sums[name][0] -= float(logp[m[0, 1:]].sum())
            sums[name][1] += int(m.sum())
    for key, name in (("target_loss", "all"), ("kept_loss", "kept"), ("dropped_loss", "dropped")):
        assert got[key] == pytest.approx(sums[name][0] / sums[name][1], rel=1e-5)
    assert target_losses(model, targets, GoldfishConfig(k=0), torch.device("cpu"))["dropped_loss"] is None
    assert model.training  # left as it was found


def test_tracked_targets_are_a_fixed_sample_of_the_trained_ones():
    targets = [{"id": str(i), "exposures": i % 3} for i in range(30)]
    assert [t["id"] for t in tracked_targets(targets)] == [str(i) for i in range(30) if i % 3]
    five = tracked_targets(targets, 5, seed=1)
    assert len(five) == 5 and all(t["exposures"] for t in five) and five == tracked_targets(targets, 5, seed=1)
    assert five != tracked_targets(targets, 5, seed=2)
