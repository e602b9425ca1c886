"""Review of the trainer (memorization/train.py): streams of other integer dtypes train and validate, bad streams and
settings are refused before any work, Goldfish accumulation weights every kept label of the global batch equally."""
import pytest
import torch
import torch.nn.functional as F

from memorization.goldfish import IGNORE_INDEX, GoldfishConfig, RowContext, apply_goldfish
from memorization.models import build_model
from memorization.train import TrainConfig, Trainer

V = 512


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _rows(n_rows: int = 16, L: int = 32) -> torch.Tensor:
    return torch.randint(3, V, (n_rows, L), generator=torch.Generator().manual_seed(0))


def _trainer(tmp, rows=None, docs=None, val=None, row_context=None, **kw) -> Trainer:
    rows = _rows() if rows is None else rows
    docs = torch.zeros(rows.shape, dtype=torch.int32) if docs is None else docs
    cfg = TrainConfig(**{"batch_size": 4, "steps": 2, "warmup_steps": 1, "checkpoint_every": 0, "progress": False,
                         "lr": 1e-2, **kw})
    return Trainer(build_model("tiny", V, seed=0), rows, docs, rows[:4] if val is None else val, cfg, tmp,
                   row_context=row_context)


def test_an_int32_stream_trains_and_validates_like_int64(tmp_path):
    """A pre-tokenized stream kept in int32 (half the host memory) used to train every step, then crash at the final
    validation (F.cross_entropy wants int64 targets), before the last checkpoint and train_result.json."""
    rows = _rows()
    ref = _trainer(tmp_path / "a", rows=rows).fit()
    got = _trainer(tmp_path / "b", rows=rows.int()).fit()
    assert [h["loss"] for h in got["history"]] == pytest.approx([h["loss"] for h in ref["history"]], rel=1e-6)
    assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)
    assert (tmp_path / "b" / "train_result.json").exists()


@pytest.mark.parametrize("case,match", [
    ("doc_ids_shape", r"doc_ids has shape \(5, 32\), the rows \(16, 32\)"),
    ("rows_out_of_vocab", r"rows hold token ids in \[3, 1023\], outside the model's vocabulary \[0, 512\)"),
    ("val_out_of_vocab", r"val_rows hold token ids in \[-1, "),
    ("float_rows", r"rows must hold integer token ids .* got torch.float32"),
    ("negative_steps", r"steps=-1 \(must be None or >= 0"),
])
def test_bad_streams_and_step_counts_are_refused_before_any_work(tmp_path, case, match):
    """Each used to pass the constructor and fail later with an unclear error: doc_ids of another shape at the first
    checkpoint (IndexError) or the first Goldfish step (a broadcast error); out-of-vocabulary ids at the first step
    (on a GPU a device-side assert), or, in the held-out rows, only at the validation after the whole run;
    steps=-1 with an IndexError after writing a step-0 checkpoint."""
    rows = _rows()
    kw = {"doc_ids_shape": {"docs": torch.zeros((5, 32), dtype=torch.int32)},
          "rows_out_of_vocab": {"rows": torch.cat([rows[:-1], torch.full((1, 32), 2 * V - 1)])},
          "val_out_of_vocab": {"val": torch.cat([rows[:3], torch.full((1, 32), -1)])},
          "float_rows": {"rows": rows.float()},
          "negative_steps": {"steps": -1}}[case]
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, **kw)
    assert not any(tmp_path.iterdir())


def test_goldfish_wider_than_the_row_context_is_refused_up_front(tmp_path):
    """h > the context's C tokens used to fail only inside the first training step (after wandb and the resume)."""
    rows = _rows()
    ctx = RowContext(torch.zeros((len(rows), 4), dtype=torch.long), torch.zeros((len(rows), 4), dtype=torch.int32),
                     torch.zeros(len(rows), dtype=torch.long))
    with pytest.raises(ValueError, match="goldfish h=13 needs the 13 stream tokens .* holds only 4"):
        _trainer(tmp_path, row_context=ctx, goldfish=GoldfishConfig(k=4, h=13))
    assert not any(tmp_path.iterdir())


