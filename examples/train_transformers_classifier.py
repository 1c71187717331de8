"""A transformers sequence classifier, trained with the model's own loss, on generated text.

The model is a small ``BertForSequenceClassification`` built from a ``BertConfig`` (no download),
and the task is generated offline: short "reviews" made of filler words and sentiment words,
labelled positive when they hold more positive than negative words. A word-level vocabulary
turns each review into token ids; the collate function pads each batch to its longest review and
returns a **dict batch** (``input_ids``, ``attention_mask``, ``labels``), which the Trainer
subclass passes straight to the model: ``outputs = self.model(**batch)``. The loss is the
model's own (``outputs.loss``), so the Trainer is created with ``loss_func=None``.

``num_items_in_batch`` with gradient accumulation: a fraction of the training reviews is
unlabelled (label -100, ``--unlabelled-fraction``). The model's cross-entropy ignores -100 and
averages over the labelled reviews of the batch only, so the loss of a batch is a mean over its
*labelled samples*, a number that differs from batch to batch and from process to process.
``calculate_train_batch_loss`` returns that count as ``num_items_in_batch`` (a tensor), and the
Trainer weights each batch by it: every update's gradient is then the mean over all labelled
reviews of its accumulation window on all processes, as one big batch would give, instead of
a mean of batch means that over-weights batches with few labels. (For a token-level loss, such
as a language model's, the count would be the number of non-padding target tokens.)

    python examples/train_transformers_classifier.py
    torchrun --nproc_per_node 2 examples/train_transformers_classifier.py
    python examples/train_transformers_classifier.py --epochs 2 --train-samples 256  # seconds
"""

import argparse
import os
import random
import time

import torch
from torch import optim
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback

POSITIVE = ["great", "good", "fun", "lovely", "brilliant", "superb", "enjoyable", "moving"]
NEGATIVE = ["bad", "dull", "awful", "boring", "poor", "weak", "tedious", "clumsy"]
FILLER = ["the", "film", "was", "and", "plot", "a", "cast", "with", "story", "quite", "very", "but", "ending"]
SPECIAL = ["[PAD]", "[CLS]"]
VOCABULARY = {word: index for index, word in enumerate(SPECIAL + FILLER + POSITIVE + NEGATIVE)}
IGNORE_INDEX = -100  # the label the model's cross-entropy ignores


def generate_reviews(num_samples, seed, unlabelled_fraction=0.0):
    """Return ``[(text, label)]``; label 1 when the review has more positive than negative words."""
    rng = random.Random(seed)
    reviews = []
    while len(reviews) < num_samples:
        num_positive, num_negative = rng.randint(0, 3), rng.randint(0, 3)
        if num_positive == num_negative:
            continue  # no ties: every review has a clear label
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 10))]
        words += rng.choices(POSITIVE, k=num_positive) + rng.choices(NEGATIVE, k=num_negative)
        rng.shuffle(words)
        label = int(num_positive > num_negative)
        if rng.random() < unlabelled_fraction:
            label = IGNORE_INDEX
        reviews.append((" ".join(words), label))
    return reviews


class ReviewDataset(Dataset):
    """Tokenised reviews: ``([CLS] + word ids, label)``."""

    def __init__(self, reviews):
        self.items = [
            (torch.tensor([VOCABULARY["[CLS]"]] + [VOCABULARY[word] for word in text.split()]), label)
            for text, label in reviews
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate_reviews(items):
    """Pad a batch to its longest review; return the model's keyword arguments as a dict."""
    length = max(len(tokens) for tokens, _ in items)
    input_ids = torch.full((len(items), length), VOCABULARY["[PAD]"], dtype=torch.long)
    attention_mask = torch.zeros(len(items), length, dtype=torch.long)
    for row, (tokens, _) in enumerate(items):
        input_ids[row, : len(tokens)] = tokens
        attention_mask[row, : len(tokens)] = 1
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def create_model(hidden_size, num_layers, max_length=16):
    config = BertConfig(
        vocab_size=len(VOCABULARY),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max_length,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


class TransformersTrainer(Trainer):
    """Calls the model with the dict batch and uses its own loss."""

    def calculate_train_batch_loss(self, batch):
        outputs = self.model(**batch)
        num_labelled = (batch["labels"] != IGNORE_INDEX).sum()
        loss = outputs.loss
        if num_labelled == 0:  # every review unlabelled: the model's mean is 0/0
            loss = outputs.logits.sum() * 0.0
        return {
            "loss": loss,  # the mean over the labelled reviews of the batch
            "model_outputs": outputs.logits,
            "batch_size": batch["input_ids"].size(0),
            "num_items_in_batch": num_labelled,
        }

    def calculate_eval_batch_loss(self, batch):
        with torch.no_grad():
            outputs = self.model(**batch)
        return {
            "loss": outputs.loss,
            "model_outputs": outputs.logits,
            "batch_size": batch["input_ids"].size(0),
        }


class AccuracyCallback(TrainerCallback):
    """Record the accuracy of each evaluation epoch as ``accuracy``, over every process's reviews."""

    def on_eval_epoch_start(self, trainer, **kwargs):
        self.correct, self.total = 0, 0

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        predictions = trainer.gather_for_metrics(batch_output["model_outputs"].argmax(dim=-1))
        labels = trainer.gather_for_metrics(batch["labels"])
        self.correct += int((predictions == labels).sum())
        self.total += len(labels)

    def on_eval_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("accuracy", self.correct / max(self.total, 1))


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-samples", type=int, default=2000)
    parser.add_argument("--eval-samples", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=16, help="reviews per batch on each process")
    parser.add_argument("--accumulation", type=int, default=2, help="gradient_accumulation_steps")
    parser.add_argument("--unlabelled-fraction", type=float, default=0.25)
    parser.add_argument("--hidden-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=42, help="data, initial weights, shuffling")
    return parser.parse_args()


def main():
    args = parse_args()
    start = time.perf_counter()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: extra intra-op threads only wait for each other
    train_dataset = ReviewDataset(generate_reviews(args.train_samples, args.seed, args.unlabelled_fraction))
    eval_dataset = ReviewDataset(generate_reviews(args.eval_samples, args.seed + 1))

    torch.manual_seed(args.seed)
    model = create_model(args.hidden_size, args.layers)
    trainer = TransformersTrainer(
        model,
        loss_func=None,  # the model computes its own loss from batch["labels"]
        optimizer=optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=(AccuracyCallback(), *DEFAULT_CALLBACKS),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation,
        collate_fn=collate_reviews,
        seed=args.seed,
    )
    history = trainer.run_history
    losses = " ".join(f"{loss:.4f}" for loss in history.get_metric_values("train_loss_epoch"))
    trainer.print(f"wall_time_s={time.perf_counter() - start:.1f}")
    trainer.print(f"TRAIN_LOSSES={losses}")
    trainer.print(
        f"FINAL processes={trainer.run_config.num_processes} "
        f"eval_loss={history.get_latest_metric('eval_loss_epoch'):.4f} "
        f"eval_accuracy={history.get_latest_metric('accuracy'):.4f}"
    )


if __name__ == "__main__":
    main()
