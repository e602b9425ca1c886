"""Build the model of an experiment, of any family with a parallel plan (:mod:`axonn.plans`): from a size preset
(config only, as its own family or another: ``--family``) or a local HF checkpoint (``--init``)."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch

from axonn.presets import ModelShape, get_preset



def padded_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's size up so the vocabulary splits evenly over tensor-parallel axes."""
    return -(-n // multiple) * multiple


#: a rank whose predicted peak exceeds this fraction of the device's free memory is refused at start
PREFLIGHT_FRACTION = 0.95


def check_size_runs_here(shape: ModelShape, device: torch.device, grid: tuple[int, int, int, int] = (1, 1, 1, 1),
                         seq: int = 2048, micro_batch: int = 1, activation_checkpointing: bool = False,
                         free_bytes: int | None = None, micro_steps: int = 2, grad_reduce_dtype: str = "fp32") -> None:
    """Refuse, before any allocation, a run this machine cannot hold (with the figures and what to do instead).

    The need is the planner's peak memory of one rank of ``grid`` (D, R, C, Z) for this sequence length,
    micro-batch, micro-steps per optimizer step, checkpointing and gradient wire dtype
    (:func:`axonn.planner.memory_per_gpu`, checked against traces of this trainer).  On a GPU it is compared
    with the device's free memory.  On a CPU there is no autocast: every activation and logit is fp32, so the
    GPU model's activations and logits count twice (an upper bound: some of them are fp32 already), and all
    ``D·R·C·Z`` ranks are taken to share this host's available memory (``psutil``).  ``free_bytes``
    overrides the query (the device's, or the host's), for tests.
    """
    from axonn.grid_shape import GridShape
    from axonn.planner import GRAD_REDUCE_BYTES, MemoryConfig, memory_per_gpu

    cpu = device.type == "cpu"
    ranks = math.prod(grid) if cpu else 1
    mcfg = MemoryConfig(grad_reduce_bytes=GRAD_REDUCE_BYTES[grad_reduce_dtype])

    def need(ckpt: bool, mb: int):
        mem = memory_per_gpu(shape, GridShape(*grid), seq, mb, ckpt, mcfg, micro_steps=micro_steps)
        if cpu:
            mem = type(mem)(states=mem.states, buffers=mem.buffers, activations=2 * mem.activations,
                            logits=2 * mem.logits)
        return mem

    if free_bytes is None:
        if cpu:
            import psutil

            free_bytes = psutil.virtual_memory().available
        else:
            free_bytes = torch.cuda.mem_get_info(device)[0]
    budget = PREFLIGHT_FRACTION * free_bytes / ranks
    mem = need(activation_checkpointing, micro_batch)
    if mem.total <= budget:
        return
    g = 2**30
    fixes = []
    if not activation_checkpointing and need(True, micro_batch).total <= budget:
        fixes.append("add --activation-checkpointing")
    if micro_batch > 1:
        fixes.append("lower --micro-batch")
    if cpu:
        if ranks > 1:
            fixes.append(f"run fewer ranks on this host (all {ranks} share its memory)")
        fixes.append("train it on GPUs (`--plan --gpus N --machine NAME` picks a grid that fits), or a smaller "
                     "model here")
        where = (f"per rank, {ranks} ranks on this host" if ranks > 1 else "on this CPU")
        have = f"{free_bytes / g:.1f} GiB of host memory is available"
        total = f" ({ranks * mem.total / g:.1f} GiB in all)" if ranks > 1 else ""
    else:
        fixes.append("shard over more GPUs (`--plan --gpus N --machine NAME` picks a grid)")
        where, have, total = "per GPU", f"{free_bytes / g:.1f} GiB is free", ""
    raise SystemExit(
        f"size {shape.name!r} ({shape.num_params() / 1e9:.2f}B parameters) on grid D,R,C,Z={','.join(map(str, grid))} "
        f"at {micro_batch} x {seq} tokens per micro-step needs ~{mem.total / g:.1f} GiB {where}{total} (training "
        f"state {mem.states / g:.1f}, activations {mem.activations / g:.1f}, logits {mem.logits / g:.1f}, buffers "
        f"{mem.buffers / g:.1f}) but {have}: " + "; or ".join(fixes))


INIT_CHUNK_ELEMENTS = 1 << 22  # rows of a random init are drawn in chunks of ~4M values, each from its own seed


def _chunk_seed(seed: int, name: str, chunk: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def normal_rows(seed: int, name: str, full_shape: tuple[int, ...], r0: int, r1: int, std: float,
                device: torch.device | str = "cpu") -> torch.Tensor:
    """Rows ``[r0, r1)`` of parameter ``name``'s random init, N(0, std²), without drawing the other rows.

    The full tensor is cut into chunks of ``INIT_CHUNK_ELEMENTS // row_size`` rows and chunk ``i``
    is drawn from a generator seeded with a hash of (``seed``, ``name``, ``i``) on ``device``, so
    a value depends only on those, never on which rank draws it or how the tensor is sharded
    (the same on every grid; CPU and CUDA generators differ from each other).
    """
    per = max(1, INIT_CHUNK_ELEMENTS // math.prod(full_shape[1:]))
    out = torch.empty((r1 - r0, *full_shape[1:]), device=device)
    for c in range(r0 // per, -(-r1 // per)):
        c0, c1 = c * per, min((c + 1) * per, full_shape[0])
        g = torch.Generator(device=device).manual_seed(_chunk_seed(seed, name, c))
        chunk = torch.empty((c1 - c0, *full_shape[1:]), device=device).normal_(0.0, std, generator=g)
        lo, hi = max(r0, c0), min(r1, c1)
        out[lo - r0:hi - r0] = chunk[lo - c0:hi - c0]
    return out


def init_rules(model: torch.nn.Module) -> dict[str, tuple[str, int | None]]:
    """How HF's ``_init_weights`` initialises each parameter of a causal LM (any family with a plan):
    ``normal`` (Linear and Embedding weights, with the embedding's padding row zeroed), ``ones`` (the weights
    of RMSNorms and LayerNorms) or ``zeros`` (biases, of Linears and of LayerNorms)."""
    import axonn.intra_layer as ail

    rules: dict[str, tuple[str, int | None]] = {}
    for mname, mod in model.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            name = f"{mname}.{pname}" if mname else pname
            norm = any(k in type(mod).__name__ for k in ("RMSNorm", "LayerNorm"))
            if pname == "bias":
                rules[name] = ("zeros", None)
            elif norm and pname == "weight":
                rules[name] = ("ones", None)
            elif isinstance(mod, (torch.nn.Embedding, ail.Embedding)) and pname == "weight":
                rules[name] = ("normal", mod.padding_idx)
            elif isinstance(mod, (torch.nn.Linear, ail.Linear)) and pname == "weight":
                rules[name] = ("normal", None)
            else:
                raise ValueError(f"no initialisation rule for {name} ({type(mod).__name__})")
    return rules


class _RowSource:
    """A ``read(name, spec)`` for :func:`axonn.load_shards` built on ``rows(name, full_shape, r0, r1)``:
    each shard is cut from the rows of the full tensor it needs (:func:`axonn.sharding.shard_from_rows`)."""

    def rows(self, name: str, full_shape: tuple[int, ...], r0: int, r1: int) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, name: str, spec) -> torch.Tensor:
        from axonn.sharding import shard_from_rows

        return shard_from_rows(spec, lambda r0, r1: self.rows(name, spec.full_shape, r0, r1))


class RandomInit(_RowSource):
    """This rank's shard of HF's init of the model (:func:`init_rules`): N(0, ``std``²) weights drawn by
    :func:`normal_rows` (the same values on every grid), unit norm weights, zero biases."""

    def __init__(self, model: torch.nn.Module, seed: int, std: float, device: torch.device):
        self.rules, self.seed, self.std, self.device = init_rules(model), seed, std, device

    def rows(self, name: str, full_shape: tuple[int, ...], r0: int, r1: int) -> torch.Tensor:
        """Rows ``[r0, r1)`` of the full initial value of parameter ``name``."""
        kind, pad = self.rules[name]
        if kind != "normal":
            fill = torch.ones if kind == "ones" else torch.zeros
            return fill((r1 - r0, *full_shape[1:]), device=self.device)
        t = normal_rows(self.seed, name, full_shape, r0, r1, self.std, self.device)
        if pad is not None and r0 <= pad < r1:
            t[pad - r0] = 0
        return t


class CheckpointInit(_RowSource):
    """Each shard cut from the rows of a HF safetensors checkpoint it needs, for any family with a plan.

    Names are the model's (Hugging Face's), or the one the plan lists as the name the family's checkpoints store
    the parameter under (GPT-NeoX's ``embed_out``); a tied checkpoint's missing head is read from the embedding
    (``model.embed_tokens.weight``, ``gpt_neox.embed_in.weight``); vocabulary rows beyond the checkpoint's (a
    larger tokenizer, padding to a multiple of 64) get the random init.  Every name and shape is checked here,
    before anything is read.
    """

    def __init__(self, model: torch.nn.Module, ckpt, seed: int, std: float, device: torch.device):
        from axonn import spec_of
        from axonn.plans import embedding_name, get_plan, head_name

        plan = get_plan(model.config.model_type)
        emb, head = embedding_name(plan), head_name(plan)
        aliases = dict(plan.checkpoint_aliases)
        self.ckpt, self.device, self.random = ckpt, device, RandomInit(model, seed, std, device)
        self.source: dict[str, str] = {}
        problems = []
        for name, p in model.named_parameters():
            full = spec_of(p).full_shape
            src = next((n for n in (name, aliases.get(name)) if n is not None and n in ckpt),
                       emb if name == head else None)
            if src is None or src not in ckpt:
                problems.append(f"{name}: not in the checkpoint")
                continue
            shape = ckpt.shape(src)
            vocab = name in (emb, head)
            if shape[1:] != full[1:] or (shape[0] > full[0] if vocab else shape[0] != full[0]):
                problems.append(f"{name}: checkpoint shape {list(shape)}, model {list(full)}")
            self.source[name] = src
        if problems:
            raise ValueError(f"{ckpt.directory} does not match the model built from its config:\n  "
                             + "\n  ".join(problems[:10]))

    def rows(self, name: str, full_shape: tuple[int, ...], r0: int, r1: int) -> torch.Tensor:
        src = self.source[name]
        n_file = self.ckpt.shape(src)[0]
        parts = []
        if r0 < n_file or r1 <= n_file:
            parts.append(self.ckpt.rows(src, r0, min(r1, n_file)).to(device=self.device, dtype=torch.float32))
        if r1 > n_file:
            parts.append(self.random.rows(name, full_shape, max(r0, n_file), r1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


# A config attribute (saved in an exported config.json): the longest sequence the weights of a model
# trained *from scratch* here have been trained on.  Its max_position_embeddings is the architecture's
# (1024 for the tiny preset, 128k for Llama 3.1), but positions past the trained length were never
# trained, so evaluation windows stop there (model_context).  Pretrained checkpoints do not carry it.
TRAINED_CONTEXT = "trained_context"


def model_context(model_or_config) -> int | None:
    """Tokens a model can be evaluated over: ``max_position_embeddings`` (or ``n_positions`` /
    ``n_ctx``), lowered to the config's :data:`TRAINED_CONTEXT` when it has one; None if unknown."""
    cfg = getattr(model_or_config, "config", model_or_config)
    n = next((v for a in ("max_position_embeddings", "n_positions", "n_ctx") if (v := getattr(cfg, a, None))), None)
    trained = getattr(cfg, TRAINED_CONTEXT, None)
    if trained:
        n = min(n, trained) if n else trained
    return int(n) if n else None


def model_config(size: str | None, vocab_size: int, init: str | None = None, max_seq: int | None = None,
                 family: str | None = None):
    """The HF config of a run (its family's config class): the ``size`` preset's as ``family`` (None: the
    preset's own, Llama for the CPU sizes; :func:`axonn.presets.get_preset`), or the ``init`` checkpoint's
    (tied embeddings stay tied; vocabulary large enough).

    A checkpoint's ``model_type`` must have a parallel plan (:mod:`axonn.plans`) and agree with ``family`` when
    that is given: otherwise a ``ValueError`` names the families supported, before any weight is read.
    ``max_seq`` is the run's training sequence length: a preset model (trained from scratch) records it as
    :data:`TRAINED_CONTEXT`, and a checkpoint that carries one gets the longer of the two.
    """
    if init is None:
        shape = get_preset(size, family)
        overrides = {"attn_implementation": "sdpa"}
        if max_seq is not None:
            overrides["max_position_embeddings"] = max(max_seq, shape.max_seq)
            overrides[TRAINED_CONTEXT] = max_seq
        return shape.hf_config(vocab_size=padded_vocab(vocab_size), **overrides)
    from transformers import AutoConfig

    from axonn.plans import PLANS

    path = Path(init)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"--init {init}: no Hugging Face checkpoint (config.json) there")
    config = AutoConfig.from_pretrained(str(path), attn_implementation="sdpa", trust_remote_code=False)
    if config.model_type not in PLANS:
        raise ValueError(f"--init {init} is a {config.model_type!r} model, which has no parallel plan: supported "
                         f"are {', '.join(f'{t} ({p.hf_class})' for t, p in PLANS.items())}")
    if family is not None and family != config.model_type:
        raise ValueError(f"--family {family} but --init {init} is a {config.model_type} model: leave --family "
                         "unset with --init (the checkpoint's config says its family)")
    if config.vocab_size < vocab_size:
        config.vocab_size = padded_vocab(vocab_size)
    if getattr(config, TRAINED_CONTEXT, None) and max_seq is not None:
        setattr(config, TRAINED_CONTEXT, max(getattr(config, TRAINED_CONTEXT), max_seq))
    return config


def check_tokenizer_fits(tokenizer, init: str) -> None:
    """Refuse a tokenizer whose own vocabulary is larger than the ``init`` checkpoint's embedding.

    Its token ids would index embedding rows that mean other tokens (or none): it is not the
    checkpoint's tokenizer.  Tokens *added* to the checkpoint's tokenizer (e.g. a pad token) may lie
    beyond the embedding: their rows get the random init (:class:`CheckpointInit`).
    """
    vocab = model_config(None, 0, init=init).vocab_size
    if tokenizer.vocab_size > vocab:
        raise ValueError(
            f"the tokenizer {tokenizer.name_or_path or ''} has {tokenizer.vocab_size} tokens but the --init checkpoint "
            f"{init} embeds only {vocab}: it is not the tokenizer the checkpoint was trained with. Use the "
            "checkpoint's own (leave --tokenizer unset: it is read from the --init directory) or pass the one it "
            "was trained with")


def check_same_vocab(tokenizer, reference, init: str) -> None:
    """Refuse a tokenizer that gives some token another id than ``reference`` (the ``init``
    checkpoint's own tokenizer) does: the checkpoint's embedding rows would mean other tokens."""
    ref = reference.get_vocab()
    moved = [(t, i, ref[t]) for t, i in tokenizer.get_vocab().items() if t in ref and ref[t] != i]
    if moved:
        t, i, j = min(moved, key=lambda m: m[1])
        raise ValueError(
            f"the tokenizer {tokenizer.name_or_path or ''} numbers {len(moved)} tokens differently from the --init "
            f"checkpoint's own tokenizer in {init} (e.g. {t!r} is id {i} here, {j} there): it is not the tokenizer "
            "the checkpoint was trained with. Leave --tokenizer unset to use the checkpoint's own")


def causal_lm_class(config) -> type:
    """The ``transformers`` CausalLM class of ``config``'s family, as its plan names it (the class
    ``AutoModelForCausalLM`` picks for the ``model_type``); a ``ValueError`` naming the supported families for a
    model_type without a plan."""
    import transformers

    from axonn.plans import get_plan

    return getattr(transformers, get_plan(config.model_type).hf_class)


def build_model(
    size: str | None,
    vocab_size: int,
    init: str | None = None,
    seed: int = 0,
    max_seq: int | None = None,
    runtime=None,
    config=None,
    family: str | None = None,
) -> torch.nn.Module:
    """The run's HF causal LM (the class its family's plan names: ``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
    ``GPTNeoXForCausalLM`` ...): randomly initialised from preset ``size`` as ``family`` (seeded), or loaded
    from ``init`` (:func:`model_config`).

    No process ever holds more of the model than it keeps: the model is built with its parameters
    on the ``meta`` device, then

    * with a ``runtime`` (:class:`memorization.training.runtime.Runtime`), parallelized on its grid, each
      rank allocating only its own shards on the runtime's device, and returned that way;
    * without one, given full CPU storage (a plain HF model, e.g. for evaluation);

    and every shard is filled from the rows it needs: of HF's init (:class:`RandomInit`: N(0,
    initializer_range²) weights, unit norm weights, zero biases; identical on every grid) or of the ``init``
    checkpoint's safetensors files (:class:`CheckpointInit`, read memory-mapped, row range by row range).
    Parameters are fp32 whatever dtype the config names.  ``config`` (a HF config of a family with a plan,
    e.g. an axonn checkpoint's, whose weights are loaded afterwards) replaces the preset's.
    """
    from accelerate import init_empty_weights

    import axonn
    from axonn.checkpoint import SafetensorsCheckpoint

    config = config if config is not None else model_config(size, vocab_size, init, max_seq, family)
    model_class = causal_lm_class(config)  # not from_config: that would build in the config's dtype (bf16 ...)
    ckpt = SafetensorsCheckpoint(init) if init is not None else None  # refuses a missing/.bin checkpoint now
    with init_empty_weights(include_buffers=False):
        model = model_class(config)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()  # one parameter for the head and the embedding, on every grid (axonn.is_tied)
    if runtime is not None:
        model = runtime.parallelize(model)
        device = runtime.device
    else:
        device = torch.device("cpu")
        axonn.materialize(model, device)
    std = config.initializer_range
    if ckpt is None:
        axonn.load_shards(model, RandomInit(model, seed, std, device))
    else:
        with ckpt:
            axonn.load_shards(model, CheckpointInit(model, ckpt, seed, std, device))
    return model
