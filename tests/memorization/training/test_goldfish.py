"""Goldfish mask: drop rate, determinism, locality of the hashed decision, label handling."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memorization.training.goldfish import (IGNORE_INDEX as IGNORE, NO_DOC, GoldfishConfig, RowContext, apply_goldfish,
                                            goldfish_mask, goldfish_mask_in_stream, hash_context)


@pytest.mark.parametrize("k", [2, 3, 4, 8, 32])
def test_drop_rate_close_to_one_over_k(k):
    g = torch.Generator().manual_seed(k)
    ids = torch.randint(0, 50000, (64, 1024), generator=g)
    h = 13
    rate = goldfish_mask(ids, k=k, h=h)[:, h:].float().mean().item()
    n = ids[:, h:].numel()
    sigma = (1 / k * (1 - 1 / k) / n) ** 0.5
    assert abs(rate - 1 / k) < 6 * sigma + 1e-3, (rate, 1 / k)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_static_drops_every_kth_position(k):
    ids = torch.randint(0, 100, (3, 40))
    m = goldfish_mask(ids, k=k, strategy="static")
    expected = (torch.arange(40) % k == k - 1).expand(3, 40)
    assert torch.equal(m, expected)


def test_same_hgram_same_decision_anywhere():
    h, k = 13, 4
    g = torch.Generator().manual_seed(0)
    hgrams = torch.randint(0, 32000, (200, h), generator=g)
    decisions = goldfish_mask(torch.cat([hgrams, torch.zeros(200, 1, dtype=torch.long)], 1), k=k, h=h)[:, h]
    # place the same h-grams at random offsets inside other random rows, in a different batch layout
    rows = torch.randint(0, 32000, (200, 300), generator=g)
    offsets = torch.randint(0, 300 - h - 1, (200,), generator=g)
    for i in range(200):
        rows[i, offsets[i] : offsets[i] + h] = hgrams[i]
    m = goldfish_mask(rows.flip(0), k=k, h=h).flip(0)  # different row order = different batch
    got = m[torch.arange(200), offsets + h]
    assert torch.equal(got, decisions)
    assert 0 < decisions.sum() < 200  # the test exercises both outcomes


def test_decision_ignores_the_predicted_token_and_tokens_outside_window():
    h, k = 5, 2
    g = torch.Generator().manual_seed(1)
    base = torch.randint(0, 1000, (1, 64), generator=g)
    m0 = goldfish_mask(base, k=k, h=h)
    t = 40
    for pos in list(range(0, t - h)) + [t]:  # before the window, and the predicted token itself
        x = base.clone()
        x[0, pos] = (x[0, pos] + 17) % 1000
        assert goldfish_mask(x, k=k, h=h)[0, t] == m0[0, t], pos
    # changing a token inside the window changes the hash
    x = base.clone()
    x[0, t - 1] += 1
    assert hash_context(x, h)[0, t] != hash_context(base, h)[0, t]


def test_hash_is_order_dependent_and_zero_safe():
    h = 4
    a = torch.tensor([[1, 2, 3, 4, 9]])
    b = torch.tensor([[2, 1, 3, 4, 9]])
    z = torch.tensor([[0, 0, 0, 0, 9]])
    z2 = torch.tensor([[0, 0, 0, 1, 9]])
    assert hash_context(a, h)[0, 4] != hash_context(b, h)[0, 4]
    assert hash_context(z, h)[0, 4] != hash_context(z2, h)[0, 4]
    assert hash_context(z, h)[0, 4] != 0


def test_short_context_and_document_boundaries_are_kept():
    h = 13
    ids = torch.randint(0, 100, (4, 100))
    m = goldfish_mask(ids, k=2, h=h)
    assert not m[:, :h].any()
    docs = torch.zeros(4, 100, dtype=torch.long)
    docs[:, 50:] = 1
    md = goldfish_mask(ids, k=2, h=h, document_ids=docs)
    assert not md[:, 50 : 50 + h].any()
    assert torch.equal(md[:, :50], m[:, :50])
    assert torch.equal(md[:, 50 + h :], m[:, 50 + h :])


def test_large_token_ids_do_not_overflow_and_are_deterministic():
    ids = torch.full((2, 30), 2**31 - 1)
    ids[1] = 128255
    a = hash_context(ids, 13)
    assert (a >= 0).all() and (a < 2**32).all()
    assert torch.equal(a, hash_context(ids.clone(), 13))


def test_apply_goldfish_keeps_ignored_labels_and_loss_is_mean_over_kept():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 64))
    labels = ids.clone()
    labels[:, :5] = -100  # a prompt
    new, frac = apply_goldfish(labels, ids, GoldfishConfig(k=3, h=4))
    assert (new[:, :5] == -100).all()
    dropped = (new == -100) & (labels != -100)
    assert torch.isclose(frac, dropped.sum() / (labels != -100).sum())
    assert dropped.any()
    all_new, frac_all = apply_goldfish(ids.clone(), ids, GoldfishConfig(k=3, h=4))  # no token predicts label 0
    assert torch.isclose(frac_all, (all_new == -100).sum() / (2 * 63)), "the rate is over the 63 predicted labels/row"
    logits = torch.randn(2, 64, 50)
    loss = F.cross_entropy(logits.view(-1, 50), new.view(-1), ignore_index=-100)
    keep = new.view(-1) != -100
    manual = F.cross_entropy(logits.view(-1, 50)[keep], new.view(-1)[keep])
    assert torch.isclose(loss, manual)


def test_standard_config_changes_nothing():
    ids = torch.randint(0, 50, (2, 20))
    new, frac = apply_goldfish(ids.clone(), ids, GoldfishConfig(k=0))
    assert torch.equal(new, ids) and float(frac) == 0.0


@pytest.mark.parametrize("k,h,strategy", [(1, 13, "hash"), (4, 0, "hash"), (4, 13, "random")])
def test_bad_settings_refused(k, h, strategy):
    with pytest.raises(ValueError):
        goldfish_mask(torch.zeros(1, 20, dtype=torch.long), k=k, h=h, strategy=strategy)


def _rows_of_stream(stream, seg, L, C, target_lens, seed=0):
    """Cut a background ``stream`` into packed rows as the mixture does: some rows start with a
    target document (its own ids) followed by background filler; returns rows, doc ids, context
    and, for every row position, its index in the stream (-1 for target tokens)."""
    import numpy as np

    from memorization.training.goldfish import NO_DOC, RowContext

    rng = np.random.default_rng(seed)
    rows, docs, cids, cdocs, starts, where = [], [], [], [], [], []
    pos = 0
    for tl in target_lens:
        row = np.empty(L, np.int64)
        d = np.empty(L, np.int32)
        w = np.full(L, -1)
        row[:tl] = rng.integers(3, 500, tl)
        d[:tl] = 0
        first = 1 if tl else 0
        fill = L - tl
        row[tl:] = stream[pos : pos + fill]
        d[tl:] = first + seg[pos : pos + fill] - seg[pos]
        w[tl:] = np.arange(pos, pos + fill)
        lo = max(pos - C, 0)
        ctx = np.zeros(C, np.int64)
        cd = np.full(C, NO_DOC, np.int32)
        ctx[C - (pos - lo):] = stream[lo:pos]
        cd[C - (pos - lo):] = first + seg[lo:pos] - seg[pos]
        rows.append(row), docs.append(d), cids.append(ctx), cdocs.append(cd), starts.append(tl), where.append(w)
        pos += fill
    t = torch.from_numpy
    return (t(np.stack(rows)), t(np.stack(docs)),
            RowContext(t(np.stack(cids)), t(np.stack(cdocs)), torch.tensor(starts)), np.stack(where))


@pytest.mark.parametrize("h", [1, 4, 13])
def test_background_labels_get_their_stream_decision_wherever_rows_are_cut(h):
    """With the row context, a background token's drop decision is the one it has in the stream
    itself (documents respected), also in the first h positions of a row or of a row's filler;
    target documents keep their own in-row decisions; the drop rate is 1/k, not less."""
    import numpy as np

    from memorization.training.goldfish import apply_goldfish, goldfish_mask, goldfish_mask_in_stream

    rng = np.random.default_rng(1)
    doc_lens = rng.integers(5, 90, 400)
    stream = rng.integers(3, 500, int(doc_lens.sum()))
    seg = np.repeat(np.arange(len(doc_lens)), doc_lens).astype(np.int32)
    L, C, k = 64, 32, 4
    target_lens = [0, 20, 0, 0, 64, 7, 0, 33] * 30
    rows, docs, ctx, where = _rows_of_stream(stream, seg, L, C, target_lens)
    want_stream = goldfish_mask(torch.from_numpy(stream)[None], k, h, document_ids=torch.from_numpy(seg)[None])[0]
    got = goldfish_mask_in_stream(rows, docs, ctx, k, h)
    bg = torch.from_numpy(where >= 0)
    assert torch.equal(got[bg], want_stream[torch.from_numpy(where[where >= 0])])
    in_row = goldfish_mask(rows, k, h, document_ids=docs)
    assert torch.equal(got[~bg], in_row[~bg])  # targets: unchanged (they start a document)
    assert torch.equal(got & ~in_row, got ^ in_row)  # context only adds drops, at row starts
    if h == 13:  # without context 13 of each row's positions could never drop
        rate_ctx, rate_row = got[bg].float().mean(), in_row[bg].float().mean()
        assert abs(rate_ctx - want_stream.float().mean()) < 0.01 and rate_row < rate_ctx - 0.02
    labels, frac = apply_goldfish(rows.clone(), rows, GoldfishConfig(k=k, h=h), docs, ctx)
    assert torch.equal(labels == -100, got)


def test_huge_k_does_not_overflow_and_usual_k_decide_as_before():
    """drop <=> hash * k < 2^32; computing hash * k in int64 wraps for k >= 2^31 and then drops ~half."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50000, (16, 512), generator=g)
    assert goldfish_mask(ids, k=2**33, h=13).float().mean().item() < 1e-3
    hashed = hash_context(ids, 13)
    for k in (2, 3, 4, 7, 8, 32, 128, 2**31 - 1):
        want = (hashed * k < 2**32) & (torch.arange(512) >= 13)
        assert torch.equal(goldfish_mask(ids, k=k, h=13), want), k


