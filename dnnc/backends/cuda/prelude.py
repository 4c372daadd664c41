"""The device functions every rendered CUDA module starts with (`PRELUDE`: half conversions,
NaN-propagating min / max, the run-time index check, the dynamic shared-memory pool), those
of the tensor cores (`MMA_PRELUDE`: operand conversions, mma.sync, ldmatrix, cp.async) and
those of Hopper's warpgroup products (`WGMMA_PRELUDE`: matrix descriptors, wgmma.mma_async,
its fence, groups and wait, the async-proxy fence; sm_90a only, the module then holds the
line `ARCH_SPECIFIC`) and TMA's (`TMA_PRELUDE`: tensor-map copies, sm_90a), as CUDA C
with inline PTX that NVRTC compiles without any header.

`codegen.py` renders calls of them and decides which a module holds; this module is only
their text and must never render or decide anything. The host-C++ shim of
tests/backends/cuda/test_host_semantics.py replaces each with an emulation: keep the names
and signatures in step with it.
"""

PRELUDE = r"""// dnnc: CUDA C for NVRTC (built-in headers only)
#define DNNC_SHARED_POOL(name, bytes) extern __shared__ __align__(1024) unsigned char name[]
// every kernel's first statement: wait for the grids it depends on (complete, their writes
// visible) before any global access (programmatic.py; sm_90 and later)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DNNC_GRID_DEPENDENCY() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define DNNC_GRID_DEPENDENCY()
#endif
__device__ __forceinline__ float dnnc_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short dnnc_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// bfloat16 <-> float32 as legalize's bf16_cast: to nearest even, a NaN stays a quiet NaN of its
// sign and payload (cvt.rn.bf16.f32, sm_80 on, gives one canonical NaN)
__device__ __forceinline__ unsigned short dnnc_f2bf(float f) {
  const unsigned u = __float_as_uint(f);
  if (f != f) return (unsigned short)((u | 0x400000u) >> 16);
#if __CUDA_ARCH__ >= 800
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ float dnnc_bf2f(unsigned short h) {
  return __uint_as_float((unsigned)h << 16);
}
// L.dot_u8s8x4: acc + the products of a's unsigned and b's signed bytes (dp4a, sm_61+)
__device__ __forceinline__ int dnnc_dp4a(int acc, unsigned a, unsigned b) {
  int d; asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc)); return d;
}
// L.load_word: the 4 bytes at p (4-byte aligned) as one word, by ld.global.cg (through L2):
// ptxas keeps it where it is, where it moves a read-only (ld.global.nc) load down to its use
__device__ __forceinline__ unsigned dnnc_load_word(const void* p) {
  return __ldcg(static_cast<const unsigned*>(p));
}
// NaN-propagating, as NumPy's maximum / minimum (fmaxf would drop the NaN)
template <typename T> __device__ __forceinline__ T dnnc_fmax(T a, T b) {
  return a != a ? a : b != b ? b : a > b ? a : b;
}
template <typename T> __device__ __forceinline__ T dnnc_fmin(T a, T b) {
  return a != a ? a : b != b ? b : a < b ? a : b;
}
// the same where b is no NaN (codegen's _BINARY_BY_NUMBER): a if a is NaN or beyond b, else
// b, as one unordered compare (!(a <= b): NaN or greater) and a select
template <typename T> __device__ __forceinline__ T dnnc_fmax_k(T a, T b) {
  return !(a <= b) ? a : b;
}
template <typename T> __device__ __forceinline__ T dnnc_fmin_k(T a, T b) {
  return !(a >= b) ? a : b;
}
// an 8-bit integer to float32 without the conversion pipe (I2F: 16 a clock an SM, adds 128):
// 2**23 + 128 + b (int8) or 2**23 + b (uint8) as bits (an integer add or or), less that
// offset; the difference of two of one type (a dequantization's x - zero point) is that of
// their bits' floats, exact (both in [2**23, 2**24))
__device__ __forceinline__ float dnnc_s8_bits(signed char b) {
  return __int_as_float(0x4B000080 + b);
}
__device__ __forceinline__ float dnnc_u8_bits(unsigned char b) {
  return __uint_as_float(0x4B000000u | b);
}
__device__ __forceinline__ float dnnc_s8_to_f32(signed char b) {
  return dnnc_s8_bits(b) - 8388736.0f;
}
__device__ __forceinline__ float dnnc_u8_to_f32(unsigned char b) {
  return dnnc_u8_bits(b) - 8388608.0f;
}
template <typename T> __device__ __forceinline__ T dnnc_imax(T a, T b) { return a > b ? a : b; }
template <typename T> __device__ __forceinline__ T dnnc_imin(T a, T b) { return a < b ? a : b; }
// a gather index outside [-n, n-1] (one unsigned compare): (site + 1, i, n) into the error
// record unless an error is there (atomicCAS: the first of a call wins); i goes on as it is
__device__ __forceinline__ long long dnnc_check_index(long long i, long long n, long long site,
                                                      long long* errors) {
  if (__builtin_expect((unsigned long long)(i + n) >= (unsigned long long)(2 * n), 0) &&
      atomicCAS((unsigned long long*)errors, 0ull, (unsigned long long)(site + 1)) == 0ull) {
    errors[1] = i;
    errors[2] = n;
  }
  return i;
}
"""

