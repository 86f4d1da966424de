"""Compute pipelines cached per (shader, defines, specialization constants, subgroup requirements),
and descriptor sets cached per (layout, buffers).

Shader interface convention (every .comp in shaders/ follows it):
- set 0, bindings 0..n-1: storage buffers, bound whole; element offsets travel in push constants;
- specialization constant 0 is the workgroup size x (`layout(local_size_x_id = 0) in;`), further
  constants are the shader's own (listed in its header comment): `spec` gives constants 0, 1, ...
  by position, and defines that name a specialization constant (shader.specialize: LANES, ...) give
  theirs by name, at ids past the positional ones;
- push constants: at most 128 bytes.
"""
from .binding import check, ffi, lib, vk
from .errors import VulkanError
from .push import PUSH_SIZE, pack_fields, pack_push  # noqa: F401  (re-exported)
from .shader import compile_shader, specialize
from .spirv import workgroup_bytes

_FULL_SUBGROUPS = 0x2       # VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT
_ALLOW_VARYING = 0x1        # VK_PIPELINE_SHADER_STAGE_CREATE_ALLOW_VARYING_SUBGROUP_SIZE_BIT


class Pipeline:
    def __init__(self, key, handle, layout, set_layout, n_bindings, local_size):
        self.key, self.handle, self.layout, self.set_layout = key, handle, layout, set_layout
        self.n_bindings, self.local_size = n_bindings, local_size

    @property
    def name(self):
        return self.key[0]


