"""pytorch-accelerated: a simple, complete and correct training loop for PyTorch."""

from accelerate import notebook_launcher

from .placeholders import TrainerPlaceholderValues
from .trainer import Trainer

__version__ = "0.2.0"

__all__ = ["Trainer", "TrainerPlaceholderValues", "notebook_launcher", "__version__"]
