"""The prepared token store: the same mixture as build_mixture, the same training, read lazily, refused when
it does not match the run."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from memorization.data.corpus import DEFAULT_CORPUS, DEFAULT_TOKENIZER, corpus_fingerprint, data_checksums
from memorization.training.goldfish import GoldfishConfig
from memorization.data.mixture import MixtureConfig, build_mixture
from memorization.training.models import build_model
from memorization.data.token_store import (STORE_FILE, StoreError, StoreMismatch, open_store, prepare_store,
                                           store_info)
from memorization.training.train import TrainConfig, Trainer
from tests.support import REPO

CFG = MixtureConfig(seq_len=128, batch_size=4, exposures=(8,), num_targets=8, num_nonmembers=8, num_steps=200,
                    min_target_tokens=100, seed=3)
ARRAYS = ("input_ids", "doc_ids", "context_ids", "context_doc_ids", "context_start", "val_ids", "val_doc_ids")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same store prepared with one and with two tokenizing processes."""
    root = tmp_path_factory.mktemp("stores")
    return {n: prepare_store(DEFAULT_CORPUS, DEFAULT_TOKENIZER, CFG, root / f"np{n}", num_proc=n) for n in (1, 2)}


@pytest.fixture(scope="module")
def reference(corpus, tokenizer):
    meta = {"corpus": DEFAULT_CORPUS, "tokenizer": DEFAULT_TOKENIZER, "corpus_fingerprint": corpus_fingerprint(corpus),
            **data_checksums(DEFAULT_CORPUS, tokenizer)}
    return build_mixture(corpus, tokenizer, CFG, meta=meta)


def _arrays(m):
    c = m.row_context
    return dict(zip(ARRAYS, (m.input_ids[:], m.doc_ids[:], c.ids[:], c.doc_ids[:], c.start[:], m.val_ids,
                             m.val_doc_ids)))


def test_store_holds_exactly_the_mixture_build_mixture_makes(stores, reference, tokenizer):
    got = open_store(stores[1], corpus=DEFAULT_CORPUS, tokenizer=tokenizer, config=CFG)
    ref, new = _arrays(reference), _arrays(got)
    for name in ARRAYS:
        assert new[name].dtype == ref[name].dtype and torch.equal(new[name], ref[name]), name
    assert got.num_steps == reference.num_steps == 200
    assert json.dumps(got.manifest(), sort_keys=True) == json.dumps(reference.manifest(), sort_keys=True)
    info = store_info(stores[1])
    assert info["arrays"]["input_ids"]["dtype"] == "<u2"  # a 4,096-token vocabulary fits uint16
    assert info["token_range"] == [int(ref["input_ids"].min()), int(ref["input_ids"].max())]


def test_two_tokenizing_processes_write_the_same_store(stores):
    a, b = (Path(stores[n]) for n in (1, 2))
    for f in sorted(p.name for p in a.iterdir()):
        if f != STORE_FILE:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ha, hb = (json.loads((d / STORE_FILE).read_text()) for d in (a, b))
    assert {k: v for k, v in ha.items() if k != "command"} == {k: v for k, v in hb.items() if k != "command"}


def _train(mixture, tmp, steps=6, vocab=4096):
    cfg = TrainConfig(batch_size=4, micro_batch=2, lr=3e-3, warmup_steps=2, steps=steps, checkpoint_every=0,
                      eval_rows=8, progress=False, goldfish=GoldfishConfig(k=4, h=13))
    t = Trainer(build_model("tiny", vocab, seed=0), mixture.input_ids, mixture.doc_ids, mixture.val_ids, cfg, tmp,
                run_name="t", row_context=mixture.row_context)
    return t, t.fit()


def test_training_from_the_store_follows_the_in_memory_loss_curve(stores, reference, tmp_path):
    t_ref, ref = _train(reference, tmp_path / "mem", steps=4)
    t_new, new = _train(open_store(stores[1]), tmp_path / "store", steps=4)
    keys = ("loss", "grad_norm", "goldfish_drop_frac")
    assert [[h[k] for k in keys] for h in new["history"]] == [[h[k] for k in keys] for h in ref["history"]]
    assert new["val_loss"] == ref["val_loss"]
    assert t_new.stream_fingerprint == t_ref.stream_fingerprint  # a checkpoint resumes across the two


