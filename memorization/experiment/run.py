"""``run_experiment(cfg)``: build the mixture, train the standard and the Goldfish arm on it from the same
initial weights, run extraction on both, and write the report into ``cfg.output.out``."""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from memorization.data.atomic import atomic_write_text
from memorization.experiment.config import (ARMS, ExperimentConfig, dump_config, parse_arms, parse_lengths, resolve,
                                            settings)
from memorization.experiment.components import arm_goldfish, extraction_config, length_config, train_config
from memorization.experiment.data import (cached_run_store, check_same_data, load_run_tokenizer, open_run_store,
                                          read_targets, targets_text_field, tokenizer_spec)
from memorization.experiment.grid_advice import print_plan, run_shape
from memorization.experiment.validate import check_grid_divides, config_grid, validate

#: the resolved config of a run, in its --out (``--config`` reads it back)
CONFIG_FILE = "config.yaml"
# What a run writes into --out: all that --overwrite deletes (anything else there is left alone).
RUN_ENTRIES = ("run_config.json", CONFIG_FILE, "manifest.json", "canaries.json", "results.json", "results.md",
               "results.png", *ARMS)


def arms_to_train(cfg: ExperimentConfig) -> list[str]:
    """The arms a run trains, in order: ``--arms`` (standard and goldfish by default; only the standard arm when
    ``--goldfish-k 0``)."""
    return parse_arms(cfg.goldfish.arms, cfg.goldfish.k)


def remove_run(out: Path) -> None:
    """Delete the run in ``out`` (its :data:`RUN_ENTRIES`), never other files the directory holds."""
    for name in RUN_ENTRIES:
        entry = out / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def make_runtime(cfg: ExperimentConfig):
    from memorization.training.runtime import Runtime

    try:
        return Runtime.create(config_grid(cfg))
    except ValueError as e:
        raise SystemExit(f"error: --grid {cfg.execution.grid}: {e}") from None


def run_arm(arm: str, cfg: ExperimentConfig, rt, mixture, tokenizer, out: Path, canaries: list | None = None) -> dict:
    """Train one arm from the shared initial weights, export it, and run extraction on it (and, as the config
    asks, MIA and the exposure of the ``canaries`` written into its training rows)."""
    import torch

    from memorization.evaluation.extraction import extract, trained
    from memorization.data.mixture import atomic_write_json
    from memorization.training.models import build_model
    from memorization.evaluation.recency import by_recency
    from memorization.training.tracking import Tracker, tracked_targets
    from memorization.training.train import Trainer

    arm_dir = out / arm
    done = arm_dir / "arm_result.json"
    if done.exists():
        return json.loads(done.read_text())
    t, x, progress = cfg.training, cfg.extraction, not cfg.output.no_progress
    model = build_model(cfg.model.size, len(tokenizer), init=cfg.model.init, seed=t.seed, max_seq=cfg.data.seq_len,
                        runtime=rt, family=cfg.model.family)  # each rank builds and fills only its own shards
    tcfg = train_config(arm, cfg, mixture.num_steps)
    gf = tcfg.goldfish
    ecfg = extraction_config(cfg)
    tracker = None
    if x.track_every:  # the labels are split by the run's Goldfish mask in every arm (memorization.training.tracking)
        targets = tracked_targets(mixture.targets, x.track_targets, t.seed)
        tracker = Tracker(targets, ecfg, arm_goldfish("goldfish", cfg))
    rows, doc_ids = mixture.input_ids, mixture.doc_ids
    if cfg.data.perturb_fraction:  # near-duplicates: every target copy perturbed (memorization.data.perturb)
        from memorization.data.perturb import PerturbedRows, target_copies

        rows = PerturbedRows(rows, target_copies(mixture.targets, rows.shape[1]), cfg.data.perturb_fraction,
                             cfg.data.perturb_kind, len(tokenizer), t.seed)
    if canaries:  # the same canary copies in every arm's rows (memorization.data.canary)
        from memorization.data.canary import CanaryRows

        rows, doc_ids = CanaryRows(rows, canaries), CanaryRows(doc_ids, canaries, doc_ids=True)
    trainer = Trainer(model, rows, doc_ids, mixture.val_ids, tcfg, arm_dir, rt, run_name=arm,
                      row_context=mixture.row_context, tracker=tracker)
    train = trainer.fit(resume=cfg.output.resume)
    model = trainer.model
    rt.export_hf(model, arm_dir / "model", tokenizer, dtype=getattr(torch, cfg.output.export_dtype))
    on_gpu = rt.device.type == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False):
        ext = extract(model, mixture.targets, ecfg, tokenizer, progress=progress and rt.is_main)
        by_length = []
        for p, sfx in parse_lengths(x.lengths):
            e = extract(model, mixture.targets, length_config(cfg, p, sfx))
            by_length.append({"prefix": "all" if p is None else p, "suffix": sfx, **e["overall"],
                              "skipped": len(e["skipped"])})
        mia = arm_mia(model, mixture, tokenizer, x.batch) if x.mia else None
        canary = arm_canaries(model, canaries, tokenizer, t.seed) if canaries else None
    drop = [h["goldfish_drop_frac"] for h in train["history"]]
    result = {
        **ext["overall"],
        "val_loss": train["val_loss"],
        "final_train_loss": train["final_train_loss"],
        "steps": train["steps"],
        "train_seconds": train["train_seconds"],  # of the whole run, also when it was resumed
        "goldfish": {"k": gf.k, "h": gf.h, "strategy": gf.strategy, "doc_start": gf.doc_start,
                     "randomize": gf.randomize},
        "goldfish_drop_frac": sum(drop) / len(drop),
        "by_exposure": ext["by_exposure"],
        "by_recency": by_recency(ext["documents"], mixture.targets, mixture.num_steps),
        # for the paired test: the trained targets, as in the overall rates (not the exposure-0 controls)
        "exact_by_target": {d["id"]: d["exact_match"] for d in trained(ext["documents"])},
        "loss_curve": [h["loss"] for h in train["history"]],
    }
    if by_length:
        result["by_length"] = by_length
    if mia is not None:
        result["mia"] = mia
    if canary is not None:
        result["canaries"] = canary
    if train["tracking"]:
        result["tracking"] = train["tracking"]
    if rt.is_main:
        atomic_write_json(arm_dir / "extraction.json", ext)
        atomic_write_json(done, result)
    return result