_MMA_FUNCTION = r"""
__device__ __forceinline__ void dnnc_mma_{name}(float* d, unsigned a0, unsigned a1, unsigned a2,
                                              unsigned a3, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx}.{ptx}.f32 "
               "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}
"""[1:]
"""One precision's `dnnc_mma_<name>`: mma.sync m16n8k<k> on <ptx> operands, fp32
accumulators (`L.MMA_SHAPES`), as MMA_PRELUDE spells it for tf32, fp16 and bf16."""

_SPARSE_MMA_FUNCTION = r"""
__device__ __forceinline__ void dnnc_mma_{name}(float* d, unsigned a0, unsigned a1, unsigned a2,
                                              unsigned a3, unsigned b0, unsigned b1,
                                              unsigned b2, unsigned b3, unsigned e) {{
  asm volatile("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{ptx}.{ptx}.f32 "
               "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9, %10, %11}}, "
               "{{%0, %1, %2, %3}}, %12, 0x0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(b2), "r"(b3),
                 "r"(e));
}}
"""[1:]
"""A sparse precision's `dnnc_mma_<name>` (`L.SPARSE_MMA`): mma.sp::ordered_metadata
m16n8k32 on <ptx> operands, A 2:4 sparse with its metadata `e` (each group's two positions
ascending) from the first two lanes of each quad (sparsity selector 0), fp32 accumulators."""
_INTEGER_MMA_FUNCTION = r"""
__device__ __forceinline__ void dnnc_mma_{name}(int* d, unsigned a0, unsigned a1, unsigned a2,
                                              unsigned a3, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.{name}.s8.s32 "
               "{{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}
"""[1:]
"""`dnnc_mma_s8` / `dnnc_mma_u8`: mma.sync m16n8k32 of s8 / u8 A bytes and s8 B bytes into
int32 accumulators (`L.INTEGER_MMA`; sm_80 and newer)."""

_LDMATRIX_FUNCTION = r"""
__device__ __forceinline__ void dnnc_ldmatrix_x{n}{suffix}(unsigned* d, const unsigned* p) {{
  asm volatile("ldmatrix.sync.aligned.m8n8.x{n}{ptx}.shared.b16 {{{regs}}}, [%{n}];"
               : {outs} : "r"(dnnc_shared_address(p)));
}}
"""[1:]


def _ldmatrix(n: int, trans: bool) -> str:
    """`dnnc_ldmatrix_x<n>[_trans]`: a warp's ldmatrix of `n` 8 x 8 matrices."""
    return _LDMATRIX_FUNCTION.format(
        n=n, suffix="_trans" if trans else "", ptx=".trans" if trans else "",
        regs=", ".join(f"%{i}" for i in range(n)),
        outs=", ".join(f'"=r"(d[{i}])' for i in range(n)))


