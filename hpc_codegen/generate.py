"""Sampling completions from a local Hugging Face checkpoint (never the Hub), in one process or on a 4D grid.

A prompt is code that ends where the function's body begins.  A base model completes it as raw text (ParEval
style).  An instruction-tuned model -- one whose tokenizer has a chat template -- is asked in its own format
(:func:`chat_input`, as bigcode-evaluation-harness's instruct tasks): a user turn asking for the rest of the
function, then the template's generation prompt and the reply begun as a code fence and the prompt itself, so
the model's next tokens are the function's body as a base model's would be (and are cut and scored the same
way).  The model is given the prompt less its trailing whitespace and writes that whitespace itself: a
tokenizer merges a newline with the next line's indentation (``"\n   "`` is one token), so a prompt ending in a
lone newline token puts the model at column 0 of an unusual token boundary (SmolLM2-135M then writes
``#define`` lines instead of the body); the completions returned are the text after the whole prompt
(:func:`after_prompt`).  Every input must fit the model's context with ``max_new_tokens`` to spare, or sampling is refused before
it starts (:class:`ContextError`): a model never sees a truncated prompt.

Each (prompt, sample) pair is one row; rows are decoded in batches with a KV cache
(:meth:`memorization.lm.LM.generate_until`: in one process the samples of a prompt share one prefill, and a row
leaves its batch once done), a row being done once its function is complete (closing brace for C, a top-level
stop sequence for Python) or it has ended with the end-of-text token.

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

from hpc_codegen.code_blocks import PYTHON_STOP, c_body_closed


def python_done(text: str) -> bool:
    return any(s in text for s in PYTHON_STOP)


#: fence tag -> the language's name in the instruction
LANGUAGES = {"c": "C", "cpp": "C++", "cuda": "CUDA C++", "python": "Python"}


class ContextError(ValueError):
    """An input that does not fit the model's context with the requested new tokens (one line, with the fix)."""


def instruction(language: str) -> str:
    """The user turn asking an instruction-tuned model for the rest of a ``language`` function (a fence tag of
    :data:`LANGUAGES`); the function itself opens the model's reply (:func:`chat_input`)."""
    return f"Complete this {LANGUAGES[language]} function: write the rest of its body, and nothing else."


def chat_input(tokenizer, prompt: str, language: str) -> str:
    """The text an instruction-tuned model is given for ``prompt``: ``tokenizer``'s chat template applied to the
    user turn :func:`instruction` with the generation prompt, followed by the reply begun as a ``language`` fence
    and ``prompt`` verbatim (so the continuation is the function's body; the prompt is read once)."""
    head = tokenizer.apply_chat_template([{"role": "user", "content": instruction(language)}],
                                         add_generation_prompt=True, tokenize=False)
    return f"{head}```{language}\n{prompt}"


def context_length(model) -> int | None:
    """The positions the model was trained for (``max_position_embeddings`` or ``n_positions``), None if its config
    names neither."""
    cfg = getattr(model, "config", None)
    return next((v for k in ("max_position_embeddings", "n_positions") if isinstance(v := getattr(cfg, k, None), int)),
                None)


#: done tests that can only turn true at a step whose new token's text holds this character: the text is scanned
#: only then.  ``c_body_closed``: appending text never changes how the text before it scans (a comment, string or
#: character literal starts where it did, and one left open at the end only extends), so the brace that closes the
#: function lies in the new token's text; a lone token's bytes decode to "}" exactly when the whole text's do.
DONE_ONLY_AFTER: dict[Callable[[str], bool], str] = {c_body_closed: "}"}


def stop_test(tokenizer, is_done: Callable[[str], bool], eos: int | None) -> Callable[[list[int]], int | None]:
    """The ``until`` of :meth:`memorization.lm.LM.generate_until` for a row being sampled: done at an end-of-text
    token ``eos`` (dropped) or once the decoded text satisfies ``is_done`` (kept).  A test in
    :data:`DONE_ONLY_AFTER` is only asked after a token holding its character: the same step it would first be
    true, without decoding and scanning the whole text at every step (quadratic in the length)."""
    trigger = DONE_ONLY_AFTER.get(is_done)

    def until(tokens: list[int]) -> int | None:
        if eos is not None and tokens[-1] == eos:
            return len(tokens) - 1
        if trigger is not None and trigger not in tokenizer.decode(tokens[-1:], skip_special_tokens=True):
            return None
        return len(tokens) if is_done(tokenizer.decode(tokens, skip_special_tokens=True)) else None

    return until