@pytest.fixture
def store_copy(stores, tmp_path):
    import shutil

    return Path(shutil.copytree(stores[1], tmp_path / "copy"))


def test_construction_and_training_read_only_the_rows_of_the_steps_taken(store_copy, reference, tmp_path):
    """Every row after the first 3 steps is overwritten with a token id outside the vocabulary (the recorded
    range kept): a trainer that scanned the stream would refuse it, one that read later rows would fail."""
    info = json.loads((store_copy / STORE_FILE).read_text())
    rows = np.memmap(store_copy / "input_ids.bin", np.uint16, "r+", shape=tuple(info["arrays"]["input_ids"]["shape"]))
    rows[3 * 4 :] = 65535
    rows.flush()
    del rows
    _, new = _train(open_store(store_copy), tmp_path / "store", steps=3)
    _, ref = _train(reference, tmp_path / "mem", steps=3)
    assert [h["loss"] for h in new["history"]] == [h["loss"] for h in ref["history"]]


def _grow(store: Path, n_rows: int) -> None:
    """Make ``store`` hold ``n_rows`` rows: the arrays are extended with zeros (sparse files, nothing written)."""
    info = json.loads((store / STORE_FILE).read_text())
    for name in ("input_ids", "doc_ids", "context_ids", "context_doc_ids", "context_start"):
        a = info["arrays"][name]
        a["shape"][0] = n_rows
        a["bytes"] = int(np.prod(a["shape"])) * np.dtype(a["dtype"]).itemsize
        os.truncate(store / a["file"], a["bytes"])
    info["num_rows"], info["num_steps"] = n_rows, n_rows // info["config"]["batch_size"]
    (store / STORE_FILE).write_text(json.dumps(info))


def _peak_rss_during(fn) -> int:
    """The growth of this process's peak resident memory (VmHWM, reset first) while ``fn`` runs, in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS

    def hwm() -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) * 1024

    before = hwm()
    fn()
    return hwm() - before


_MEASURE = """
import json, sys
from pathlib import Path
from memorization.data.token_store import open_store
from tests.memorization.data.test_token_store import _peak_rss_during, _train
tmp, grew = Path(sys.argv[1]), {}
for name in ("warm-up", "small", "big"):  # (the first run's allocations stay)
    store = tmp / ("big" if name == "big" else "small")
    grew[name] = _peak_rss_during(lambda: _train(open_store(store), tmp / f"run-{name}", steps=3))