MMA_PRELUDE = r"""// tensor cores (sm_80+): operand registers rounded as PTX asks; a warp's mma.sync
__device__ __forceinline__ unsigned dnnc_tf32(float x) {
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
// two fp32 in one register of 16-bit halves, lo in bits 0-15 (cvt puts its first source high)
__device__ __forceinline__ unsigned dnnc_f16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned dnnc_bf16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
""" + "".join(_MMA_FUNCTION.format(name=name, k=k, ptx=ptx) for name, k, ptx in (
    ("tf32", 8, "tf32"), ("fp16", 16, "f16"), ("bf16", 16, "bf16"))) + "".join(
    _SPARSE_MMA_FUNCTION.format(name=name, ptx=ptx) for name, ptx in (
        ("sp_fp16", "f16"), ("sp_bf16", "bf16"))) + "".join(
    _INTEGER_MMA_FUNCTION.format(name=name) for name in ("s8", "u8")) + r"""
// a generic address of shared memory as the 32-bit shared-window address PTX's
// ldmatrix and cp.async take
__device__ __forceinline__ unsigned dnnc_shared_address(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);   // (not asm: the compiler folds it)
}
// a warp's ldmatrix: each lane's row address, `n` registers of 16-bit pairs
"""[1:] + "".join(_ldmatrix(n, trans) for trans in (False, True) for n in (1, 2, 4)) + r"""
// 16 bytes global -> shared, the first `bytes` of them read, the rest zero
__device__ __forceinline__ void dnnc_cp_async(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dnnc_shared_address(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void dnnc_cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void dnnc_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
"""[1:]
"""What `L.Mma`, `L.LdMatrix`, `L.CopyAsync` (and its commit and wait) and the `L.PACKS`
intrinsics render to (`dnnc_mma_<precision>(acc + offset, a0..a3, b0, b1)`, a sparse
precision's `(acc + offset, a0..a3, b0..b3, e)`; `dnnc_tf32(x)`, `dnnc_f16x2(lo, hi)`,
`dnnc_bf16x2(lo, hi)`): added after `PRELUDE` to a module that uses them."""

ARCH_SPECIFIC = "// dnnc: sm_90a (wgmma)\n"
"""The first line of a module using `WGMMA_PRELUDE`: its architecture-specific instructions
need NVRTC's `sm_90a` where the device says `sm_90` (`device.compile_arch`)."""

WGMMA_N = (64, 128, 192, 256)
"""The n of the `dnnc_wgmma_<precision>_n<n>` functions WGMMA_PRELUDE defines."""

_WGMMA_FUNCTION = r"""
template <int TA, int TB> __device__ __forceinline__ void dnnc_wgmma_{name}_n{n}(
    float* d, unsigned long long a, unsigned long long b) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{one}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx}.{ptx} "
               "{{{d}}}, %{da}, %{db}, p, 1, 1{trans}; }}"
               : {outs}
               : "l"(a), "l"(b), "r"(1){imms});
}}
"""[1:]


_WGMMA_INTEGER_FUNCTION = r"""
template <int TA, int TB> __device__ __forceinline__ void dnnc_wgmma_{name}_n{n}(
    int* d, unsigned long long a, unsigned long long b) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{one}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k32.s32.{name}.s8 "
               "{{{d}}}, %{da}, %{db}, p; }}"
               : {outs}
               : "l"(a), "l"(b), "r"(1));
}}
"""[1:]
"""The integer precisions' (s8 or u8 A, s8 B: K-major only, no transposes; TA, TB unused):
int32 accumulators, exact sums."""


def _wgmma_integer_function(name: str, n: int) -> str:
    count = n // 2
    return _WGMMA_INTEGER_FUNCTION.format(
        name=name, n=n, d=", ".join(f"%{i}" for i in range(count)), da=count, db=count + 1,
        one=count + 2, outs=", ".join(f'"+r"(d[{i}])' for i in range(count)))


_SPARSE_WGMMA_FUNCTION = r"""
template <int TA, int TB> __device__ __forceinline__ void dnnc_wgmma_{name}_n{n}(
    float* d, unsigned long long a, unsigned long long b, unsigned e) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{one}, 0;\n"
               "wgmma.mma_async.sp.sync.aligned.m64n{n}k32.f32.{ptx}.{ptx} "
               "{{{d}}}, %{da}, %{db}, %{de}, 0, p, 1, 1, %{ta}, %{tb}; }}"
               : {outs}
               : "l"(a), "l"(b), "r"(e), "r"(1), "n"(TA), "n"(TB));
}}
"""[1:]
"""A sparse precision's (`L.SPARSE_MMA`: A 2:4 sparse, its kept values in A's layout; the
metadata `e` from lanes q < 2 of each quad, sparsity selector 0): fp32 accumulators."""