def test_goldfish_accumulation_weights_every_kept_label_of_the_global_batch_equally(tmp_path):
    """(Coverage, no fix.) With k = 2 the rows keep different numbers of labels; one row per micro-batch must still
    give the mean over the global batch's kept labels (not a mean of per-micro-batch means): the first step's loss
    and grad norm equal a plain HF forward's, and the curve equals the one-forward step's."""
    rows, gf = _rows(), GoldfishConfig(k=2, h=2)
    docs = torch.zeros(rows.shape, dtype=torch.int32)
    labels, _ = apply_goldfish(rows[:4].clone(), rows[:4], gf, docs[:4])
    kept = (labels[:, 1:] != IGNORE_INDEX).sum(1)
    assert len(set(kept.tolist())) > 1  # uneven micro-batches
    model = build_model("tiny", V, seed=0)
    logits = model(input_ids=rows[:4]).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    curves = [_trainer(tmp_path / str(m), micro_batch=m, goldfish=gf).fit()["history"] for m in (1, 4)]
    assert curves[0][0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert curves[0][0]["grad_norm"] == pytest.approx(norm.item(), rel=1e-4)
    assert [h["loss"] for h in curves[0]] == pytest.approx([h["loss"] for h in curves[1]], rel=1e-5)


def test_the_stream_check_reads_no_values_of_fake_tensors():
    """memory_trace builds the trainer under FakeTensorMode (shapes, no values): the range check must stand aside
    there, and still refuse what the shapes and dtypes alone show."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memorization.train import _check_stream

    with FakeTensorMode(allow_non_fake_inputs=True):
        rows = torch.randint(3, V, (8, 16))
        _check_stream(rows, torch.zeros((8, 16), dtype=torch.int32), rows[:2], V)  # no DataDependentOutputException
        with pytest.raises(ValueError, match="doc_ids has shape"):
            _check_stream(rows, torch.zeros((8,), dtype=torch.int32), rows[:2], V)


class _TwoReplicas:
    """Rank ``rank`` of a data grid of 2 replicas, simulated in one process over the real 1-rank runtime ``rt``:
    its batch slice is its half, and its all-reduce adds ``other`` (the other rank's local sums), keeping its own."""

    def __init__(self, rt, rank: int, other: torch.Tensor | None = None):
        self.rt, self.rank, self.other, self.local = rt, rank, other, None

    def __getattr__(self, name):
        return getattr(self.rt, name)

    replicas = 2

    def local_batch_rows(self, batch: int) -> int:
        return batch // 2

    def batch_slice(self, t: torch.Tensor) -> torch.Tensor:
        assert len(t) % 2 == 0, "axonn.batch_slice refuses an uneven split"
        return t.chunk(2)[self.rank]

    def all_reduce_batch(self, t: torch.Tensor) -> None:
        self.local = t.clone()
        if self.other is not None:
            t += self.other


@pytest.mark.parametrize("n_val", [1, 3])
def test_validation_measures_the_same_rows_on_any_grid(tmp_path, n_val):
    """The held-out rows used to be cut to a multiple of data x depth: 19 rows (the built-in corpus at --seq-len 512)
    were 18 on 2 replicas and 16 on 4, so val_loss changed with the grid (also on a resume onto another grid), and
    fewer rows than replicas (4 rows at --seq-len 2048 on 8 GPUs) were refused with no CLI flag to fix it. Now the
    rows are padded with ignored copies: 2 replicas give the serial val_loss over all n_val rows."""
    rows = _rows()
    from memorization.runtime import Runtime

    serial = _trainer(tmp_path / "s", val=rows[:n_val], eval_rows=n_val)
    ref = serial.validate()
    rt = Runtime.create()
    r1 = _TwoReplicas(rt, 1)
    t = Trainer(build_model("tiny", V, seed=0), rows, torch.zeros(rows.shape, dtype=torch.int32), rows[:n_val],
                TrainConfig(batch_size=4, steps=2, warmup_steps=1, checkpoint_every=0, progress=False, eval_rows=n_val),
                tmp_path / "g", runtime=r1)
    t.validate()  # rank 1's share
    t.rt = _TwoReplicas(rt, 0, other=r1.local)
    # other batch splits: per-row GEMMs and the sum over ~100 token losses in another order (fp32, ≤ 100·2^-24)
    assert t.validate() == pytest.approx(ref, rel=1e-5)
    assert r1.local[1] == (n_val // 2) * (rows.shape[1] - 1)  # rank 1 scored its real rows only, not the padding
