"""The memorization experiment as a library call: ``run_experiment(ExperimentConfig(...))``.

    from memorization.experiment import ExperimentConfig, load_config, run_experiment
    results = run_experiment(load_config("runs/memorize/config.yaml"))

``recipes/memorize.py`` is its command line, ``memorization.launch.sweep`` runs grids of it.
"""
from memorization.experiment.config import (ConfigError, Data, Execution, ExperimentConfig, Extraction, Goldfish,
                                            Model, Output, Training, config_from_dict, dump_config, load_config,
                                            resolve, settings)
from memorization.experiment.data import read_targets
from memorization.experiment.run import run_experiment
from memorization.experiment.validate import validate

__all__ = ["ConfigError", "Data", "Execution", "ExperimentConfig", "Extraction", "Goldfish", "Model", "Output",
           "Training", "config_from_dict", "dump_config", "load_config", "read_targets", "resolve",
           "run_experiment", "settings", "validate"]
