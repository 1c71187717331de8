"""A transformers sequence classifier trained with the model's own loss, as the original's
transformers example does: a config-built ``BertForSequenceClassification`` (tiny sizes, no
download), dict batches from a collate function, and a Trainer subclass whose
``calculate_train_batch_loss`` / ``calculate_eval_batch_loss`` call ``model(**batch)`` and use
``outputs.loss``.
"""

import torch
from torch import optim
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification

from pytorch_accelerated import Trainer

VOCAB_SIZE, SEQ_LEN = 32, 12


class TokenSequences(Dataset):
    """Label 1 when token 5 occurs in the sequence, else 0; lengths vary (padded by the collate)."""

    def __init__(self, num_samples, seed):
        generator = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(num_samples):
            length = int(torch.randint(4, SEQ_LEN + 1, (1,), generator=generator))
            tokens = torch.randint(6, VOCAB_SIZE, (length,), generator=generator)
            label = i % 2
            if label:
                tokens[int(torch.randint(0, length, (1,), generator=generator))] = 5
            self.items.append((tokens, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate(items):
    input_ids = torch.zeros(len(items), SEQ_LEN, dtype=torch.long)
    attention_mask = torch.zeros(len(items), SEQ_LEN, dtype=torch.long)
    for row, (tokens, _) in enumerate(items):
        input_ids[row, : len(tokens)] = tokens
        attention_mask[row, : len(tokens)] = 1
    labels = torch.tensor([label for _, label in items])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class TransformersTrainer(Trainer):
    def calculate_train_batch_loss(self, batch):
        outputs = self.model(**batch)
        return {
            "loss": outputs.loss,
            "model_outputs": outputs.logits,
            "batch_size": batch["input_ids"].size(0),
        }

    def calculate_eval_batch_loss(self, batch):
        with torch.no_grad():
            outputs = self.model(**batch)
        return {
            "loss": outputs.loss,
            "model_outputs": outputs.logits,
            "batch_size": batch["input_ids"].size(0),
        }


def main():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ_LEN,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    trainer = TransformersTrainer(
        model=model, loss_func=None, optimizer=optim.AdamW(model.parameters(), lr=3e-3)
    )
    trainer.train(
        train_dataset=TokenSequences(64, seed=0),
        eval_dataset=TokenSequences(16, seed=1),
        num_epochs=2,
        per_device_batch_size=8,
        collate_fn=collate,
        gradient_accumulation_steps=2,
    )
    losses = trainer.run_history.get_metric_values("train_loss_epoch")
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses))), losses
    if trainer.run_config.is_world_process_zero:
        print(
            f"COMPAT OK transformers_classifier eval_loss={trainer.run_history.get_latest_metric('eval_loss_epoch'):.4f}"
        )


if __name__ == "__main__":
    main()
