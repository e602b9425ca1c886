"""Launching runs: Slurm jobs for training and for evaluating its checkpoints (templates shipped as package data in
``job_templates/``), the resumable sweep of memorize runs and its report, and replicated runs over seeds and
membership splits."""
