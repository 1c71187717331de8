"""An exponential moving average (EMA) of a model's weights, often better than the last weights."""

from copy import deepcopy
from typing import Any

import torch
import torch.nn as nn
from accelerate.utils import extract_model_from_parallel

__all__ = ["ModelEma"]


class ModelEma(nn.Module):
    """Keeps an exponential moving average copy of a model.

    After each :meth:`update`, every floating-point parameter and buffer of the copy becomes
    ``decay * ema + (1 - decay) * current``. Integer and boolean buffers, such as batch norm's
    ``num_batches_tracked``, are counts rather than estimates, so they are copied instead.

    The copy (``self.module``) is in eval mode, does not require gradients, and starts on the same
    device as the model; move it with ``to()`` like any module. ``state_dict()`` keys are those of
    the model prefixed with ``"module."``; use ``ema.module.state_dict()`` for a checkpoint that
    loads straight into the bare model.

    Args:
        model: The model to average. A model wrapped by DistributedDataParallel or
            ``torch.compile`` is unwrapped, and the copy is of the plain model.
        decay: The weight kept by the average at each update, in [0, 1]. With one update per
            optimizer step, the average covers roughly the last ``1 / (1 - decay)`` steps.

    Raises:
        ValueError: If ``decay`` is not a number in [0, 1].

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> _ = torch.nn.init.zeros_(model.bias)
        >>> ema = ModelEma(model, decay=0.9)
        >>> _ = torch.nn.init.ones_(model.bias)  # as if an optimizer step had moved it
        >>> ema.update(model)  # 0.9 * 0.0 + 0.1 * 1.0
        >>> round(ema.module.bias.item(), 4)
        0.1
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(
                f"ModelEma decay must be a number in [0, 1], but got {decay!r}. Values close to 1, "
                f"such as 0.999 or 0.9999, are usual; the average covers about 1 / (1 - decay) updates."
            )
        self.decay = float(decay)
        self.module = deepcopy(_unwrap(model))
        self.module.eval()
        self.module.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Moves the average towards the model's current weights: call it after each optimizer step.

        Raises:
            ValueError: If the model's parameters or buffers do not match the average's.
        """
        ema_floats: list[torch.Tensor] = []
        floats: list[torch.Tensor] = []
        for ema_tensor, tensor in self._paired_tensors(model):
            if ema_tensor.is_floating_point():
                ema_floats.append(ema_tensor)
                floats.append(tensor.to(device=ema_tensor.device, dtype=ema_tensor.dtype))
            else:  # counts such as num_batches_tracked: an average of counts means nothing
                ema_tensor.copy_(tensor)
        if ema_floats:
            # lerp(ema, current, 1 - decay) == decay * ema + (1 - decay) * current, in one fused pass.
            torch._foreach_lerp_(ema_floats, floats, 1.0 - self.decay)

    @torch.no_grad()
    def set(self, model: nn.Module) -> None:
        """Copies the model's current parameters and buffers into the average exactly.

        Raises:
            ValueError: If the model's parameters or buffers do not match the average's.
        """
        for ema_tensor, tensor in self._paired_tensors(model):
            ema_tensor.copy_(tensor)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the averaged model."""
        return self.module(*args, **kwargs)

    def _paired_tensors(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Pairs each tensor of the average with the model's tensor of the same name."""
        source = _unwrap(model)
        ema_named = [*self.module.named_parameters(), *self.module.named_buffers()]
        source_named = [*source.named_parameters(), *source.named_buffers()]
        ema_names = [name for name, _ in ema_named]
        source_names = [name for name, _ in source_named]
        if ema_names != source_names:
            missing = sorted(set(ema_names) - set(source_names))
            unexpected = sorted(set(source_names) - set(ema_names))
            raise ValueError(
                f"ModelEma was given a model whose parameters and buffers differ from the averaged "
                f"copy's (missing: {missing[:5]}, unexpected: {unexpected[:5]}). Pass the same "
                f"model that the ModelEma was created from."
            )
        return [(ema_t, t) for (_, ema_t), (_, t) in zip(ema_named, source_named, strict=True)]


def _unwrap(model: nn.Module) -> nn.Module:
    """Returns the plain model inside a DistributedDataParallel, DataParallel or compiled wrapper."""
    return extract_model_from_parallel(model, keep_torch_compile=False)
