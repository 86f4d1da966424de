"""DeepSeek-V4 on the Vulkan backend: config (config.json), checkpoints (Hugging Face model
directories), the float64 reference, device graphs, the token-by-token runner and text through the
checkpoint's tokenizer, conversations included (docs/model.md)."""
from .checkpoint import CheckpointError, QuantWeight, load_hf, save_hf, tensor_shapes
from .synthetic import random_weights, write_random
from .config import ConfigError, V4Config
from .reference import V4Reference
from .runner import Model, Sampling, SitePath
from .text import TextStream, Tokenizer, chat_prompt, chat_reply
from .chat import Chat, ChatTurn

__all__ = ["Chat", "ChatTurn", "CheckpointError", "ConfigError", "Model", "QuantWeight", "Sampling", "SitePath",
           "TextStream", "Tokenizer", "V4Config", "V4Reference", "chat_prompt", "chat_reply", "load_hf",
           "random_weights", "save_hf", "tensor_shapes", "write_random"]
