"""The Vulkan layer: the only code in dsv4_vk that imports `vulkan`."""
from .errors import DeviceClosed, ShaderCompileError, ValidationError, VulkanError, VulkanUnavailable
from .device import Device, default_device
from .instance import list_devices
from .memory import Buffer, BufferPool
from .tensor import Tensor
from .upload import Upload
from .pipeline import Pipeline, pack_push, PUSH_SIZE
from .recorder import Recorder, Recording
from .shader import compile_shader, compiler, SHADER_DIR

__all__ = ["Buffer", "BufferPool", "Device", "DeviceClosed", "Pipeline", "PUSH_SIZE", "Recorder", "Recording",
           "SHADER_DIR", "ShaderCompileError", "Tensor", "Upload", "ValidationError", "VulkanError", "VulkanUnavailable",
           "compile_shader", "compiler", "default_device", "list_devices", "pack_push"]