def arm_mia(model, mixture, tokenizer, batch_size: int) -> dict:
    """Membership inference on a trained arm (``--mia``): the scores of :func:`memorization.evaluation.mia.mia_scores`
    for the members (targets seen >= 1 time) and the nonmembers :func:`memorization.evaluation.mia.select_nonmembers`
    picks (the exposure-0 targets, pooled with the held-out corpus documents for corpus targets), and
    :func:`memorization.evaluation.mia.mia_report`'s AUC and TPR at 1% FPR, overall and by exposure count; and every
    scored document's loss (``loss_by_document``, for counterfactual memorization: memorization.launch.replicates)."""
    from memorization.evaluation.mia import mia_report, mia_scores, select_nonmembers

    members, nonmembers, source, warns = select_nonmembers(mixture.manifest())
    docs = members + nonmembers
    scores = mia_scores(model, tokenizer, [d["token_ids"] for d in docs], batch_size=batch_size)
    n = len(members)
    report = mia_report({k: v[:n] for k, v in scores.items()}, {k: v[n:] for k, v in scores.items()},
                        member_exposures=[int(d["exposures"]) for d in members])
    loss = [None if v != v else float(v) for v in scores["loss"].tolist()]  # NaN (too short to score): None
    return {**report, "n_members": n, "n_nonmembers": len(nonmembers), "nonmember_source": source,
            "warnings": warns, "loss_by_document": {str(d["id"]): x for d, x in zip(docs, loss)}}


def run_canaries(cfg: ExperimentConfig, mixture, tokenizer) -> list:
    """The run's canaries (``--canaries``), placed in rows of the stream that hold no target; [] when off."""
    from memorization.data.canary import make_canaries, parse_canary_exposures, place_canaries

    d = cfg.data
    if not d.canaries:
        return []
    try:
        cans = make_canaries(d.canaries, parse_canary_exposures(d.canary_exposures), d.canary_digits, tokenizer,
                             cfg.training.seed)
        busy = {r for t in mixture.targets for r in t.get("rows", [])}
        place_canaries(cans, len(mixture.input_ids), mixture.input_ids.shape[1], busy, cfg.training.seed)
    except ValueError as e:
        raise SystemExit(f"error: --canaries: {e}") from None
    return cans


def arm_canaries(model, canaries: list, tokenizer, seed: int) -> dict:
    """The exposure of every canary in a trained arm (:func:`memorization.evaluation.exposure.canary_exposures`)
    and its summary by exposure count."""
    from memorization.data.canary import digit_alphabet
    from memorization.evaluation.exposure import canary_exposures, summarize_exposures

    rows = canary_exposures(model, canaries, digit_alphabet(tokenizer), seed=seed)
    return {"by_exposure": summarize_exposures(rows), "canaries": rows}


def write_report(out: Path, results: dict) -> None:
    """``results.json``, ``results.md`` and ``results.png`` of a finished run, each written whole or not at all."""
    from memorization.data.mixture import atomic_write_json
    from memorization.evaluation.report import plot_arms, results_markdown

    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.md", results_markdown(results))
    plot_arms(results, out / "results.png")


