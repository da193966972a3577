"""TrainingError: what ends a training run with one line for the user, raised by every stage of the run."""


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, a run directory from another config)."""