class PipelineCache:
    def __init__(self, device):
        self.device = device
        self._pipelines = {}
        self._set_layouts = {}
        self._sets = {}         # key -> (set, descriptor pool)
        self._by_buffer = {}    # buffer serial -> keys of the sets binding it

    def _set_layout(self, n):
        if n not in self._set_layouts:
            binds = ffi.new("VkDescriptorSetLayoutBinding[]", n)
            for i in range(n):
                binds[i].binding = i
                binds[i].descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                binds[i].descriptorCount = 1
                binds[i].stageFlags = vk.VK_SHADER_STAGE_COMPUTE_BIT
            info = ffi.new("VkDescriptorSetLayoutCreateInfo*")
            info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO
            info.bindingCount = n
            info.pBindings = binds
            out = ffi.new("VkDescriptorSetLayout*")
            check(lib.vkCreateDescriptorSetLayout(self.device.device, info, ffi.NULL, out),
                  "vkCreateDescriptorSetLayout")
            sl = ffi.new("VkDescriptorSetLayout[]", [out[0]])
            pc = ffi.new("VkPushConstantRange*")
            pc.stageFlags = vk.VK_SHADER_STAGE_COMPUTE_BIT
            pc.offset = 0
            pc.size = min(PUSH_SIZE, self.device.caps.limits.max_push_constants)
            linfo = ffi.new("VkPipelineLayoutCreateInfo*")
            linfo.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO
            linfo.setLayoutCount = 1
            linfo.pSetLayouts = sl
            linfo.pushConstantRangeCount = 1
            linfo.pPushConstantRanges = pc
            lout = ffi.new("VkPipelineLayout*")
            check(lib.vkCreatePipelineLayout(self.device.device, linfo, ffi.NULL, lout), "vkCreatePipelineLayout")
            self._set_layouts[n] = (out[0], lout[0])
        return self._set_layouts[n]

    def get(self, shader, n_bindings, defines=None, spec=(), required_subgroup_size=None, full_subgroups=False):
        """The pipeline for `shaders/<shader>.comp`; spec[0] is the workgroup size x."""
        defines = dict(defines or {})
        spec = tuple(int(s) for s in spec)
        key = (shader, tuple(sorted((k, str(v)) for k, v in defines.items())), spec, n_bindings,
               required_subgroup_size, bool(full_subgroups))
        p = self._pipelines.get(key)
        if p is None:
            with self.device.lock:
                self.device.check_open()
                p = self._pipelines.get(key)
                if p is None:
                    p = self._pipelines[key] = self._create(key, shader, defines, spec, n_bindings,
                                                            required_subgroup_size, full_subgroups)
                if self.device.validation:
                    self.device.check_validation(f"creating pipeline {shader}")
        return p

    def _create(self, key, shader, defines, spec, n, req_sg, full):
        d = self.device.device
        defines, named = specialize(shader, defines)
        clash = sorted(i for i in named if i < len(spec))
        if clash:
            raise VulkanError(f"pipeline {shader}: specialization constants {clash} are given both by position "
                              f"(spec={spec}) and by a define naming them ({key[1]})")
        code = compile_shader(shader, defines)
        constants = [*enumerate(spec), *sorted(named.items())]
        shared, have = workgroup_bytes(code, dict(constants)), self.device.caps.limits.max_shared_memory
        if shared is not None and shared > have:      # (a driver may make it and lose the device running it)
            raise VulkanError(f"pipeline {shader} (defines {dict(key[1])}, spec {spec}) declares {shared} B of shared "
                              f"memory; {self.device.name} has {have} B (maxComputeSharedMemorySize)")
        minfo = ffi.new("VkShaderModuleCreateInfo*")
        minfo.sType = vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO
        cbuf = ffi.new("uint32_t[]", len(code) // 4)
        ffi.memmove(cbuf, code, len(code))
        minfo.codeSize = len(code)
        minfo.pCode = cbuf
        mod = ffi.new("VkShaderModule*")
        check(lib.vkCreateShaderModule(d, minfo, ffi.NULL, mod), f"vkCreateShaderModule({shader})")
        set_layout, layout = self._set_layout(n)
        keep = []
        stage = ffi.new("VkPipelineShaderStageCreateInfo*")
        stage.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO
        stage.stage = vk.VK_SHADER_STAGE_COMPUTE_BIT
        stage.module = mod[0]
        entry = ffi.new("char[]", b"main")
        stage.pName = entry
        if constants:
            entries = ffi.new("VkSpecializationMapEntry[]", len(constants))
            for i, (cid, _) in enumerate(constants):
                entries[i].constantID, entries[i].offset, entries[i].size = cid, 4 * i, 4
            data = ffi.new("uint32_t[]", [v for _, v in constants])
            sinfo = ffi.new("VkSpecializationInfo*")
            sinfo.mapEntryCount, sinfo.pMapEntries = len(constants), entries
            sinfo.dataSize, sinfo.pData = 4 * len(constants), data
            stage.pSpecializationInfo = sinfo
            keep += [entries, data, sinfo]
        sgc = self.device.caps.subgroup
        if full:
            if not sgc.full_subgroups:
                raise VulkanError(f"pipeline {shader} needs full subgroups, which {self.device.name} cannot require")
            stage.flags |= _FULL_SUBGROUPS
        if req_sg:
            if not (sgc.size_control and sgc.required_size_compute
                    and sgc.min_size <= req_sg <= sgc.max_size):
                raise VulkanError(f"pipeline {shader} requires subgroup size {req_sg}; {self.device.name} "
                                  f"supports {sgc.min_size}..{sgc.max_size} "
                                  f"(size control: {sgc.size_control})")
            rs = ffi.new("VkPipelineShaderStageRequiredSubgroupSizeCreateInfo*")
            rs.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO
            rs.requiredSubgroupSize = req_sg
            stage.pNext = rs
            keep.append(rs)
        cinfo = ffi.new("VkComputePipelineCreateInfo*")
        cinfo.sType = vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO
        cinfo.stage = stage[0]
        cinfo.layout = layout
        out = ffi.new("VkPipeline*")
        res = lib.vkCreateComputePipelines(d, ffi.NULL, 1, cinfo, ffi.NULL, out)
        lib.vkDestroyShaderModule(d, mod[0], ffi.NULL)
        check(res, f"vkCreateComputePipelines({shader})")
        return Pipeline(key, out[0], layout, set_layout, n, spec[0] if spec else 1)

    def descriptor_set(self, pipeline, bindings):
        """A descriptor set binding `bindings` at 0..n-1, cached by (layout, bindings).

        Each binding is a Buffer (bound whole), (Buffer, byte offset) or (Buffer, offset, range): the
        offset must be a multiple of the device's minStorageBufferOffsetAlignment (256 always is),
        and no range may exceed maxStorageBufferRange (ValueError: never bound past it)."""
        bindings = [b if isinstance(b, tuple) else (b, 0) for b in bindings]
        bindings = [(b[0], b[1], b[2] if len(b) > 2 else b[0].nbytes - b[1]) for b in bindings]
        key = (pipeline.n_bindings, tuple((b.serial, off, rng) for b, off, rng in bindings))
        hit = self._sets.get(key)
        if hit is not None:
            return hit[0]
        limit = self.device.caps.limits.max_storage_buffer_range
        for i, (b, off, rng) in enumerate(bindings):
            if rng > limit:
                raise ValueError(f"{pipeline.name}: binding {i} would span {rng} bytes, past this device's "
                                 f"maxStorageBufferRange of {limit} bytes ({self.device.name})")
        with self.device.lock:
            dset, pool = self.device.allocate_descriptor_set(pipeline.set_layout)
            n = len(bindings)
            infos = ffi.new("VkDescriptorBufferInfo[]", n)
            writes = ffi.new("VkWriteDescriptorSet[]", n)
            for i, (b, off, rng) in enumerate(bindings):
                infos[i].buffer, infos[i].offset, infos[i].range = b.handle, off, rng
                w = writes[i]
                w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
                w.dstSet, w.dstBinding, w.descriptorCount = dset, i, 1
                w.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                w.pBufferInfo = infos + i
            lib.vkUpdateDescriptorSets(self.device.device, n, writes, 0, ffi.NULL)
            self._sets[key] = (dset, pool)
            for b, _, _ in bindings:
                self._by_buffer.setdefault(b.serial, set()).add(key)
        return dset

    def forget_buffer(self, buf):
        """Free cached descriptor sets that reference `buf` (before it is destroyed)."""
        with self.device.lock:
            for key in self._by_buffer.pop(buf.serial, ()):
                hit = self._sets.pop(key, None)
                if hit is not None:
                    self.device.free_descriptor_set(hit[1], hit[0])

    def destroy(self):
        d = self.device.device
        for p in self._pipelines.values():
            lib.vkDestroyPipeline(d, p.handle, ffi.NULL)
        for sl, pl in self._set_layouts.values():
            lib.vkDestroyPipelineLayout(d, pl, ffi.NULL)
            lib.vkDestroyDescriptorSetLayout(d, sl, ffi.NULL)
        self._pipelines.clear()
        self._set_layouts.clear()
        self._sets.clear()
        self._by_buffer.clear()
