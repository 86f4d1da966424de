"""A DeepSeek-V4-shaped model on the Vulkan backend: config, checkpoints, float64 reference,
device graphs and the token-by-token runner (docs/model.md)."""
from .checkpoint import CheckpointError, load_checkpoint, random_weights, save
from .config import Config
from .reference import ReferenceModel
from .runner import Model, Sampling

__all__ = ["CheckpointError", "Config", "Model", "ReferenceModel", "Sampling", "load_checkpoint",
           "random_weights", "save"]