def after_prompt(text: str, tail: str) -> str:
    """The text after the whole prompt of a continuation ``text`` of the prompt less its trailing whitespace
    ``tail``: ``text`` without ``tail`` where it begins with it (as the model nearly always writes it), else
    ``text`` (the candidate is then the prompt, the whitespace and ``text``: C and the stop tests do not mind)."""
    return text[len(tail):] if text.startswith(tail) else text


class HFSampler:
    """Temperature / top-p sampling from a local checkpoint directory, in one process or on ``grid``
    (``"D,R,C,Z"``, under torchrun/mpiexec/srun: the model built sharded from an HF directory or a training
    checkpoint), through :class:`memorization.lm.LM` (:meth:`~memorization.lm.LM.load`,
    :meth:`~memorization.lm.LM.generate_until`)."""

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 grid: str | None = None, chat: bool | None = None):
        """``chat``: prompt in the tokenizer's chat template (:func:`chat_input`); None: when it has one."""
        from memorization.lm import LM

        self.seed = seed
        # one process: the directory checked first (a damaged one is one line naming the file), then model and
        # tokenizer; on a grid: each rank reads its own shards
        self.lm = LM.load(model_path, device=device, dtype=dtype, grid=grid or None, require_tokenizer=True)
        self.model, self.tok, self.grid = self.lm.model, self.lm.tokenizer, self.lm.grid
        has_template = bool(getattr(self.tok, "chat_template", None))
        if chat and not has_template:
            raise ValueError(f"{model_path}: the tokenizer has no chat template (chat_template.jinja or "
                             "tokenizer_config.json's chat_template); prompt it as raw text instead")
        self.chat = has_template if chat is None else chat

    def input_ids(self, prompts: list[str], languages: list[str]) -> list[list[int]]:
        """The token ids the model is given for each prompt less its trailing whitespace (module docstring;
        ``languages``: their fence tags): the chat input (:func:`chat_input`, whose special tokens are in its text)
        if :attr:`chat`, else the prompt as raw text."""
        if len(languages) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(languages)} languages")
        prompts = [p.rstrip() for p in prompts]
        if not self.chat:
            return [self.tok(p).input_ids for p in prompts]
        return [self.tok(chat_input(self.tok, p, lang), add_special_tokens=False).input_ids
                for p, lang in zip(prompts, languages)]

    def check_context(self, ids: list[list[int]], max_new_tokens: int, names: list[str] | None = None) -> None:
        """:class:`ContextError` if the longest input plus ``max_new_tokens`` exceeds the model's context."""
        limit = context_length(self.model)
        if limit is None or not ids:
            return
        i = max(range(len(ids)), key=lambda j: len(ids[j]))
        name = names[i] if names else f"prompt {i}"
        if len(ids[i]) >= limit:
            raise ContextError(f"{name} is {len(ids[i])} tokens, the model's whole context of {limit} or more: it "
                               "cannot see it whole and write anything; use a model with a longer context"
                               + (" or --chat-template off (the prompt alone)" if self.chat else ""))
        if len(ids[i]) + max_new_tokens > limit:
            raise ContextError(f"{name} is {len(ids[i])} tokens: with --max-new-tokens {max_new_tokens} it exceeds "
                               f"the model's context of {limit}; lower --max-new-tokens to at most "
                               f"{limit - len(ids[i])}")

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
        languages: list[str] | None = None,
        names: list[str] | None = None,
    ) -> list[list[str]]:
        """``n`` raw continuations per prompt (greedy, and one copy, when temperature == 0).  ``languages``: each
        prompt's fence tag (:data:`LANGUAGES`; default ``c``), for the chat input; ``names`` name a prompt that
        does not fit the context (:class:`ContextError`, raised before any generation)."""
        from memorization.lm import Sampling, row_seed

        n = n if temperature > 0 else 1  # greedy decoding: n copies would be n identical texts
        rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
        tails = [p[len(p.rstrip()):] for p in prompts]  # the model writes them (module docstring)
        ids = self.input_ids(prompts, languages or ["c"] * len(prompts))
        self.check_context(ids, max_new_tokens, names)
        keys = [zlib.crc32(p.encode()) for p in prompts]
        eos = self.tok.eos_token_id
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (eos or 0)
        until = stop_test(self.tok, is_done, eos)
        sampling = Sampling(temperature, top_p=top_p, noise_on_cpu=True) if temperature > 0 else None
        out = self.lm.generate_until([ids[i] for i, _ in rows], max_new_tokens, until=until, sampling=sampling,
                                     seeds=[row_seed(self.seed, keys[i], j) for i, j in rows],
                                     batch_size=batch_size, pad_id=pad, progress=progress)
        texts: list[list[str]] = [[] for _ in prompts]
        for (i, _), toks in zip(rows, out):
            texts[i].append(after_prompt(self.tok.decode(toks, skip_special_tokens=True), tails[i]))
        return texts