print(json.dumps(grew))
"""


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
def test_resident_memory_does_not_grow_with_the_store(stores, tmp_path):
    """A store of 1M rows (128M tokens: 256 MiB of token ids, 1 GiB as int64) trains in the memory of one
    of 200 steps: construction, 3 Goldfish steps and the checkpoint's stream fingerprint.  Measured in a fresh
    process, so what the test session allocated and freed before cannot hide or add growth."""
    import shutil
    import subprocess
    import sys

    small, big = (Path(shutil.copytree(stores[1], tmp_path / n)) for n in ("small", "big"))
    _grow(big, 1 << 20)
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    grew = json.loads(out.stdout.strip().splitlines()[-1])
    assert grew["big"] < grew["small"] + 48 * 2**20, grew  # reading it all would take 256 MiB, as int64 1 GiB


def test_a_store_of_other_data_or_settings_is_refused_naming_the_difference(stores, tokenizer, tmp_path):
    from dataclasses import replace

    from memorization.data.corpus import load_tokenizer, train_bpe_tokenizer

    path = stores[1]
    other_tok = load_tokenizer(str(train_bpe_tokenizer(["some other text " * 20, "more words here"], 300,
                                                       tmp_path / "tok")))
    other_corpus = tmp_path / "c.jsonl"
    other_corpus.write_text(json.dumps({"text": "a document"}) + "\n")
    cases = [
        (dict(tokenizer=other_tok), "tokenizer 'builtin:bpe4096'"),
        (dict(corpus=str(other_corpus)), "corpus 'builtin:pydocs', this run names"),
        (dict(config=CFG, target_texts=["my own target document " * 30]), "targets drawn from the corpus"),
        (dict(config=replace(CFG, seed=4)), "--seed 3, this run asks 4"),
        (dict(config=replace(CFG, exposures=(4,))), "--exposures 8, this run asks 4"),
    ]
    for kw, match in cases:
        with pytest.raises(StoreMismatch, match=match) as e:
            open_store(path, **{"corpus": DEFAULT_CORPUS, "tokenizer": tokenizer, "config": CFG, **kw})
        assert "python data/prepare.py" in str(e.value) and f"--out {path} --overwrite" in str(e.value)
    with pytest.raises(StoreMismatch, match=r"holds 200 steps of 4 rows x 128 tokens \(102,400 tokens\); 500 steps "
                                            r"need 256,000 tokens.*--steps 500"):
        open_store(path, corpus=DEFAULT_CORPUS, tokenizer=tokenizer, config=replace(CFG, num_steps=500))
    assert open_store(path, corpus=DEFAULT_CORPUS, tokenizer=tokenizer, config=CFG).num_steps == 200


def test_a_changed_local_corpus_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, 150))}) + "\n" for _ in range(60)))
    cfg = MixtureConfig(seq_len=64, batch_size=2, exposures=(2,), num_targets=2, num_nonmembers=2, val_docs=2,
                        min_target_tokens=20)
    path = prepare_store(str(corpus), DEFAULT_TOKENIZER, cfg, tmp_path / "store")
    from memorization.data.corpus import load_tokenizer

    tok = load_tokenizer()
    assert open_store(path, corpus=str(corpus), tokenizer=tok, config=cfg).num_steps > 0
    with corpus.open("a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    with pytest.raises(StoreMismatch, match="it changed since"):
        open_store(path, corpus=str(corpus), tokenizer=tok, config=cfg)


def test_an_unfinished_or_damaged_store_is_refused(store_copy, tmp_path):
    """A missing, truncated or unfinished store is refused; the hint names the directory given (not where the store
    was prepared) and --overwrite."""
    with pytest.raises(StoreError, match="does not exist"):
        open_store(tmp_path / "nowhere")
    os.truncate(store_copy / "doc_ids.bin", 1000)
    with pytest.raises(StoreError, match=rf"damaged or incomplete; prepare it again: python data/prepare.py .*"
                                         rf"--out {store_copy} --overwrite$"):
        open_store(store_copy)
    (store_copy / STORE_FILE).unlink()
    with pytest.raises(StoreError, match="unfinished"):
        open_store(store_copy)


def test_the_recorded_token_range_is_checked_against_the_model(stores, tmp_path):
    with pytest.raises(ValueError, match=r"rows hold token ids in \[0, 4095\], outside the model.s vocabulary"):
        _train(open_store(stores[1]), tmp_path, vocab=1000)


def test_an_existing_store_is_kept_unless_overwrite(stores, tmp_path):
    with pytest.raises(StoreError, match="--overwrite"):
        prepare_store(DEFAULT_CORPUS, DEFAULT_TOKENIZER, CFG, stores[1])


# ---- the experiment on a store: data/prepare.py --config, then memorize --store ----------------------------

RUN_YAML = """\
data: {num_targets: 2, num_nonmembers: 2, exposures: "2", seq_len: 64, store: STORE}
training: {steps: 6, checkpoint_every: 0}
goldfish: {arms: standard}
extraction: {prefix: 10, suffix: 10, batch: 4}
output: {no_progress: true}
"""


def _script(name: str):
    import importlib.util

    path = REPO / name
    spec = importlib.util.spec_from_file_location(path.stem + "_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_on_the_store_its_config_prepares_equals_the_run_that_prepares_into_the_cache(tmp_path, monkeypatch):
    """`data/prepare.py --config run.yaml` prepares the store the config's run names; memorize on it trains and
    extracts exactly as the same run without --store, which prepares the same store into the cache on first
    use (same rows: the same computation), and records the same data checksums in its manifest."""
    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path / "cache"))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(RUN_YAML.replace("STORE", str(tmp_path / "store")))
    _script("data/prepare.py").main(["--config", str(cfg)])
    memorize = _script("recipes/memorize.py")
    on_store = memorize.main(["--config", str(cfg), "--out", str(tmp_path / "a")])
    cached = memorize.main(["--config", str(cfg), "--store", "", "--out", str(tmp_path / "b")])
    a, b = on_store["arms"]["standard"], cached["arms"]["standard"]
    for key in ("loss_curve", "val_loss", "exact_by_target", "token_match", "rouge_l"):
        assert a[key] == b[key], key
    man = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("a", "b")]
    for key in ("targets", "nonmembers", "corpus_fingerprint", "corpus_sha256", "tokenizer_sha256"):
        assert man[0][key] == man[1][key], key
    (made,) = (tmp_path / "cache" / "stores").iterdir()
    for f in ("input_ids.bin", "context_ids.bin", "manifest.json"):  # the explicit store's bytes
        assert (made / f).read_bytes() == (tmp_path / "store" / f).read_bytes(), f


def test_the_cache_prepares_a_store_once_per_data_and_settings(tmp_path, monkeypatch, tokenizer, capsys):
    """A second run of the same data tokenizes nothing (the cached store is opened, not rewritten); another
    mixture setting, other targets or an edited local corpus each name another store; a cache directory left
    without its store.json is prepared again."""
    from memorization.data.token_store import cached_store_path, ensure_cached_store

    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    rng = np.random.default_rng(0)
    docs = [{"text": f"document {i}: " + " ".join(f"w{w}" for w in rng.integers(0, 5000, 60))} for i in range(300)]
    corpus.write_text("\n".join(json.dumps(d) for d in docs))
    cfg = MixtureConfig(seq_len=64, batch_size=2, exposures=(2,), num_targets=2, num_nonmembers=2, num_steps=8,
                        min_target_tokens=20, seed=0)
    path, made = ensure_cached_store(str(corpus), DEFAULT_TOKENIZER, cfg, tokenizer)
    assert made and (path / STORE_FILE).exists()
    stamp = (path / STORE_FILE).stat().st_mtime_ns
    assert ensure_cached_store(str(corpus), DEFAULT_TOKENIZER, cfg, tokenizer) == (path, False)
    assert (path / STORE_FILE).stat().st_mtime_ns == stamp
    others = {cached_store_path(str(corpus), tokenizer, MixtureConfig(**{**cfg.__dict__, "seed": 1})),
              cached_store_path(str(corpus), tokenizer, cfg, target_texts=["a target " * 30])}
    corpus.write_text(corpus.read_text() + "\n" + json.dumps({"text": "one more document " * 20}))
    others.add(cached_store_path(str(corpus), tokenizer, cfg))
    assert path not in others and len(others) == 3
    (path / STORE_FILE).unlink()  # a store without its completion marker is not used: prepared afresh
    corpus.write_text("\n".join(json.dumps(d) for d in docs))
    assert ensure_cached_store(str(corpus), DEFAULT_TOKENIZER, cfg, tokenizer) == (path, True)
    open_store(path, corpus=str(corpus), tokenizer=tokenizer, config=cfg)


def test_a_run_whose_corpus_cannot_fill_its_steps_is_refused_by_the_cache_before_training(tmp_path, monkeypatch):
    from memorization.experiment import Data, ExperimentConfig, Output, Training, run_experiment

    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "small.txt"
    rng = np.random.default_rng(1)
    corpus.write_text("\n\n".join(" ".join(f"w{w}" for w in rng.integers(0, 5000, 150)) for _ in range(30)))
    cfg = ExperimentConfig(data=Data(corpus=str(corpus), seq_len=128, num_targets=2, num_nonmembers=2),
                           training=Training(steps=5000, batch_size=8),
                           output=Output(out=str(tmp_path / "run"), no_progress=True))
    with pytest.raises(SystemExit, match=r"error: --corpus .*small\.txt: .*too small"):
        run_experiment(cfg)
    assert not (tmp_path / "run").exists() and not list((tmp_path / "cache" / "stores").glob("*/store.json"))


def test_a_run_whose_store_is_missing_or_of_other_settings_is_refused_with_the_prepare_command(tmp_path):
    from memorization.experiment.config import ConfigError

    cfg = tmp_path / "run.yaml"
    cfg.write_text(RUN_YAML.replace("STORE", str(tmp_path / "store")))
    memorize = _script("recipes/memorize.py")
    with pytest.raises(ConfigError, match=r"--store .*store does not exist: prepare it with `python data/prepare.py"):
        memorize.main(["--config", str(cfg), "--out", str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()
    _script("data/prepare.py").main(["--config", str(cfg)])
    with pytest.raises(SystemExit, match=r"error: --store: .*exposures.*python data/prepare\.py .*--exposures 3"):
        memorize.main(["--config", str(cfg), "--exposures", "3", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"--config decides the store's data and mixture; drop --seq-len"):
        _script("data/prepare.py").main(["--config", str(cfg), "--seq-len", "128", "--out", str(tmp_path / "s2")])


@pytest.mark.parametrize("damage", ["xor-every-token", "one-token-65535"])
def test_a_store_whose_bytes_changed_is_refused_naming_the_file_and_the_rebuild(store_copy, damage):
    """Tokens changed in place (sizes the same, so the size check passes): every token XOR-ed with 0xA5 (all still
    inside the vocabulary: it would train on other tokens), or one set to 65535 (an IndexError mid-run). Opening
    with verify refuses it, naming input_ids.bin and the prepare command with this --out and --overwrite."""
    from memorization.data.token_store import verify_store

    assert verify_store(store_copy) is True
    f = store_copy / "input_ids.bin"
    ids = np.fromfile(f, np.uint16)
    if damage == "xor-every-token":
        ids ^= 0xA5
        assert ids.max() < 4096
    else:
        ids[len(ids) // 2] = 65535
    ids.tofile(f)
    open_store(store_copy)  # (without verify: only the header and the sizes are checked)
    with pytest.raises(StoreError, match=rf"token store {store_copy}: input_ids.bin is damaged \(the crc32 of its "
                                         rf"bytes 0\.\.\d+ is not the one recorded when it was written\): prepare it "
                                         rf"again: python data/prepare.py .*--out {store_copy} --overwrite$"):
        open_store(store_copy, verify=True)


@pytest.mark.slow
def test_a_run_on_a_damaged_store_is_refused_before_training(tmp_path):
    """memorize --store on a store whose tokens were changed after it was prepared: one line naming the file and
    the command that rebuilds the store, nothing trained."""
    cfg = tmp_path / "run.yaml"
    store = tmp_path / "store"
    cfg.write_text(RUN_YAML.replace("STORE", str(store)))
    _script("data/prepare.py").main(["--config", str(cfg)])
    moved = tmp_path / "moved"
    store.rename(moved)  # the hint names the store where it is now
    f = moved / "input_ids.bin"
    ids = np.fromfile(f, np.uint16)
    ids ^= 0xA5
    ids.tofile(f)
    with pytest.raises(SystemExit, match=rf"error: --store: token store {moved}: input_ids.bin is damaged .* "
                                         rf"--out {moved} --overwrite$"):
        _script("recipes/memorize.py").main(["--config", str(cfg), "--store", str(moved),
                                             "--out", str(tmp_path / "a")])
    assert not (tmp_path / "a" / "standard").exists()


def test_a_store_with_ids_beyond_the_tokenizer_is_refused(stores, tokenizer, tmp_path):
    """The token range store.json records is checked against the run's tokenizer's vocabulary."""
    import shutil

    copy = Path(shutil.copytree(stores[1], tmp_path / "c"))
    head = json.loads((copy / STORE_FILE).read_text())
    head["token_range"][1] = len(tokenizer)
    (copy / STORE_FILE).write_text(json.dumps(head))
    with pytest.raises(StoreMismatch, match=rf"token ids up to {len(tokenizer)}, beyond this run's tokenizer's "):
        open_store(copy, tokenizer=tokenizer)


def test_work_directories_of_a_killed_preparation_are_removed_by_the_next(tmp_path):
    """A preparation killed with SIGKILL leaves its .tokenize-<host>-<pid>-* directory (corpus-sized) behind; the
    next preparation beside it removes it, and leaves those of a live process alone."""
    import socket
    import subprocess

    from memorization.data.token_store import remove_stale_work_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname().replace("-", "_")
    stale = tmp_path / f".tokenize-{host}-{dead.pid}-abc"
    live = tmp_path / f".tokenize-{host}-{os.getppid()}-def"
    other_host = tmp_path / f".tokenize-elsewhere-{dead.pid}-ghi"
    for d in (stale, live, other_host):
        (d / "sub").mkdir(parents=True)
    remove_stale_work_dirs(tmp_path, ".tokenize-")
    assert not stale.exists() and live.exists() and other_host.exists()


def test_an_impossible_row_length_is_refused_before_tokenizing():
    """seq_len 100000000000 was refused only after the whole corpus was tokenized."""
    with pytest.raises(ValueError, match=r"seq_len=100,000,000,000 exceeds 1,048,576 tokens a row"):
        MixtureConfig(seq_len=100_000_000_000)
