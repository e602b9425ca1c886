"""The single-exposure mixture: exact exposure counts, unsplit targets, manifest ground truth."""
import json

import pytest
import torch

from memorization.data.mixture import MixtureConfig, _place_exposures, build_mixture, load_manifest


def _contains_row_start(rows: torch.Tensor, tok: list[int]) -> torch.Tensor:
    t = torch.tensor(tok)
    return (rows[:, : len(t)] == t).all(1)


@pytest.mark.parametrize("exposures", [(1,), (3,), (0, 1, 4)])
def test_every_target_appears_exactly_n_times(tokenizer, corpus, exposures):
    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=exposures, num_targets=9, num_nonmembers=4,
                        val_docs=8, seed=3)
    mix = build_mixture(corpus[:600], tokenizer, cfg)
    rows = mix.input_ids
    assert rows.shape[1] == 128 and len(rows) % 8 == 0
    for j, t in enumerate(mix.targets):
        assert t["exposures"] == exposures[j % len(exposures)]
        tok = t["token_ids"] + [tokenizer.eos_token_id]
        hits = _contains_row_start(rows, tok).nonzero().flatten().tolist()
        assert hits == t["rows"] and len(hits) == t["exposures"]  # whole, never split, exactly n rows
        assert t["steps"] == sorted(r // 8 for r in hits)
        assert len(set(t["steps"])) == len(t["steps"])  # each exposure its own optimizer step
        # the target never occurs anywhere else in the stream (e.g. split across a row boundary)
        flat = rows.flatten()
        window = torch.tensor(t["token_ids"][1:40])
        occ = (flat.unfold(0, len(window), 1) == window).all(1).sum().item()
        assert occ == t["exposures"]


def test_targets_nonmembers_and_background_are_disjoint(tokenizer, corpus):
    mix = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=128, batch_size=8, num_targets=6, exposures=(2,),
                                                         num_nonmembers=6, seed=1))
    ids = {t["id"] for t in mix.targets}
    non = {t["id"] for t in mix.nonmembers}
    assert not ids & non
    flat = mix.input_ids.flatten()
    for d in mix.nonmembers:  # a non-member never enters the training stream
        w = torch.tensor(d["token_ids"][1:30])
        assert not (flat.unfold(0, len(w), 1) == w).all(1).any()


def test_mixture_is_deterministic_in_seed(tokenizer, corpus):
    cfg = MixtureConfig(seq_len=128, batch_size=8, num_targets=4, exposures=(2,), num_nonmembers=2)
    a, b = build_mixture(corpus[:600], tokenizer, cfg), build_mixture(corpus[:600], tokenizer, cfg)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.doc_ids, b.doc_ids)
    c = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=128, batch_size=8, num_targets=4, exposures=(2,),
                                                       num_nonmembers=2, seed=1))
    assert not torch.equal(a.input_ids, c.input_ids)


def test_doc_ids_mark_target_and_filler(tokenizer, corpus):
    mix = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=256, batch_size=4, num_targets=3, exposures=(1,),
                                                         num_nonmembers=1))
    for t in mix.targets:
        r = t["rows"][0]
        n = len(t["token_ids"]) + 1
        assert (mix.doc_ids[r, :n] == 0).all() and (mix.doc_ids[r, n:] >= 1).all()


def test_manifest_roundtrip(tmp_path, tokenizer, corpus):
    mix = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=128, batch_size=8, num_targets=3, exposures=(2,),
                                                         num_nonmembers=2))
    mix.save_manifest(tmp_path / "m.json")
    m = load_manifest(tmp_path / "m.json")
    assert m["num_steps"] == mix.num_steps and len(m["targets"]) == 3
    assert m["targets"][0]["token_ids"] == mix.targets[0]["token_ids"]
    assert json.loads((tmp_path / "m.json").read_text())["version"] == 1