def _sparse_wgmma_function(name: str, n: int, ptx: str) -> str:
    count = n // 2
    return _SPARSE_WGMMA_FUNCTION.format(
        name=name, n=n, ptx=ptx, d=", ".join(f"%{i}" for i in range(count)), da=count,
        db=count + 1, de=count + 2, one=count + 3, ta=count + 4, tb=count + 5,
        outs=", ".join(f'"+f"(d[{i}])' for i in range(count)))


def _wgmma_function(name: str, n: int, k: int, ptx: str) -> str:
    """`dnnc_wgmma_<name>_n<n><TA, TB>(d, desc a, desc b)`: D (n / 2 registers from d) += A B
    (TA, TB: A, B MN-major; tf32 has no transposes)."""
    count = n // 2
    trans = ", %{}, %{}".format(count + 3, count + 4) if ptx != "tf32" else ""
    imms = ', "n"(TA), "n"(TB)' if ptx != "tf32" else ""
    return _WGMMA_FUNCTION.format(
        name=name, n=n, k=k, ptx=ptx, d=", ".join(f"%{i}" for i in range(count)),
        da=count, db=count + 1, one=count + 2, trans=trans, imms=imms,
        outs=", ".join(f'"+f"(d[{i}])' for i in range(count)))


WGMMA_PRELUDE = ARCH_SPECIFIC + r"""// warpgroups (sm_90a): wgmma.mma_async on shared operands
// a matrix descriptor: start address, leading and stride byte offsets (16-byte units), the
// 128-byte swizzle (mode 1 in bits 62-63), base offset 0
__device__ __forceinline__ unsigned long long dnnc_wgmma_desc(const void* p, unsigned leading,
                                                              unsigned stride) {
  return (unsigned long long)((dnnc_shared_address(p) & 0x3ffff) >> 4) |
         (unsigned long long)(leading >> 4) << 16 | (unsigned long long)(stride >> 4) << 32 |
         1ull << 62;
}
__device__ __forceinline__ void dnnc_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void dnnc_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// wait, then the accumulators read after it (the compiler may not move their reads above)
template <int N, int COUNT> __device__ __forceinline__ void dnnc_wgmma_wait(float* d) {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}
template <int N, int COUNT> __device__ __forceinline__ void dnnc_wgmma_wait(int* d) {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#pragma unroll
  for (int i = 0; i < COUNT; ++i) asm volatile("" : "+r"(d[i]) :: "memory");
}
__device__ __forceinline__ void dnnc_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// every thread of the cluster's blocks: shared memory written before is seen by all after
__device__ __forceinline__ void dnnc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// this thread's warp, as lane 0 says: a value ptxas knows the same on every lane (a
// guard of whole warps around a wgmma: see codegen's gpu_for)
__device__ __forceinline__ unsigned dnnc_warp_index() {
  return __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
}
// mbarriers (L.Mbarrier): a 64-bit object in shared memory counting arrivals a phase
__device__ __forceinline__ void dnnc_mbarrier_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
               :: "r"(dnnc_shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void dnnc_mbarrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];"
               :: "r"(dnnc_shared_address(bar)) : "memory");
}
// an arrival once every cp.async this thread issued before has landed (counted at init)
__device__ __forceinline__ void dnnc_mbarrier_copy_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
               :: "r"(dnnc_shared_address(bar)) : "memory");
}
// until the phase of `parity` has completed (acquire)
__device__ __forceinline__ void dnnc_mbarrier_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\n.reg .pred done;\nDNNC_MBARRIER_WAIT:\n"
               "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra DNNC_MBARRIER_WAIT;\n}"
               :: "r"(dnnc_shared_address(bar)), "r"(parity) : "memory");
}
// the float at shared p's offset in the shared memory of block `rank` of this cluster: a
// plain load through the generic address `mapa` gives (ordered by the cluster barriers'
// memory clobbers; free to be issued together with its neighbours). Clusters are sm_90's:
// NVRTC 13.5 declares the intrinsic for sm_90 and later only, so a module compiled for an
// earlier GPU (whose kernels never take a cluster) gets a body that traps
__device__ __forceinline__ float dnnc_cluster_load(const float* p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
  return *static_cast<const float*>(__cluster_map_shared_rank(p, rank));
#else
  __trap();
  return 0.0f;
#endif
}
""" + "".join(_wgmma_function(name, n, k, ptx) for name, k, ptx in (
    ("tf32", 8, "tf32"), ("fp16", 16, "f16"), ("bf16", 16, "bf16")) for n in WGMMA_N) + \
    "".join(_wgmma_integer_function(name, n) for name in ("s8", "u8") for n in WGMMA_N) + \
    "".join(_sparse_wgmma_function(name, n, ptx) for name, ptx in (
        ("sp_fp16", "f16"), ("sp_bf16", "bf16")) for n in WGMMA_N)