def _background_rows(stream, seg, L, C):
    """Background-only rows cut from ``stream``, each with the ``C`` stream tokens before it."""
    rows, docs, cids, cdocs = [], [], [], []
    for pos in range(0, len(stream) - L + 1, L):
        rows.append(stream[pos : pos + L]), docs.append(seg[pos : pos + L] - seg[pos])
        lo = max(pos - C, 0)
        ctx, cd = np.zeros(C, np.int64), np.full(C, NO_DOC, np.int32)
        ctx[C - (pos - lo):], cd[C - (pos - lo):] = stream[lo:pos], seg[lo:pos] - seg[pos]
        cids.append(ctx), cdocs.append(cd)
    t = torch.from_numpy
    n = len(rows)
    return (t(np.stack(rows)), t(np.stack(docs).astype(np.int32)),
            RowContext(t(np.stack(cids)), t(np.stack(cdocs)), torch.zeros(n, dtype=torch.long)))


@pytest.mark.parametrize("h", [64, 65, 100])
def test_in_stream_mask_is_the_stream_mask_or_refuses_a_too_wide_h(h):
    """A row context of C tokens decides every background label as the stream does for h <= C; for h > C
    the first h - C labels of each row cannot be decided (they were silently kept: at h = 100, C = 64
    the background drop rate fell from 21% to 18%), so the mask refuses instead of diverging."""
    rng = np.random.default_rng(1)
    doc_lens = rng.integers(300, 900, 40)
    stream = rng.integers(3, 500, int(doc_lens.sum()))
    seg = np.repeat(np.arange(len(doc_lens)), doc_lens).astype(np.int32)
    L, C = 256, 64
    rows, docs, ctx = _background_rows(stream, seg, L, C)
    if h > C:
        with pytest.raises(ValueError, match=r"h=\d+ needs the \d+ stream tokens.*holds only 64"):
            goldfish_mask_in_stream(rows, docs, ctx, 4, h)
        return
    n = rows.numel()
    want = goldfish_mask(torch.from_numpy(stream[:n])[None], 4, h, document_ids=torch.from_numpy(seg[:n])[None])[0]
    assert torch.equal(goldfish_mask_in_stream(rows, docs, ctx, 4, h).reshape(-1), want)


