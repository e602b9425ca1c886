"""The training data: corpora and tokenizers, the single-exposure mixture, the prepared token store, and the
overlays written over its rows (canaries, near-duplicate targets)."""