"""What `L.Wgmma` and its fence, commit and wait, `L.ProxyFence`, `L.ClusterBarrier`,
`L.Mbarrier` and `cluster_load` render to, added after
MMA_PRELUDE (whose `dnnc_shared_address` it uses) to a module that uses them (a sparse
precision's `dnnc_wgmma_sp_<p>_n<n><TA, TB>(&acc, desc a, desc b, metadata)`)."""

TMA_PRELUDE = r"""// TMA (sm_90a): tensor-map bulk copies into shared memory, counted on an mbarrier
// in bytes (tensor_map.py builds the maps on the host)
// the mbarriers' inits seen by the async proxy (the TMA unit) before a copy counts on them
__device__ __forceinline__ void dnnc_fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// this thread's arrival on `bar`, and `bytes` more the phase awaits from copies
__device__ __forceinline__ void dnnc_mbarrier_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;"
               :: "r"(dnnc_shared_address(bar)), "r"(bytes) : "memory");
}
// the box of 3-d tensor map `map` (a generic address: a __grid_constant__ parameter's or
// global memory's) at element coordinates (x innermost, y, z) into shared `dst` (1024-byte
// aligned for the 128-byte swizzle), its bytes completing on `bar`
__device__ __forceinline__ void dnnc_tma_load_3d(void* dst, const void* map,
                                                 unsigned long long* bar, int x, int y, int z) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4}], [%5];"
               :: "r"(dnnc_shared_address(dst)), "l"(map), "r"(x), "r"(y), "r"(z),
                  "r"(dnnc_shared_address(bar)) : "memory");
}
// the box of 4-d im2col tensor map `map` (NHWC: c innermost, w, h, n) whose first pixel
// is at (c, w, h, n), every pixel read at its position plus the filter tap (dw, dh)
__device__ __forceinline__ void dnnc_tma_load_im2col_4d(void* dst, const void* map,
                                                        unsigned long long* bar, int c, int w,
                                                        int h, int n, int dw, int dh) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx"
               "::bytes [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};"
               :: "r"(dnnc_shared_address(dst)), "l"(map), "r"(c), "r"(w), "r"(h), "r"(n),
                  "r"(dnnc_shared_address(bar)), "h"((unsigned short)dw),
                  "h"((unsigned short)dh) : "memory");
}
__device__ __forceinline__ void dnnc_prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory");
}
// one lane of the (whole, converged) warp elected: true there only
__device__ __forceinline__ bool dnnc_elect_one() {
  unsigned elected;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}"
               : "=r"(elected));
  return elected != 0;
}
// a warpgroup's registers a thread raised to / lowered to N (a multiple of 8, 24..256):
// the producer gives its registers to the consumers
template <int N> __device__ __forceinline__ void dnnc_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N));
}
template <int N> __device__ __forceinline__ void dnnc_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N));
}
"""
"""TMA's copies, their mbarrier byte counts and the warp specialisation's register split,
after WGMMA_PRELUDE (whose shared addresses and mbarriers they use): what `L.TmaLoad` and an
"expect_tx" `L.Mbarrier` render to (the wgmma producer's "tma" value), and `tma.py`'s
hand-written product."""

