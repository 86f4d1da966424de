// Diagnostic beside tools/mem_probe.py: the same vec4 copy through CUDA, to tell whether a slow
// Vulkan copy on the GPU machine is the machine's memory state or something of the Vulkan path.
//   nvcc -O2 -o /tmp/cuda_copy tools/cuda_copy.cu && /tmp/cuda_copy 1024 4
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void copy4(const float4* __restrict__ s, float4* __restrict__ d, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
}

int main(int argc, char** argv) {
    size_t mib = argc > 1 ? atoi(argv[1]) : 1024;
    int rounds = argc > 2 ? atoi(argv[2]) : 4;
    size_t bytes = mib << 20, n4 = bytes / 16;
    for (int r = 0; r < rounds; ++r) {           // fresh buffers each round, like mem_probe
        float4 *s, *d;
        cudaMalloc(&s, bytes);
        cudaMalloc(&d, bytes);
        cudaMemset(s, 0x3f, bytes);
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        copy4<<<132 * 16, 256>>>(s, d, n4);
        float best = 1e30f;
        for (int k = 0; k < 10; ++k) {
            cudaEventRecord(a);
            copy4<<<132 * 16, 256>>>(s, d, n4);
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            float ms;
            cudaEventElapsedTime(&ms, a, b);
            if (ms < best) best = ms;
        }
        printf("cuda copy %zu MiB round %d: %.0f GB/s (best of 10)\n", mib, r, 2.0 * bytes / (best * 1e6));
        cudaFree(s);
        cudaFree(d);
    }
    return cudaGetLastError() != cudaSuccess;
}
