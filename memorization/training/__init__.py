"""Training: the trainer and its loss (Goldfish labels, chunked cross-entropy), the model of a run (built from a
preset, a checkpoint or a registry's pretrained model), its runtime on the 4D grid, and what a run records
(memorization during training, memory traces, the run lock)."""
