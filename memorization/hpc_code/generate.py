"""Sampling completions from a local Hugging Face checkpoint (never the Hub).

Prompts are completed as raw text (code models, ParEval style).  Samples are
batched across (prompt, sample) pairs with left padding; a row stops early
once its function is complete (closing brace for C, a top-level stop
sequence for Python), which also bounds the cost of runaway generations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from memorization.hpc_code.extract import PYTHON_STOP, c_body_closed


class _RowsDone(StoppingCriteria):
    """Per-row stop test on the decoded continuation (prompt tokens excluded)."""

    def __init__(self, tokenizer, prompt_len: int, is_done: Callable[[str], bool]):
        self.tok, self.prompt_len, self.is_done = tokenizer, prompt_len, is_done

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        texts = self.tok.batch_decode(input_ids[:, self.prompt_len :], skip_special_tokens=True)
        return torch.tensor([self.is_done(t) for t in texts], device=input_ids.device)


def python_done(text: str) -> bool:
    return any(s in text for s in PYTHON_STOP)


class HFSampler:
    """Batched temperature / top-p sampling from a local checkpoint directory."""

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: str = "float32", seed: int = 0):
        from memorization.eval_model import load_checkpoint

        # checked first (a damaged directory is one line naming the file), then model and tokenizer, local only
        self.model, self.tok = load_checkpoint(model_path, device=device, dtype=dtype)
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.device = device
        torch.manual_seed(seed)

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
        n = n if temperature > 0 else 1  # greedy decoding: n copies would be n identical texts
        jobs = [(i, p) for i, p in enumerate(prompts) for _ in range(n)]
        out: list[list[str]] = [[] for _ in prompts]
        for start in tqdm(range(0, len(jobs), batch_size), desc="generate", disable=not progress):
            chunk = jobs[start : start + batch_size]
            enc = self.tok([p for _, p in chunk], return_tensors="pt", padding=True).to(self.device)
            plen = enc["input_ids"].shape[1]
            sampling = temperature > 0
            gen = self.model.generate(
                **enc,
                do_sample=sampling,
                temperature=temperature if sampling else None,
                top_p=top_p if sampling else None,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tok.pad_token_id,
                stopping_criteria=StoppingCriteriaList([_RowsDone(self.tok, plen, is_done)]),
            )
            texts = self.tok.batch_decode(gen[:, plen:], skip_special_tokens=True)
            for (i, _), text in zip(chunk, texts):
                out[i].append(text)
        return out
