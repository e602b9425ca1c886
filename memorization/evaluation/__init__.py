"""Evaluation of a trained model: verbatim extraction (greedy and adaptive), membership inference, canary exposure,
held-out perplexity and lm-eval tasks, with their statistics and reports; the registry of evaluations by name
(``python -m memorization.evaluation NAME --config FILE``)."""