def test_short_user_targets_are_refused_or_skipped(tokenizer, corpus):
    long = " ".join(f"word{i}" for i in range(200))
    short = "too short"
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(1,), num_nonmembers=2, min_target_tokens=100)
    with pytest.raises(ValueError, match="shorter than prefix"):
        build_mixture(corpus[:600], tokenizer, cfg, target_texts=[long, short])
    cfg.skip_short_targets = True
    mix = build_mixture(corpus[:600], tokenizer, cfg, target_texts=[long, short])
    assert len(mix.targets) == 1 and mix.meta["skipped_short_targets"] == ["user-00001"]
    with pytest.raises(ValueError, match="empty"):
        build_mixture(corpus[:600], tokenizer, cfg, target_texts=[])


def test_a_too_small_corpus_and_negative_exposures_are_refused(tokenizer, corpus):
    with pytest.raises(ValueError, match="corpus too small"):
        build_mixture(corpus[:150], tokenizer, MixtureConfig(seq_len=128, batch_size=8, num_targets=4,
                                                              num_nonmembers=2, num_steps=10_000))
    with pytest.raises(ValueError, match=">= 0"):
        MixtureConfig(exposures=(-1,))


def test_near_duplicates_of_targets_are_kept_out_of_training(tokenizer, corpus):
    target = " ".join(f"token{i} alpha{i % 7}" for i in range(120))
    leaky = "Some preamble that differs. " + target[: len(target) // 2] + " and then other text."
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(1,), num_nonmembers=2, min_target_tokens=100)
    mix = build_mixture(list(corpus[:400]) + [leaky], tokenizer, cfg, target_texts=[target])
    assert mix.meta["documents_dropped_as_near_duplicates"] >= 1
    flat = mix.input_ids.flatten()
    w = torch.tensor(mix.targets[0]["token_ids"][5:45])
    assert (flat.unfold(0, len(w), 1) == w).all(1).sum().item() == 1  # only its own single exposure


def test_user_targets_without_exposure0_warn_that_nonmembers_are_background(tokenizer, corpus):
    import warnings

    texts = [" ".join(f"word{i} user{j}" for i in range(120)) for j in range(4)]
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(2,), num_nonmembers=2, min_target_tokens=100)
    with pytest.warns(UserWarning, match=r"background corpus.*--exposures 0,N"):
        mix = build_mixture(corpus[:600], tokenizer, cfg, target_texts=texts)
    assert mix.manifest()["targets_source"] == "user"
    # with exposure-0 targets (held-out user documents) there is nothing to warn about
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(0, 2), num_nonmembers=2, min_target_tokens=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mix = build_mixture(corpus[:600], tokenizer, cfg, target_texts=texts)
    assert [t["exposures"] for t in mix.targets] == [0, 2, 0, 2]
    assert all(t["rows"] == [] for t in mix.targets if t["exposures"] == 0)
    corpus_mix = build_mixture(corpus[:600], tokenizer, MixtureConfig(seq_len=128, batch_size=8, num_targets=2,
                                                                      exposures=(1,), num_nonmembers=2))
    assert corpus_mix.manifest()["targets_source"] == "corpus"


def test_background_too_small_for_the_target_rows_is_a_clear_error(tokenizer, corpus):
    # 8 targets x 4 exposures = 32 rows = 4 whole steps, but the 12-document background cannot
    # fill up the 412 tokens each 100-token target row leaves free
    cfg = MixtureConfig(seq_len=512, max_target_tokens=100, batch_size=8, exposures=(4,), num_targets=8,
                        num_nonmembers=2, val_docs=0)
    with pytest.raises(ValueError, match=r"corpus too small: .*background tokens.*larger --corpus, fewer "
                                         r"targets/exposures, or fewer --steps"):
        build_mixture(corpus[:12], tokenizer, cfg)
    # the same targets with enough background build, and every row is full
    mix = build_mixture(corpus[:600], tokenizer, cfg)
    assert mix.input_ids.shape[1] == 512 and mix.meta["background_tokens_used"] > 0


