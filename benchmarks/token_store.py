#!/usr/bin/env python
"""Token store: preparation throughput, and a rank's resident memory training on a 10M vs a >= 100M-token store.

1. Preparation: a synthetic corpus (random words, ``--prepare-tokens`` tokens) is prepared with
   ``prepare_store`` (``datasets.map`` with ``--num-proc`` processes, then the mixture and the arrays):
   tokens/s of the tokenization alone and of the whole preparation.
2. Training memory: from that store two larger stores are written with ``write_store`` (its rows tiled:
   synthetic, but real token ids), of ``--small-tokens`` and ``--big-tokens`` tokens.  Each is trained for
   ``--steps`` steps of the tiny model with Goldfish (k=4) in a fresh process (one rank), which reports its
   resident memory after start-up, its peak (VmHWM) and its steady RSS after the steps; ``--eager`` also
   runs each with the whole stream read into memory first, as an in-memory mixture holds it.  The store's
   memory must be flat: the same for both sizes.

    python benchmarks/token_store.py                 # ~5 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import HelpFormatter  # noqa: E402

SEQ, BATCH = 128, 4


def synthetic_corpus(path: Path, tokens: int, seed: int = 0) -> None:
    """A jsonl of documents of random lowercase words (~2.5 tokens a word with the default tokenizer)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(20000)]
    n_docs = max(200, tokens // 600)
    with open(path, "w") as f:
        for _ in range(n_docs):
            f.write(json.dumps({"text": " ".join(rng.choice(words, int(rng.integers(150, 330))))}) + "\n")


class Tiled:
    """Rows of ``base`` repeated to ``n`` rows (``len``, ``shape``, ``[a:b]``): write_store's input."""

    def __init__(self, base, n: int):
        self.base, self.n = base, n
        self.shape = (n, *tuple(base.shape[1:]))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, sl: slice):
        import numpy as np

        lo, hi, _ = sl.indices(self.n)
        return np.asarray(self.base)[np.arange(lo, hi) % len(self.base)]


