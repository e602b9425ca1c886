"""``python -m memorization.evaluation NAME --config FILE.yaml``: one evaluation of a trained model by its name in
the registry (:func:`memorization.evaluation.registry.main`); what each step of an evaluation job runs."""
from __future__ import annotations

import sys

from memorization.evaluation.registry import main

if __name__ == "__main__":
    sys.exit(main())