@pytest.mark.parametrize("h", [4, 13])
def test_goldfish_decides_background_labels_as_in_the_stream(tokenizer, corpus, h):
    """The mixture's row context makes each background label's Goldfish decision the one it has
    in the background stream itself, including the first h labels of a row and of the filler after
    a target, so the drop rate is 1/k (at L = 128 and h = 13 it was ~21% for k = 4 without)."""
    from memorization.training.goldfish import GoldfishConfig, apply_goldfish, goldfish_mask

    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=(2,), num_targets=6, num_nonmembers=2, seed=2)
    mix = build_mixture(corpus[:600], tokenizer, cfg)
    rows, docs, ctx = mix.input_ids, mix.doc_ids, mix.row_context
    # the rows consume the background stream in order: their background parts, concatenated, are it
    bg_parts = [rows[r, int(ctx.start[r]):] for r in range(len(rows))]
    stream = torch.cat(bg_parts)
    eos = tokenizer.eos_token_id
    stream_docs = torch.cat([torch.zeros(1, dtype=torch.long), (stream[:-1] == eos).long().cumsum(0)])
    want = goldfish_mask(stream[None], 4, h, document_ids=stream_docs[None])[0]
    labels, _ = apply_goldfish(rows.clone(), rows, GoldfishConfig(k=4, h=h), docs, ctx)
    got = torch.cat([(labels == -100)[r, int(ctx.start[r]):] for r in range(len(rows))])
    assert torch.equal(got, want)
    no_ctx, _ = apply_goldfish(rows.clone(), rows, GoldfishConfig(k=4, h=h), docs)
    assert (no_ctx == -100).sum() < (labels == -100).sum()  # without the context, row starts never drop
    assert abs(got.float().mean().item() - 0.25) < 0.02


def _shares_span(a: list[int], b: list[int], n: int = 32) -> bool:
    from memorization.data.mixture import _overlapping

    return bool(_overlapping([a], [b], n))


def test_targets_and_nonmembers_share_no_span_with_each_other(tokenizer, corpus):
    """Every corpus document has a near-copy: a target copied by another target would be seen more often
    than recorded (a held-out exposure-0 one seen at all), a non-member copying a target would be a member."""
    base = [d for d in corpus[:400]]
    docs = base + [d + "\n\nSee also the reference manual." for d in base]
    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=(0, 1), num_targets=30, num_nonmembers=20, seed=0)
    mix = build_mixture(docs, tokenizer, cfg)
    picked = [t["token_ids"] for t in mix.targets] + [d["token_ids"] for d in mix.nonmembers]
    for i in range(len(picked)):
        for j in range(i + 1, len(picked)):
            assert not _shares_span(picked[i], picked[j]), (i, j)
    flat = mix.input_ids.flatten()
    for t in mix.targets:
        if t["exposures"] == 0:  # held out: no copy of it in the stream, through another target either
            w = torch.tensor(t["token_ids"][5:40])
            assert not (flat.unfold(0, len(w), 1) == w).all(1).any()


def test_user_targets_from_the_corpus_are_never_nonmembers(tokenizer, corpus):
    docs = list(corpus[:600])
    targets = docs[:120:2]  # the user's documents are corpus documents
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(2,), num_nonmembers=40, min_target_tokens=100,
                        skip_short_targets=True, skip_overlapping_targets=True, seed=0)  # the corpus has copies
    with pytest.warns(UserWarning):
        mix = build_mixture(docs, tokenizer, cfg, target_texts=targets)
    assert len(mix.nonmembers) == 40
    for d in mix.nonmembers:
        assert d["text"] not in targets
        assert not any(_shares_span(d["token_ids"], t["token_ids"]) for t in mix.targets)
    with pytest.raises(ValueError, match="non-members"):  # too few left: a clear error, not fewer non-members
        build_mixture(docs[:80], tokenizer, MixtureConfig(seq_len=512, batch_size=8, exposures=(0, 2),
                                                          num_nonmembers=70, min_target_tokens=100,
                                                          skip_short_targets=True, skip_overlapping_targets=True),
                      target_texts=targets)


def test_more_target_rows_than_steps_is_a_clear_error(tokenizer, corpus):
    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=(4,), num_targets=9, num_nonmembers=2, num_steps=2)
    with pytest.raises(ValueError, match=r"2 steps of 8 rows hold 16 rows, fewer than the 36 target rows.*--steps"):
        build_mixture(corpus[:600], tokenizer, cfg)


