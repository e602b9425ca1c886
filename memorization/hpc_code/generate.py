"""Sampling completions from a local Hugging Face checkpoint (never the Hub), in one process or on a 4D grid.

Prompts are completed as raw text (code models, ParEval style).  Each (prompt, sample) pair is one row; rows are
decoded in batches with a KV cache (:meth:`memorization.lm.LM.generate_until`), and a batch stops once every
row's function is complete (closing brace for C, a top-level stop sequence for Python) or has ended with the
end-of-text token, which also bounds the cost of runaway generations.

A row's draws depend on the seed, its prompt and its sample number alone: at each step the next token is
``argmax(logits / T + g)`` over the nucleus (the most likely tokens whose probabilities sum to ``top_p``, as
``transformers``' top-p warper keeps them), with Gumbel noise ``g`` from a generator seeded by
``(seed, crc32(prompt), sample)`` and advanced once per step.  So a sample is the same whatever batch it shares
and on any grid: with ``grid`` the rows are split over its data x depth replicas
(:meth:`memorization.lm.LM.generate_until`) and decoded by the model sharded as in training, and every rank
returns every completion -- those one process samples.  A row's text ends at the token where it was complete
(or before its end-of-text token), however long the rest of its batch ran.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Callable

import torch

from memorization.hpc_code.extract import PYTHON_STOP, c_body_closed


def python_done(text: str) -> bool:
    return any(s in text for s in PYTHON_STOP)


class HFSampler:
    """Temperature / top-p sampling from a local checkpoint directory, in one process or on ``grid``
    (``"D,R,C,Z"``, under torchrun/mpiexec/srun: the model built sharded from an HF directory or a training
    checkpoint), through :class:`memorization.lm.LM` (:meth:`~memorization.lm.LM.load`,
    :meth:`~memorization.lm.LM.generate_until`)."""

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 grid: str | None = None):
        from memorization.lm import LM

        self.seed = seed
        # one process: the directory checked first (a damaged one is one line naming the file), then model and
        # tokenizer; on a grid: each rank reads its own shards
        self.lm = LM.load(model_path, device=device, dtype=dtype, grid=grid or None, require_tokenizer=True)
        self.model, self.tok, self.grid = self.lm.model, self.lm.tokenizer, self.lm.grid

    @torch.inference_mode()
    def sample(
        self,
        prompts: list[str],
        n: int,
        *,
        temperature: float = 0.2,
        top_p: float = 0.95,
        max_new_tokens: int = 1024,
        batch_size: int = 8,
        is_done: Callable[[str], bool] = c_body_closed,
        progress: bool = True,
    ) -> list[list[str]]:
        """``n`` raw continuations per prompt (greedy, and one copy, when temperature == 0)."""
        from memorization.lm import Sampling, row_seed

        n = n if temperature > 0 else 1  # greedy decoding: n copies would be n identical texts
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        ids = [self.tok(p).input_ids for p in prompts]
        keys = [zlib.crc32(p.encode()) for p in prompts]
        eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (eos or 0)

        def until(tokens: list[int]) -> int | None:
            """Done at an end-of-text token (dropped) or once the text is a complete function (kept)."""
            if eos is not None and tokens[-1] == eos:
                return len(tokens) - 1
            return len(tokens) if is_done(self.tok.decode(tokens, skip_special_tokens=True)) else None

        sampling = Sampling(temperature, top_p=top_p, noise_on_cpu=True) if temperature > 0 else None
        out = self.lm.generate_until([ids[i] for i, _ in rows], max_new_tokens, until=until, sampling=sampling,
                                     seeds=[row_seed(self.seed, keys[i], j) for i, j in rows],
                                     batch_size=batch_size, pad_id=pad, progress=progress)
        texts: list[list[str]] = [[] for _ in prompts]
        for (i, _), toks in zip(rows, out):
            texts[i].append(self.tok.decode(toks, skip_special_tokens=True))
        return texts
