"""A PyTorch Lightning script as people write it for torchrun: Trainer(strategy="ddp", accelerator="cpu").

torchrun --nproc-per-node=2 lightning_tiny.py --devices 2 --epochs 2 --root DIR
"""

import argparse

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--root", required=True)
    args = p.parse_args()

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.epochs,
        default_root_dir=args.root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(Tiny(), data)
    print(
        f"lightning rank {trainer.global_rank} of {trainer.world_size}: "
        f"{trainer.current_epoch} epochs, {trainer.global_step} steps, loss {trainer.callback_metrics['loss']:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
