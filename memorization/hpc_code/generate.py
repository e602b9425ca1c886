"""Sampling completions from a local Hugging Face checkpoint (never the Hub), in one process or on a 4D grid.

Prompts are completed as raw text (code models, ParEval style).  Each (prompt, sample) pair is one row; rows are
decoded in batches with a KV cache (:func:`memorization.extraction.greedy_continue`), and a batch stops once every
row's function is complete (closing brace for C, a top-level stop sequence for Python) or has ended with the
end-of-text token, which also bounds the cost of runaway generations.

A row's draws depend on the seed, its prompt and its sample number alone: at each step the next token is
``argmax(logits / T + g)`` over the nucleus (the most likely tokens whose probabilities sum to ``top_p``, as
``transformers``' top-p warper keeps them), with Gumbel noise ``g`` from a generator seeded by
``(seed, crc32(prompt), sample)`` and advanced once per step.  So a sample is the same whatever batch it shares
and on any grid: with ``grid`` the rows are split over its data x depth replicas
(:func:`memorization.runtime.map_over_replicas`) and decoded by the model sharded as in training, and every rank
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


def nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scores`` (``(rows, V)`` logits / T) with every token outside the top-p nucleus set to -inf: a token is kept
    when the probability of the tokens more likely than it is below ``top_p`` (the most likely one always)."""
    if top_p >= 1.0:
        return scores
    probs, order = scores.softmax(-1).sort(dim=-1, descending=True)
    before = probs.cumsum(-1) - probs
    drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before > top_p)
    return scores.masked_fill(drop, float("-inf"))


class HFSampler:
    """Temperature / top-p sampling from a local checkpoint directory, in one process or on ``grid``
    (``"D,R,C,Z"``, under torchrun/mpiexec/srun: the model built sharded from an HF directory or a training
    checkpoint, :func:`memorization.eval_model.load_on_grid`)."""

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 grid: str | None = None):
        from memorization.eval_model import grid_runtime, load_checkpoint, load_on_grid

        self.seed, self.grid = seed, None
        if grid:
            rt = grid_runtime(grid)
            self.model, self.tok = load_on_grid(model_path, rt, require_tokenizer=True)
            self.grid = rt.grid
        else:  # checked first (a damaged directory is one line naming the file), then model and tokenizer
            self.model, self.tok = load_checkpoint(model_path, device=device, dtype=dtype)

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
        from memorization.extraction import greedy_continue

        n = n if temperature > 0 else 1  # greedy decoding: n copies would be n identical texts
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        ids = [self.tok(p).input_ids for p in prompts]
        keys = [zlib.crc32(p.encode()) for p in prompts]
        eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (eos or 0)
        grid = self.grid

        def decode(share: list[tuple[int, int]]) -> list[str]:
            gens: dict[int, torch.Generator] = {}
            ends: dict[int, int] = {}  # row of the share -> tokens it keeps

            def draw(logits: torch.Tensor, idx: list[int]) -> torch.Tensor:
                if temperature <= 0:
                    return logits.argmax(-1, keepdim=True)
                scores = nucleus(logits.float() / temperature, top_p)
                noise = torch.empty_like(scores)
                for r, k in enumerate(idx):
                    if k not in gens:
                        i, j = share[k]
                        gens[k] = torch.Generator().manual_seed(hash((self.seed, keys[i], j)) & (2**63 - 1))
                    noise[r] = torch.rand(scores.size(-1), generator=gens[k]).to(scores.device)
                return (scores - torch.log(-torch.log(noise.clamp(min=1e-20)))).argmax(-1, keepdim=True)

            def stop(generated: torch.Tensor, idx: list[int]) -> bool:
                t = generated.size(1)
                for r, k in enumerate(idx):
                    if k in ends:
                        continue
                    last = int(generated[r, -1])
                    if eos is not None and last == eos:
                        ends[k] = t - 1
                    elif is_done(self.tok.decode(generated[r].tolist(), skip_special_tokens=True)):
                        ends[k] = t
                going = torch.tensor([float(any(k not in ends for k in idx))])
                if grid is not None and grid.world_size > 1:  # every replica runs the same forwards
                    import torch.distributed as dist

                    dist.all_reduce(going, op=dist.ReduceOp.MAX)
                return not bool(going.item())

            out = greedy_continue(self.model, [ids[i] for i, _ in share], max_new_tokens, batch_size, pad,
                                  progress=progress and (grid is None or grid.rank == 0), pick=draw, stop=stop)
            return [self.tok.decode(toks[:ends.get(k, len(toks))], skip_special_tokens=True)
                    for k, toks in enumerate(out)]

        if grid is None:
            texts = decode(rows)
        else:
            from memorization.runtime import map_over_replicas

            texts = map_over_replicas(decode, rows, grid)
        out: list[list[str]] = [[] for _ in prompts]
        for (i, _), text in zip(rows, texts):
            out[i].append(text)
        return out