def grown_store(src: Path, out: Path, tokens: int) -> Path:
    """A store of ``tokens`` tokens (whole steps) whose rows are those of the store ``src``, tiled."""
    from memorization.training.goldfish import RowContext
    from memorization.data.token_store import open_store, store_info, write_store

    m, info = open_store(src), store_info(src)
    n = -(-tokens // (SEQ * BATCH)) * BATCH
    c = m.row_context
    m.input_ids, m.doc_ids = Tiled(m.input_ids[:], n), Tiled(m.doc_ids[:], n)
    m.row_context = RowContext(Tiled(c.ids[:], n), Tiled(c.doc_ids[:], n), Tiled(c.start[:], n))
    keys = ("corpus", "corpus_key", "text_field", "corpus_fingerprint", "corpus_sha256", "tokenizer",
            "tokenizer_sha256", "targets", "targets_fingerprint")
    identity = {**{k: info[k] for k in keys}, "command": f"(synthetic: {src} tiled to {n} rows)"}
    return write_store(out, m, identity, vocab_size=info["vocab_size"], overwrite=True)


def train_child(store: str, steps: int, eager: bool) -> dict:
    """One rank: open ``store``, train ``steps`` steps, return its memory (MiB)."""
    import psutil
    import torch

    from memorization.training.goldfish import GoldfishConfig
    from memorization.training.models import build_model
    from memorization.data.token_store import open_store
    from memorization.training.train import TrainConfig, Trainer

    def rss() -> float:
        return psutil.Process().memory_info().rss / 2**20

    def hwm() -> float:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) / 1024

    torch.set_num_threads(1)
    model = build_model("tiny", 4096, seed=0)
    start = rss()
    m = open_store(store)
    rows, docs, ctx = m.input_ids, m.doc_ids, m.row_context
    if eager:  # as an in-memory mixture holds it
        from memorization.training.goldfish import RowContext

        rows, docs, ctx = rows[:], docs[:], RowContext(ctx.ids[:], ctx.doc_ids[:], ctx.start[:])
    cfg = TrainConfig(batch_size=BATCH, lr=3e-3, warmup_steps=2, steps=steps, checkpoint_every=0, eval_rows=8,
                      progress=False, goldfish=GoldfishConfig(k=4, h=13))
    out = tempfile.mkdtemp(prefix="token-store-bench-")
    t = Trainer(model, rows, docs, m.val_ids, cfg, out, run_name="bench", row_context=ctx)
    t0 = time.perf_counter()
    for _ in range(steps):
        t.train_step()
    seconds = time.perf_counter() - t0
    _ = t.stream_fingerprint  # what the first checkpoint reads
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens": len(m.input_ids) * SEQ, "start_mib": start, "peak_mib": hwm(), "steady_mib": rss(),
            "step_s": seconds / steps}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--prepare-tokens", type=int, default=4_000_000, help="tokens of the synthetic corpus prepared")
    p.add_argument("--num-proc", type=int, default=2, help="tokenizing processes (datasets.map num_proc)")
    p.add_argument("--small-tokens", type=int, default=10_000_000, help="tokens of the smaller training store")
    p.add_argument("--big-tokens", type=int, default=102_400_000, help="tokens of the larger training store")
    p.add_argument("--steps", type=int, default=5, help="training steps measured on each store")
    p.add_argument("--eager", action="store_true", help="also train each store read whole into memory first")
    p.add_argument("--work", help="scratch directory (default: a temporary one, removed at the end)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    if args.child:
        store, eager = args.child.rsplit(":", 1)
        print(json.dumps(train_child(store, args.steps, eager == "1")))
        return
    from memorization.data.corpus import load_tokenizer
    from memorization.data.mixture import MixtureConfig
    from memorization.data.token_store import prepare_store, store_info, tokenize_corpus

    work = Path(args.work or tempfile.mkdtemp(prefix="token-store-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        corpus = work / "corpus.jsonl"
        synthetic_corpus(corpus, args.prepare_tokens)
        from memorization.data.corpus import load_documents

        docs, tok = load_documents(str(corpus)), load_tokenizer()
        t0 = time.perf_counter()
        ids = tokenize_corpus(docs, tok, num_proc=args.num_proc, work_dir=work / "tok")
        t_tok = time.perf_counter() - t0
        n_tok = sum(len(x) for x in ids)
        del ids, docs
        cfg = MixtureConfig(seq_len=SEQ, batch_size=BATCH, exposures=(64,), num_targets=32, num_nonmembers=32,
                            min_target_tokens=100)
        t0 = time.perf_counter()
        src = prepare_store(str(corpus), "builtin:bpe4096", cfg, work / "prepared", num_proc=args.num_proc,
                            tokenizer_obj=tok)
        t_prep = time.perf_counter() - t0
        held = store_info(src)["num_rows"] * SEQ
        print(f"preparation ({args.num_proc} processes): corpus {n_tok:,} tokens; tokenizing {t_tok:.1f} s = "
              f"{n_tok / t_tok:,.0f} tokens/s; whole prepare_store (load, tokenize, mixture, write) {t_prep:.1f} s = "
              f"{n_tok / t_prep:,.0f} corpus tokens/s; store {held:,} tokens", flush=True)
        rows = []
        for name, tokens in (("small", args.small_tokens), ("big", args.big_tokens)):
            t0 = time.perf_counter()
            store = grown_store(src, work / name, tokens)
            size = sum(f.stat().st_size for f in store.iterdir()) / 2**20
            print(f"wrote the {name} store ({tokens:,} tokens, {size:,.0f} MiB) in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            for eager in ((False, True) if args.eager else (False,)):
                res = subprocess.run([sys.executable, __file__, "--steps", str(args.steps),
                                      "--child", f"{store}:{int(eager)}"], capture_output=True, text=True)
                if res.returncode:
                    raise SystemExit(res.stderr)
                r = json.loads(res.stdout.strip().splitlines()[-1])
                rows.append((name, "whole stream in memory" if eager else "store (memory-mapped)", r, size))
                print(f"  {rows[-1][1]}: {r}", flush=True)
        print("\n| store | tokens | files MiB | how | RSS after start-up MiB | peak RSS MiB | steady RSS MiB | "
              "peak - start MiB | s/step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, how, r, size in rows:
            print(f"| {name} | {r['tokens']:,} | {size:,.0f} | {how} | {r['start_mib']:.0f} | {r['peak_mib']:.0f} | "
                  f"{r['steady_mib']:.0f} | {r['peak_mib'] - r['start_mib']:.0f} | {r['step_s']:.2f} |")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
