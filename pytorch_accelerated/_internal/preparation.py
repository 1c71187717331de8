"""Preparing the model, the optimizer and the loaders with accelerate: what has been prepared
(:class:`Preparation`, the Trainer's record of it), which go to one ``prepare`` call, which loaders
are already prepared, and where the loop can step around accelerate's wrappers."""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType
from accelerate.utils.deepspeed import DummyOptim
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from .distributed import ranks_where


class Preparation:
    """What has been prepared with accelerate, so that the model and optimizer are wrapped once
    however many runs and evaluations follow, and whether the loop steps the optimizer itself.

    Attributes:
        model: the prepared (wrapped) model, once it has been prepared for training.
        optimizer: the prepared optimizer (what the loop steps).
        direct_steps: True where the loop calls ``loss.backward()`` and steps the optimizer
            itself because accelerate's wrappers would only call through (see
            :func:`prepare_optimizer`).
        trainable: which of the model's parameters required gradients when it was wrapped (see
            :meth:`rewrap_if_trainable_changed`).
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.model: nn.Module | None = None
        self.optimizer: Any = None
        self.direct_steps = False
        self.trainable: tuple[bool, ...] = ()

    def prepare(self, model: nn.Module, optimizer: Any, train_loader: Any) -> tuple[nn.Module, Any, Any]:
        """Wrap the model and optimizer for distribution (once), and prepare the training loader.

        Under DeepSpeed or FSDP (or with DeepSpeed's ``DummyOptim``) the three go to one
        ``prepare`` call, as those engines need; otherwise each is prepared on its own, so that a
        plain optimizer can be stepped directly where accelerate's wrapper would only call through.
        A model with nothing to train is placed on the device only (DDP refuses it), and wrapped
        once it trains.
        """
        accelerator = self.accelerator
        model_pending = self.model is None or model is not self.model
        optimizer_pending = optimizer is not None and optimizer is not self.optimizer
        # DeepSpeed's engine (also with its DummyOptim) is built from the model, the optimizer and
        # the training loader's batch size, so they go to one prepare call; FSDP's wrapping
        # replaces the parameters that the optimizer must then hold.
        if (model_pending or optimizer_pending) and (
            accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)
            or isinstance(optimizer, DummyOptim)
        ):
            model, optimizer, train_loader = prepare_together(accelerator, model, optimizer, train_loader)
            self.model, self.optimizer, self.direct_steps = model, optimizer, False
        if self.model is None or model is not self.model:
            if any(parameter.requires_grad for parameter in model.parameters()):
                model = self.model = accelerator.prepare(model)
                self.trainable = trainable_flags(model)
            else:
                model = accelerator.prepare_model(model, evaluation_mode=True)
        if optimizer is not None and optimizer is not self.optimizer:
            optimizer, self.direct_steps = prepare_optimizer(accelerator, optimizer)
            self.optimizer = optimizer
        if needs_preparing(train_loader):
            train_loader = accelerator.prepare(train_loader)
        return model, optimizer, train_loader

    def rewrap_if_trainable_changed(self, model: nn.Module) -> nn.Module:
        """``model``, wrapped again when the parameters that require gradients are no longer those
        it was wrapped with (a collective call under DDP: every process must make it).

        ``DistributedDataParallel`` all-reduces the gradients of the parameters that required them
        when it wrapped the model, and only theirs: a parameter unfrozen later (a fine-tuning stage,
        a callback that unfreezes the backbone, a resume that restores ``requires_grad``) would be
        trained on each process's own gradients, and the processes' weights would drift apart
        without a word. Wrapping again registers them; the wrapper starts from process 0's weights,
        which every process shares here.

        Raises:
            RuntimeError: when the parameters that train changed on some processes only.
        """
        if not isinstance(model, DistributedDataParallel) or model is not self.model:
            return model
        changed = ranks_where(self.accelerator, trainable_flags(model) != self.trainable)
        if not changed:
            return model
        if len(changed) < self.accelerator.num_processes:
            raise RuntimeError(
                f"The parameters that require gradients changed on process(es) {changed} only, of "
                f"{self.accelerator.num_processes}: every process must freeze and unfreeze the same "
                f"parameters at the same point (in a callback, or between train() calls, alike on "
                f"every process)."
            )
        # accelerate keeps the models it prepared (for its saves): the new wrapper replaces the old.
        self.accelerator._models[:] = [
            prepared for prepared in self.accelerator._models if prepared is not model
        ]
        self.model = self.accelerator.prepare_model(model.module)
        self.trainable = trainable_flags(self.model)
        return self.model


def trainable_flags(model: nn.Module) -> tuple[bool, ...]:
    return tuple(parameter.requires_grad for parameter in model.parameters())


def prepare_optimizer(accelerator: Accelerator, optimizer: Any) -> tuple[Any, bool]:
    """Prepare ``optimizer``; return what the loop should step, and whether it steps directly.

    Where accelerate's optimizer wrapper would only call through, the loop (and the scheduler)
    use the optimizer itself: the wrapper costs more than a small model's whole update
    (accelerate 1.15 searches sys.path for lomo_optim twice per ``step()``).
    """
    prepared = accelerator.prepare(optimizer)
    direct = accelerate_steps_pass_through(accelerator)
    # (prepared, direct): not a torch optimizer (stepped as it is), or accelerate's path
    return (
        (prepared.optimizer, True)
        if direct and isinstance(prepared, AcceleratedOptimizer)
        else (prepared, direct)
    )


def prepare_together(
    accelerator: Accelerator, model: nn.Module, optimizer: Any, train_loader: Any
) -> tuple[Any, Any, Any]:
    """Prepare model, optimizer (if any) and training loader (if not prepared yet) in one
    ``prepare`` call; return the three, each unchanged where it was not passed."""
    objects = [
        model,
        *([optimizer] if optimizer is not None else []),
        *([train_loader] if needs_preparing(train_loader) else []),
    ]
    prepared = list(accelerator.prepare(*objects)) if len(objects) > 1 else [accelerator.prepare(model)]
    model = prepared.pop(0)
    optimizer = prepared.pop(0) if optimizer is not None else None
    return model, optimizer, (prepared.pop(0) if prepared else train_loader)


def needs_preparing(dataloader: Any) -> bool:
    # accelerate's prepared loaders are DataLoader subclasses too; never wrap one twice.
    return isinstance(dataloader, DataLoader) and not isinstance(
        dataloader, (DataLoaderShard, DataLoaderDispatcher)
    )


#: Set-ups where ``Accelerator.backward`` and the prepared optimizer's ``step``/``zero_grad`` only
#: call through to torch. Not DeepSpeed, Megatron-LM or XLA, whose engines do the stepping, nor
#: FSDP, which stays on accelerate's path.
_PASS_THROUGH_DISTRIBUTED_TYPES = frozenset(
    getattr(DistributedType, name)
    for name in (
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "MULTI_HPU",
    )
    if hasattr(DistributedType, name)
)


def accelerate_steps_pass_through(accelerator: Accelerator) -> bool:
    """True where accelerate's backward and optimizer wrapper would add only their cost: no
    fp16 loss scaler, no LOMO optimizer, no accumulation by accelerate, plain data parallelism."""
    return (
        accelerator.scaler is None
        and not accelerator.has_lomo_optimizer
        and accelerator.gradient_accumulation_steps == 1
        and accelerator.distributed_type in _PASS_THROUGH_DISTRIBUTED_TYPES
    )