@pytest.mark.parametrize("kw", [dict(num_nonmembers=-1), dict(val_docs=-1), dict(batch_size=0), dict(num_steps=0),
                                dict(num_steps=-3)])
def test_bad_mixture_settings_refused(kw):
    with pytest.raises(ValueError):
        MixtureConfig(**kw)


def _check_placement(slots: list[int], exposures: list[int], n_steps: int, batch: int) -> None:
    assert len(slots) == n_steps * batch
    for j, n in enumerate(exposures):
        steps = [r // batch for r, x in enumerate(slots) if x == j]
        assert len(steps) == n and len(set(steps)) == n, (j, steps)
    assert slots.count(-1) == n_steps * batch - sum(exposures)


def test_exposures_fall_in_different_steps_even_when_the_steps_are_nearly_full():
    import random

    # 3 targets x 2 exposures in 3 steps of 2 rows: only {0,1},{1,2},{0,2} works; a random draw
    # that gives two targets the same pair of steps must be repaired, for every seed
    for seed in range(50):
        _check_placement(_place_exposures([2, 2, 2], 3, 2, random.Random(seed)), [2, 2, 2], 3, 2)
    # random feasible problems, built from a random placement: every step full or nearly so
    g = random.Random(1)
    for _ in range(200):
        n_steps, batch, n_targets = g.randint(1, 12), g.randint(1, 6), g.randint(1, 20)
        exposures = [0] * n_targets
        for st in range(n_steps):
            for j in g.sample(range(n_targets), min(batch, n_targets)):
                exposures[j] += g.random() < 0.95
        if max(exposures) == 0:
            continue
        _check_placement(_place_exposures(exposures, n_steps, batch, g), exposures, n_steps, batch)


def test_exposure_placement_is_spread_over_steps_and_rows():
    import random

    slots = _place_exposures([8] * 50, 100, 8, random.Random(0))
    rows = [r for r, x in enumerate(slots) if x >= 0]
    assert len({r % 8 for r in rows}) == 8  # any row of a step, not always the first
    per_step = [sum(x >= 0 for x in slots[i * 8:(i + 1) * 8]) for i in range(100)]
    assert max(per_step) >= 6 and min(per_step) <= 2  # drawn, not dealt round-robin


def test_more_exposures_than_steps_is_a_clear_error(tokenizer, corpus):
    import random

    with pytest.raises(ValueError, match=r"seen 5 times needs 5 different optimizer steps.*has 4.*--steps"):
        _place_exposures([5, 1], 4, 8, random.Random(0))
    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=(6,), num_targets=2, num_nonmembers=2, num_steps=4)
    with pytest.raises(ValueError, match=r"6 different optimizer steps, but the stream has 4"):
        build_mixture(corpus[:600], tokenizer, cfg)


def test_user_targets_sharing_a_span_are_refused_or_skipped(tokenizer, corpus):
    words = [f"word{i}" for i in range(400)]
    a, b = " ".join(words[:150]), " ".join(words[200:350])
    copy_of_a = "a new opening line. " + " ".join(words[40:190])  # shares ~110 words with a
    cfg = MixtureConfig(seq_len=512, batch_size=8, exposures=(1,), num_nonmembers=2, min_target_tokens=100)
    with pytest.raises(ValueError, match=r"1 target\(s\) share a 32-token span.*target #2 with #0.*--skip-overlapping"):
        build_mixture(corpus[:600], tokenizer, cfg, target_texts=[a, b, copy_of_a])
    cfg.skip_overlapping_targets = True
    mix = build_mixture(corpus[:600], tokenizer, cfg, target_texts=[a, b, copy_of_a])
    assert [t["id"] for t in mix.targets] == ["user-00000", "user-00001"]
    assert mix.meta["skipped_overlapping_targets"] == ["user-00002"]
    rows = mix.input_ids.flatten()
    window = torch.tensor(mix.targets[0]["token_ids"][60:100])
    assert (rows.unfold(0, len(window), 1) == window).all(1).sum().item() == 1  # a seen once, its copy never


