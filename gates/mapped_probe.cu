// The mapped-tail probe: one virtual address range, device memory then pinned host memory (CUDA VMM), as
// 0073's buffer type builds it; prints the attributes, kernel read/write bandwidth of each part, copies and a
// memset across the boundary, and the pinned cudaMemcpy rate beside them.
// build and run on the GPU machine: nvcc -arch=sm_90 -O2 gates/mapped_probe.cu -o mapped_probe -lcuda && ./mapped_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); printf("FAIL %s: %s\n", #x, s); return 1; } } while (0)
#define RK(x) do { cudaError_t r = (x); if (r != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorString(r)); return 1; } } while (0)

__global__ void rd(const int4 * p, size_t n, int * out) {
    int acc = 0;
    for (size_t i = blockIdx.x*(size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x*blockDim.x) {
        int4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffffff) *out = acc;
}
__global__ void wr(int4 * p, size_t n) {
    for (size_t i = blockIdx.x*(size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x*blockDim.x) {
        p[i] = make_int4(i, i, i, i);
    }
}

int main() {
    RK(cudaSetDevice(0)); RK(cudaFree(0));
    int drv; cuDriverGetVersion(&drv); printf("driver %d\n", drv);
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    int a141=-1, a145=-1, numa=-1, a102=-1;
    cuDeviceGetAttribute(&a102, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cuDeviceGetAttribute(&a141, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cuDeviceGetAttribute(&a145, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
    printf("vmm %d host_numa_vmm %d host_vmm %d host_numa_id %d\n", a102, a141, a145, numa);
    for (int loc = 0; loc < 2; ++loc) {
        CUmemAllocationProp pd = {}; pd.type = CU_MEM_ALLOCATION_TYPE_PINNED; pd.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pd.location.id = 0;
        CUmemAllocationProp ph = {}; ph.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        if (loc == 0) { ph.location.type = CU_MEM_LOCATION_TYPE_HOST; ph.location.id = 0; }
        else { ph.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; ph.location.id = numa < 0 ? 0 : numa; }
        size_t gd, gh; CK(cuMemGetAllocationGranularity(&gd, &pd, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        CUresult rg = cuMemGetAllocationGranularity(&gh, &ph, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (rg != CUDA_SUCCESS) { const char*s; cuGetErrorString(rg,&s); printf("loc %d host granularity: %s\n", loc, s); continue; }
        printf("loc %d gran dev %zu host %zu\n", loc, gd, gh);
        size_t nd = 1ull<<30, nh = 3ull<<30;
        CUdeviceptr va; CK(cuMemAddressReserve(&va, nd+nh, 0, 0, 0));
        CUmemGenericAllocationHandle hd, hh;
        CK(cuMemCreate(&hd, nd, &pd, 0));
        CUresult rc = cuMemCreate(&hh, nh, &ph, 0);
        if (rc != CUDA_SUCCESS) { const char*s; cuGetErrorString(rc,&s); printf("loc %d host cuMemCreate: %s\n", loc, s); continue; }
        CK(cuMemMap(va, nd, 0, hd, 0)); CK(cuMemMap(va+nd, nh, 0, hh, 0));
        CUmemAccessDesc ad = {}; ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE; ad.location.id = 0; ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CK(cuMemSetAccess(va, nd+nh, &ad, 1));
        int * out; RK(cudaMalloc(&out, 4));
        wr<<<1024, 256>>>((int4*)va, (nd+nh)/16); RK(cudaDeviceSynchronize());
        // cudaMemcpy into both parts, read back
        std::vector<char> hb(1<<20, 7); RK(cudaMemcpy((void*)(va+nd+12345), hb.data(), hb.size(), cudaMemcpyHostToDevice));
        std::vector<char> hc(1<<20, 0); RK(cudaMemcpy(hc.data(), (void*)(va+nd+12345), hc.size(), cudaMemcpyDeviceToHost));
        printf("memcpy roundtrip %s\n", hc == hb ? "ok" : "MISMATCH");
        {   // a copy and a memset that span the device/host boundary of the range
            const size_t n = 8u<<20; std::vector<char> a(n), b(n, 0);
            for (size_t i = 0; i < n; ++i) a[i] = (char)(i*7 + 3);
            char * mid = (char*)(va + nd - n/2);
            RK(cudaMemcpy(mid, a.data(), n, cudaMemcpyHostToDevice)); RK(cudaMemcpy(b.data(), mid, n, cudaMemcpyDeviceToHost));
            printf("spanning memcpy %s\n", a == b ? "ok" : "MISMATCH");
            RK(cudaMemsetAsync(mid, 0x5a, n, cudaStreamPerThread)); RK(cudaStreamSynchronize(cudaStreamPerThread));
            RK(cudaMemcpy(b.data(), mid, n, cudaMemcpyDeviceToHost));
            bool ok = true; for (size_t i = 0; i < n; ++i) ok = ok && b[i] == 0x5a;
            printf("spanning memset %s\n", ok ? "ok" : "MISMATCH");
        }
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        for (int part = 0; part < 2; ++part) {
            const int4 * p = (const int4*)(part == 0 ? va : va + nd); size_t n = (part == 0 ? nd : nh)/16;
            for (int grid : {132, 528, 2112}) for (int rep = 0; rep < 3; ++rep) {
                cudaEventRecord(e0); rd<<<grid, 512>>>(p, n, out); cudaEventRecord(e1); RK(cudaEventSynchronize(e1));
                float ms; cudaEventElapsedTime(&ms, e0, e1);
                if (rep == 2) printf("loc %d part %s grid %d: %.1f GB/s\n", loc, part ? "host" : "dev", grid, n*16/ms/1e6);
            }
        }
        // write bandwidth into host part
        cudaEventRecord(e0); wr<<<528, 512>>>((int4*)(va+nd), nh/16); cudaEventRecord(e1); RK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1); printf("loc %d host write: %.1f GB/s\n", loc, nh/ms/1e6);
        // pinned memcpy reference
        void * hp; RK(cudaMallocHost(&hp, nh)); void * dp; RK(cudaMalloc(&dp, nh));
        for (int rep = 0; rep < 3; ++rep) { cudaEventRecord(e0); cudaMemcpy(dp, hp, nh, cudaMemcpyHostToDevice); cudaEventRecord(e1); cudaEventSynchronize(e1); }
        cudaEventElapsedTime(&ms, e0, e1); printf("pinned H2D memcpy: %.1f GB/s\n", nh/ms/1e6);
        cudaFreeHost(hp); cudaFree(dp);
        CK(cuMemUnmap(va, nd+nh)); CK(cuMemRelease(hd)); CK(cuMemRelease(hh)); CK(cuMemAddressFree(va, nd+nh));
    }
    printf("done\n");
    return 0;
}