def run_experiment(cfg: ExperimentConfig) -> dict | None:
    """Run the experiment ``cfg`` (resolved here if it is not) and return its results (``results.json``'s
    content); with ``execution.plan``, print the plan and return None.

    Every bad setting is refused (a :class:`~memorization.experiment.config.ConfigError`) before any model
    or data work; later failures (the corpus too small, a --resume whose data changed) are SystemExits
    saying what to do.  A run stopped by SIGUSR1 after a checkpoint raises ``SystemExit(EXIT_INTERRUPTED)``.
    The run directory gets ``config.yaml`` (this config, without --resume/--overwrite), ``run_config.json``,
    ``manifest.json``, one directory per arm and the report.
    """
    cfg = resolve(cfg)
    # the tokenizer the run uses, as the run records and --resume compares it (with --init and no --tokenizer: the
    # checkpoint's own)
    cfg = replace(cfg, data=replace(cfg.data, tokenizer=tokenizer_spec(cfg)))
    validate(cfg)
    if cfg.execution.plan:
        print_plan(cfg)
        return None
    from memorization.training.models import check_size_runs_here

    t = cfg.training
    tokenizer = load_run_tokenizer(cfg)
    check_grid_divides(cfg, run_shape(cfg, tokenizer))  # before any rank builds data or writes into --out
    rt = make_runtime(cfg)
    local_rows = rt.local_batch_rows(t.batch_size)
    micro = t.micro_batch or local_rows
    check_size_runs_here(run_shape(cfg, tokenizer), rt.device, config_grid(cfg), seq=cfg.data.seq_len,
                         micro_batch=micro, activation_checkpointing=t.activation_checkpointing,
                         micro_steps=max(1, local_rows // micro), grad_reduce_dtype=cfg.execution.grad_reduce_dtype)
    targets = read_targets(cfg.data.targets, targets_text_field(cfg)) if cfg.data.targets else None
    if cfg.data.store:
        mixture = open_run_store(cfg, tokenizer, targets, rt)
    else:
        mixture = cached_run_store(cfg, tokenizer, targets, rt)
    out = Path(cfg.output.out)
    lock = acquire_run_lock(cfg, rt)  # one writer per run directory, from here to the end
    try:
        return _write_and_train(cfg, rt, mixture, tokenizer, out)
    finally:
        if lock is not None:
            lock.release()


def acquire_run_lock(cfg: ExperimentConfig, rt):
    """Rank 0 takes ``--out``'s lock (:class:`memorization.training.run_lock.RunLock`; a stale one is taken over, saying
    so); a refusal reaches every rank.  Returns the lock on rank 0, None elsewhere."""
    from memorization.training.run_lock import RunLock, RunLocked

    lock = error = None
    if rt.is_main:
        lock = RunLock(cfg.output.out, force=cfg.output.force_lock)
        try:
            lock.acquire()
        except RunLocked as e:
            error, lock = str(e.code), None
        else:
            if lock.took_over:
                print(f"note: --out {cfg.output.out}: took over {lock.took_over}", file=sys.stderr)
    error = rt.from_main(error)
    if error:
        raise RunLocked(error)
    return lock


def _write_and_train(cfg: ExperimentConfig, rt, mixture, tokenizer, out: Path) -> dict:
    """The part of :func:`run_experiment` that writes into ``out``: under its lock."""
    from memorization.data.mixture import atomic_write_json

    if cfg.output.overwrite:  # only now: a run refused above leaves the old one in place
        if rt.is_main and out.exists():
            remove_run(out)
        rt.barrier()  # no rank writes into an arm directory that rank 0 is still deleting
    else:
        check_same_data(out, mixture)
    out.mkdir(parents=True, exist_ok=True)
    if rt.is_main:
        atomic_write_json(out / "run_config.json", settings(cfg))
        rerun = replace(cfg, output=replace(cfg.output, resume=False, overwrite=False))
        atomic_write_text(out / CONFIG_FILE, dump_config(rerun))
        mixture.save_manifest(out / "manifest.json")
    results = {"settings": settings(cfg), "num_steps": mixture.num_steps,
               "num_targets": len(mixture.targets), "skipped_targets": mixture.meta["skipped_short_targets"],
               "skipped_overlapping_targets": mixture.meta["skipped_overlapping_targets"],
               "arms": {}}
    from memorization.training.train import EXIT_INTERRUPTED, NonFiniteTraining, TrainingInterrupted

    canaries = run_canaries(cfg, mixture, tokenizer)
    if canaries and rt.is_main:
        atomic_write_json(out / "canaries.json", [
            {"id": c.id, "exposures": c.exposures, "text": tokenizer.decode(c.ids), "token_ids": c.ids,
             "rows": c.rows, "offsets": c.offsets} for c in canaries])
    try:
        for arm in arms_to_train(cfg):
            results["arms"][arm] = run_arm(arm, cfg, rt, mixture, tokenizer, out, canaries)
    except TrainingInterrupted as e:
        if rt.is_main:
            print(f"interrupted: {e} (--resume)", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except NonFiniteTraining as e:  # no results: a diverged arm is not a measurement
        if rt.is_main:
            print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    by_target = [results["arms"].get(a, {}).get("exact_by_target") for a in ("standard", "goldfish")]
    if all(by_target):  # both arms, scored on the same targets (arm results of older runs lack it)
        from memorization.evaluation.stats import paired_exact_test

        results["paired_exact_match"] = paired_exact_test(*by_target)
    if rt.is_main:
        write_report(out, results)
        print((out / "results.md").read_text())
    return results
