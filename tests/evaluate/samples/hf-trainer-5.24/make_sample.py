"""How the files beside this one were made: Transformers 5.24.0 + Accelerate 1.15.0 on the CPU, run in out/.

Evaluation each epoch (8 steps), a checkpoint every 10 steps, 24 steps; then trainer.save_state(). Kept as the
record of the sample (not a test: it needs accelerate, which Musubi's venv has not).
"""

import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainingArguments

torch.manual_seed(0)


class Points(torch.utils.data.Dataset):
    """Label: the sign of the first coordinate, with noise."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] + 0.8 * torch.randn(n, generator=g) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class Linear(nn.Module):
    """A linear classifier returning the loss the Trainer expects."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.fc(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def accuracy(p) -> dict:
    return {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())}


args = TrainingArguments("out", num_train_epochs=3, per_device_train_batch_size=8, eval_strategy="epoch",
                         save_strategy="steps", save_steps=10, report_to=[], use_cpu=True, logging_steps=4,
                         learning_rate=0.05, seed=0)
trainer = Trainer(Linear(), args, train_dataset=Points(64, 1), eval_dataset=Points(32, 2), compute_metrics=accuracy)
trainer.train()
trainer.save_state()
