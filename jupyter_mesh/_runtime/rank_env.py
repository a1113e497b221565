"""The environment a proc starts with: torchrun's variables, so SPMD code ports as is."""

from __future__ import annotations

import os
from typing import Any

from .._core.shape import Point, Shape

__all__ = ["set_rank_env"]


def set_rank_env(cfg: dict[str, Any]) -> None:
    """torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so SPMD code ports as is,
    and one GPU per proc along a ``gpus`` dim (unless the spawn's env chose CUDA_VISIBLE_DEVICES)."""
    shape = Shape.from_wire(cfg["shape"])
    rank = cfg["rank"]
    point = Point(rank, shape.extent)
    host_dims = cfg.get("host_dims", 1)
    local = (
        Shape.from_sizes(dict(zip(shape.labels[host_dims:], shape.slice.sizes[host_dims:])))
        if len(shape.labels) > host_dims
        else Shape.from_sizes({})
    )
    local_size = len(local)
    os.environ.update(
        JUPYTER_MESH_RANK=str(rank),
        RANK=str(rank),
        WORLD_SIZE=str(len(shape)),
        LOCAL_RANK=str(rank % local_size if local_size else 0),
        LOCAL_WORLD_SIZE=str(local_size or 1),
    )
    if "gpus" in shape.labels and "CUDA_VISIBLE_DEVICES" not in (cfg.get("env") or {}):
        gpu = point["gpus"]
        inherited = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = inherited[gpu] if gpu < len(inherited) else str(gpu)