def test_stream_mask_without_document_ids_is_a_clear_error():
    """apply_goldfish with a row context needs the rows' document ids: without them it says so, not an
    AttributeError on None deep inside the rotation."""
    from memorization.training.goldfish import GoldfishConfig, apply_goldfish

    rows = torch.randint(3, 100, (2, 32))
    ctx = RowContext(torch.zeros(2, 16, dtype=torch.long), torch.full((2, 16), NO_DOC, dtype=torch.int32),
                     torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids"):
        apply_goldfish(rows.clone(), rows, GoldfishConfig(k=4, h=4), None, ctx)


def _packed(seed=0, B=32, T=96, max_doc=40):
    """Random rows packed with documents of 1..max_doc tokens (contiguous document ids)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 5000, (B, T), generator=g)
    lens = torch.randint(1, max_doc + 1, (B, T), generator=g)
    docs = torch.zeros(B, T, dtype=torch.int32)
    for r in range(B):
        t, d = 0, 0
        while t < T:
            n = int(lens[r, t])
            docs[r, t : t + n] = d
            t, d = t + n, d + 1
    return ids, docs


@pytest.mark.parametrize("doc_start", ["stream", "static"])
def test_doc_start_decides_only_the_labels_without_h_tokens_of_their_document(doc_start):
    """Labels with h tokens of their own document before them are decided by the hash in every mode; the others
    are kept (keep), hashed across the document boundary (stream: the row's hash without document ids), or
    dropped at every k-th position of their document (static)."""
    from memorization.training.goldfish import position_in_document

    k, h = 4, 13
    ids, docs = _packed()
    pos = position_in_document(ids, docs)
    inside = pos >= h
    keep = goldfish_mask(ids, k, h, document_ids=docs)
    got = goldfish_mask(ids, k, h, document_ids=docs, doc_start=doc_start)
    assert torch.equal(got[inside], keep[inside]) and not keep[~inside].any()
    if doc_start == "stream":
        assert torch.equal(got, goldfish_mask(ids, k, h))  # one stream: boundaries of documents do not count
    else:
        assert torch.equal(got[~inside], (pos % k == k - 1)[~inside])
    assert got[~inside].any()  # document openings are no longer always supervised


def test_static_doc_start_protects_short_documents_and_restores_the_drop_rate():
    """Documents of at most h tokens get no drop under keep; under static they lose 1/k of their labels, and the
    overall drop rate is back near 1/k (keep: far below it when documents are short)."""
    k, h = 4, 13
    ids, docs = _packed(seed=1, B=64, T=128, max_doc=24)
    rates = {m: float(goldfish_mask(ids, k, h, document_ids=docs, doc_start=m).float().mean())
             for m in ("keep", "static")}
    assert rates["keep"] < 0.1 and rates["static"] > 0.2, rates  # (a document of < k tokens has no k-th position)
    short, short_docs = _packed(seed=2, B=16, T=64, max_doc=h)
    assert not goldfish_mask(short, k, h, document_ids=short_docs).any()
    assert goldfish_mask(short, k, h, document_ids=short_docs, doc_start="static").float().mean() > 0.15


def test_stream_doc_start_hashes_across_documents_but_not_before_a_target_or_the_stream():
    """In packed rows with their stream context, stream mode gives every background label the decision the stream
    has when hashed as one text (document boundaries ignored), except the stream's first h positions, which
    nothing precedes; a target's first h labels are kept, as nothing of the stream precedes a target."""
    from memorization.training.goldfish import position_in_document

    rng = np.random.default_rng(3)
    doc_lens = rng.integers(3, 40, 600)
    stream = rng.integers(3, 500, int(doc_lens.sum()))
    seg = np.repeat(np.arange(len(doc_lens)), doc_lens).astype(np.int32)
    L, C, k, h = 64, 32, 4, 13
    rows, docs, ctx, where = _rows_of_stream(stream, seg, L, C, [0, 20, 0, 33, 0, 0] * 30)
    got = goldfish_mask_in_stream(rows, docs, ctx, k, h, doc_start="stream")
    want = goldfish_mask(torch.from_numpy(stream)[None], k, h)[0]  # no document ids: one text
    bg = torch.from_numpy(where >= 0)
    assert torch.equal(got[bg], want[torch.from_numpy(where[where >= 0])])
    target_start = ~bg & (position_in_document(rows, docs) < h)
    assert target_start.any() and not got[target_start].any()


def test_equal_tokens_control_drops_as_many_labels_per_row_at_positions_that_change_with_the_row():
    """The randomized mask drops exactly the Goldfish count of each row's labels (so both arms train on the same
    number of labels every step), never an ignored label or label 0, the same for the same row of the stream;
    the same text in two rows gets two different masks (Goldfish: the same mask)."""
    from memorization.training.goldfish import matched_random_mask

    k, h = 4, 13
    ids, docs = _packed(seed=4, B=8, T=96)
    ids = torch.cat([ids, ids])  # every text twice, in rows 0..7 and 8..15
    docs = torch.cat([docs, docs])
    labels = ids.clone()
    labels[:, 90:] = IGNORE  # padding: never dropped, never counted
    gold, gold_frac = apply_goldfish(labels.clone(), ids, GoldfishConfig(k=k, h=h), docs)
    cfg = GoldfishConfig(k=k, h=h, randomize=True)
    rand, rand_frac = apply_goldfish(labels.clone(), ids, cfg, docs, row_index=torch.arange(100, 116))
    assert torch.equal((gold == IGNORE).sum(1), (rand == IGNORE).sum(1)) and gold_frac == rand_frac
    assert (rand[:, 90:] == IGNORE).all() and (rand[:, 0] != IGNORE).all()
    assert torch.equal(gold[:8], gold[8:]) and not torch.equal(rand[:8], rand[8:])
    again, _ = apply_goldfish(labels.clone(), ids, cfg, docs, row_index=torch.arange(100, 116))
    assert torch.equal(again, rand)
    drawn = matched_random_mask(torch.ones(4, 50, dtype=torch.bool), torch.ones(4, 50, dtype=torch.bool),
                                torch.arange(4))
    assert drawn.all()  # as many as asked, even all of them
    with pytest.raises(ValueError, match="row_index"):
        apply_goldfish(labels.clone(), ids, cfg, docs)