@pytest.mark.parametrize("placement", ["spaced", "last"])
def test_planned_placements_keep_every_exposure_in_its_own_step(placement):
    """spaced and last place exactly n exposures per target, each in a different step, at most ``batch`` a step,
    also when the steps are nearly full (a wanted step that is full gives way to the nearest free one)."""
    import random

    g = random.Random(2)
    for _ in range(100):
        n_steps, batch = g.randint(1, 12), g.randint(1, 6)
        exposures = [g.randint(0, n_steps) for _ in range(g.randint(1, max(1, n_steps * batch // max(1, n_steps))))]
        if max(exposures) == 0 or sum(exposures) > n_steps * batch:
            continue
        _check_placement(_place_exposures(exposures, n_steps, batch, g, placement), exposures, n_steps, batch)


def test_spaced_placement_spreads_each_target_evenly_over_the_run():
    """A target seen n times in N steps has its exposures about N/n apart (here never a gap over 2N/n)."""
    import numpy as np

    from memorization.data.mixture import exposure_steps

    N = 400
    exposures = [1, 2, 4, 8, 16] * 6
    steps = exposure_steps(exposures, N, 4, np.random.default_rng(0), "spaced")
    for n, s in zip(exposures, steps):
        gaps = np.diff(np.concatenate([s, [s[0] + N]]))  # the wrap-around gap counts too
        assert len(s) == n and gaps.max() <= 2 * N / n and gaps.min() >= N / n / 2, (n, s)


def test_last_placement_makes_recency_independent_of_the_exposure_count():
    """Random placement: targets seen more often were last seen more recently (the confound). last: every
    target's last exposure is in the run's final ceil(T / batch) steps, whatever its count, and the earlier ones
    spread evenly over the run."""
    import numpy as np

    from memorization.data.mixture import exposure_steps

    N, batch, exposures = 200, 4, [1, 4, 16] * 10
    since = {}
    for placement in ("random", "last"):
        steps = exposure_steps(exposures, N, batch, np.random.default_rng(0), placement)
        since[placement] = {n: [N - 1 - int(s.max()) for e, s in zip(exposures, steps) if e == n] for n in (1, 4, 16)}
    assert np.mean(since["random"][1]) > 4 * np.mean(since["random"][16])  # confounded
    window = -(-len(exposures) // batch)
    assert all(0 <= d < window for v in since["last"].values() for d in v)
    steps = exposure_steps(exposures, N, batch, np.random.default_rng(0), "last")
    sixteen = [s for e, s in zip(exposures, steps) if e == 16]
    assert all(s.min() < 2 * N / 16 for s in sixteen)  # the first exposure near the start, not bunched at the end


def test_placement_is_recorded_and_a_store_of_another_placement_is_refused(tokenizer, corpus, tmp_path):
    """The manifest's config records the placement; a token store prepared with another one is refused, naming
    --placement; the default placement keeps the stores' cache key of before it existed."""
    from memorization.data.token_store import StoreMismatch, check_store, config_dict

    cfg = MixtureConfig(seq_len=128, batch_size=8, exposures=(2,), num_targets=4, num_nonmembers=2, seed=1,
                        placement="last")
    mix = build_mixture(corpus[:600], tokenizer, cfg)
    assert mix.manifest()["config"]["placement"] == "last"
    assert "placement" not in config_dict(MixtureConfig()) and config_dict(cfg)["placement"] == "last"
    header = {"config": config_dict(MixtureConfig(seq_len=128, batch_size=8, exposures=(2,), num_targets=4,
                                                  num_nonmembers=2, seed=1)),
              "corpus": "c", "tokenizer": "t", "targets_fingerprint": None, "num_steps": mix.num_steps,
              "seq_len": 128}
    with pytest.raises(StoreMismatch, match="--placement random, this run asks last"):
        check_store(header, tmp_path, config=cfg)
    with pytest.raises(ValueError, match="placement 'recent' unknown"):
        MixtureConfig(placement="recent")
