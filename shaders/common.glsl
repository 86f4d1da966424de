// Shared helpers. Every kernel is launched on a grid folded into y past the 65535 x-limit
// (ops.base.grid_1d): the flat workgroup index is y * numGroups.x + x.
#extension GL_EXT_control_flow_attributes : enable

// The workgroup size x is specialization constant 0. Declared here, before any function uses
// gl_WorkGroupSize: glslang folds gl_WorkGroupSize to 1 in code that precedes the declaration.
layout(local_size_x_id = 0) in;

uint flat_group() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }
uint flat_index() { return flat_group() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; }

// C-order coordinates of flat index i in a 4-D shape (ne0 outermost, ne3 innermost).
uvec4 unravel4(uint i, uint ne0, uint ne1, uint ne2, uint ne3) {
    uint i3 = i % ne3; i /= ne3;
    uint i2 = i % ne2; i /= ne2;
    uint i1 = i % ne1;
    return uvec4(i / ne1, i1, i2, i3);
}

// Element index of coordinates c in a tensor with element offset off and strides s0..s3.
uint at4(uvec4 c, uint off, uint s0, uint s1, uint s2, uint s3) {
    return off + c.x * s0 + c.y * s1 + c.z * s2 + c.w * s3;
}
