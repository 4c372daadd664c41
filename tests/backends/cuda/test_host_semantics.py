"""The CUDA C the renderer writes means what the IR means, checked without a GPU: the module
compiled as host C++ by g++ with a small shim for CUDA's built-ins, where a launch runs one
host thread per CUDA thread of a block (thread-local threadIdx, `__syncthreads` a
std::barrier, `__shared__` static), the blocks one after another.

- every op on every dtype (test_cuda_codegen's `_every_op`) against the same PrimFuncs rendered
  by the llvm backend (the IR's tested meaning), on random inputs: the op tables, literals,
  casts, bit casts and the float16 conversions' rounding (not the warp shuffles: llvm does
  not render them, and they need a whole warp; the scheduled kernels below run them);
- every kernel of small zoo models and of a node-suite sample, scheduled for cuda, against
  the NumPy reference: linearised and narrowed indexing, shared memory, barriers, launches.

The GPU's own math library is gpu_check.py's to check."""

import ctypes
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

from dnnc.backends.cuda.codegen import C_TYPES, c_name, render_module, stages
from dnnc.backends.cuda.prelude import MMA_PRELUDE, PRELUDE, TMA_PRELUDE, WGMMA_N, WGMMA_PRELUDE
from dnnc.ir import loop as L
from dnnc.ir import types as T
from cuda_kernels import (programs, reference, renamed, suite_cases, suite_inputs, suite_sample,
                          zoo_model, zoo_programs)
from dnnc.frontend.onnx import import_onnx
from dnnc.testing.special import CAST_PROBES
from test_cuda_codegen import _every_op, poisoned, run_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")

SHIM = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
struct dnnc_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local dnnc_dim3 threadIdx, blockIdx;
static thread_local std::barrier<>* dnnc_block;     // this thread's block's
static thread_local std::barrier<>* dnnc_cluster;   // its cluster's (every block's threads)
static thread_local unsigned dnnc_rank;             // its block's in the cluster
static thread_local std::barrier<>* dnnc_warp;      // its warp's (`.sync.aligned` waits)
extern "C" void dnnc_set_thread(unsigned x) { threadIdx.x = x; }
// one host thread per CUDA thread of a cluster of cz blocks along z (a block where cz is 1);
// the clusters in order, a barrier between them (static "shared" arrays are then one
// cluster's at a time; the dynamic pool one a block of it: DNNC_SHARED_POOL)
extern "C" void dnnc_launch_cluster(void (*kernel)(void**), void** args, unsigned gx,
                                    unsigned gy, unsigned gz, unsigned bx, unsigned cz) {
  if (cz < 1 || cz > 8 || gz % cz) __builtin_trap();
  std::barrier<> cluster(bx * cz);
  std::vector<std::unique_ptr<std::barrier<>>> blocks, warps;
  const unsigned per = (bx + 31) / 32;   // warps a block
  for (unsigned r = 0; r < cz; ++r) {
    blocks.emplace_back(new std::barrier<>(bx));
    for (unsigned w = 0; w < per; ++w)
      warps.emplace_back(new std::barrier<>(std::min(32u, bx - 32 * w)));
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < bx * cz; ++t)
    threads.emplace_back([=, &cluster, &blocks, &warps] {
      threadIdx.x = t % bx;
      dnnc_rank = t / bx;
      dnnc_block = blocks[dnnc_rank].get();
      dnnc_warp = warps[dnnc_rank * per + threadIdx.x / 32].get();
      dnnc_cluster = &cluster;
      for (unsigned z = 0; z < gz; z += cz)
        for (unsigned y = 0; y < gy; ++y)
          for (unsigned x = 0; x < gx; ++x) {
            blockIdx.x = x; blockIdx.y = y; blockIdx.z = z + dnnc_rank;
            kernel(args);
            cluster.arrive_and_wait();
          }
    });
  for (auto& th : threads) th.join();
}
extern "C" void dnnc_launch(void (*kernel)(void**), void** args, unsigned gx, unsigned gy,
                            unsigned gz, unsigned bx) {
  dnnc_launch_cluster(kernel, args, gx, gy, gz, bx, 1);
}
#define __syncthreads() dnnc_block->arrive_and_wait()
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __cluster_dims__(x, y, z)
#define __shared__ static
// the dynamic pool: where the shim's shared addresses (wgmma's descriptors) count from; and
// the 16-byte chunks this thread's cp.asyncs wrote since its last fence.proxy.async (a wgmma
// of this thread may not read them: the shim traps)
static thread_local unsigned char* dnnc_shared_window;
static unsigned char* dnnc_windows[8];   // each rank's pool (cluster_load's)
static thread_local std::vector<const unsigned char*> dnnc_unfenced_copies;
#define DNNC_SHARED_POOL(name, bytes) \
  static __attribute__((aligned(1024))) unsigned char name##_ranks[8][bytes]; \
  unsigned char* const name = name##_ranks[dnnc_rank]; \
  dnnc_shared_window = dnnc_windows[dnnc_rank] = name
#define DNNC_GRID_DEPENDENCY()   // (one block runs at a time here: nothing ahead to wait for)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(4) ushort2 { unsigned short x, y; };
struct alignas(8) ushort4 { unsigned short x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(4) char4 { signed char x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
template <typename To, typename From> static inline To dnnc_bits(From x) {
  To y; std::memcpy(&y, &x, sizeof y); return y;
}
static inline float __uint_as_float(unsigned x) { return dnnc_bits<float>(x); }
static inline float __int_as_float(int x) { return dnnc_bits<float>(x); }
static inline unsigned __float_as_uint(float x) { return dnnc_bits<unsigned>(x); }
static inline int __float_as_int(float x) { return dnnc_bits<int>(x); }
static inline long long __double_as_longlong(double x) { return dnnc_bits<long long>(x); }
static inline double __longlong_as_double(long long x) { return dnnc_bits<double>(x); }
// warp shuffles: every thread of the block reaches them together (the schedules' thread
// loops cover whole blocks), each posts its value, reads its partner's, and waits again
static unsigned long long dnnc_lanes[8][1024];
template <typename T> static T dnnc_shfl(T v, unsigned src) {
  std::memcpy(&dnnc_lanes[dnnc_rank][threadIdx.x], &v, sizeof v);
  dnnc_block->arrive_and_wait();
  T out; std::memcpy(&out, &dnnc_lanes[dnnc_rank][src], sizeof out);
  dnnc_block->arrive_and_wait();
  return out;
}
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected,
                                           unsigned long long value) {
  __atomic_compare_exchange_n(p, &expected, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;   // the old value, as CUDA's
}
template <typename T> static T __shfl_xor_sync(unsigned, T v, int m) {
  return dnnc_shfl(v, threadIdx.x ^ m);
}
template <typename T> static T __shfl_down_sync(unsigned, T v, int d) {
  return dnnc_shfl(v, threadIdx.x % 32 + d < 32 ? threadIdx.x + d : threadIdx.x);
}
// the PTX conversions of the prelude, as the host rounds them (to nearest even)
static inline float dnnc_h2f(unsigned short h) { return (float)dnnc_bits<_Float16>(h); }
static inline unsigned short dnnc_f2h(float f) { return dnnc_bits<unsigned short>((_Float16)f); }
// cvt.rn.bf16.f32 (to nearest even) with the prelude's NaN (quiet, of its sign and payload)
static inline unsigned short dnnc_f2bf(float f) {
  const unsigned u = dnnc_bits<unsigned>(f);
  return (unsigned short)((f != f ? u | 0x400000u : u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}
static inline float dnnc_bf2f(unsigned short h) { return dnnc_bits<float>((unsigned)h << 16); }
// dp4a.u32.s32 (PTX ISA): acc + the four products of a's unsigned and b's signed bytes,
// wrapping as a 32-bit register does
static inline int dnnc_dp4a(int acc, unsigned a, unsigned b) {
  unsigned sum = (unsigned)acc;
  for (int t = 0; t < 4; ++t)
    sum += (unsigned)((int)(a >> 8 * t & 0xffu) * (int)(signed char)(b >> 8 * t & 0xffu));
  return (int)sum;
}
// L.load_word: the 4 bytes at p as one word, the first lowest (the host is little-endian)
static inline unsigned dnnc_load_word(const void* p) {
  unsigned w; std::memcpy(&w, p, 4); return w;
}
"""

MMA_SHIM = r"""
// tensor cores (prelude.py's MMA_PRELUDE), from the PTX ISA's definitions: the conversions as
// the host rounds them; in an mma each lane posts its operand registers' elements, every
// lane then rebuilds its warp's A (16 x K) and B (K x 8) from the fragment layouts and
// updates its own 4 accumulators
static unsigned dnnc_tf32(float x) {   // cvt.rna.tf32.f32: nearest, ties away; 13 low bits 0
  unsigned u = dnnc_bits<unsigned>(x);
  return (u & 0x7f800000u) == 0x7f800000u ? u : (u + 0x1000u) & 0xffffe000u;
}
static unsigned dnnc_f16x2(float lo, float hi) {   // nearest even, lo in bits 0-15
  return dnnc_bits<unsigned short>((_Float16)lo) |
         (unsigned)dnnc_bits<unsigned short>((_Float16)hi) << 16;
}
static unsigned dnnc_bf16(float x) {   // nearest even: the 16 high bits
  unsigned u = dnnc_bits<unsigned>(x);
  if ((u & 0x7fffffffu) <= 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
static unsigned dnnc_bf16x2(float lo, float hi) { return dnnc_bf16(lo) | dnnc_bf16(hi) << 16; }
static float dnnc_mma_a[1024][8], dnnc_mma_b[1024][4];
// the element values of 4 + 2 operand registers: tf32 one a register (its bits); fp16 and
// bf16 two, the first in the low half
static void dnnc_unpack(int kind, const unsigned* r, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    if (kind == 0) { out[i] = dnnc_bits<float>(r[i]); continue; }
    for (int h = 0; h < 2; ++h) {
      unsigned short bits = (unsigned short)(r[i] >> (16 * h));
      out[2 * i + h] = kind == 1 ? (float)dnnc_bits<_Float16>(bits)
                                 : dnnc_bits<float>((unsigned)bits << 16);
    }
  }
}
static void dnnc_mma(int kind, float* d, const unsigned* a, const unsigned* b) {
  const int K = kind == 0 ? 8 : 16, na = K / 2, nb = K / 4;   // elements a lane
  const unsigned lane = threadIdx.x % 32, first = threadIdx.x - lane;
  dnnc_unpack(kind, a, 4, dnnc_mma_a[threadIdx.x]);
  dnnc_unpack(kind, b, 2, dnnc_mma_b[threadIdx.x]);
  dnnc_block->arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int group = l >> 2, tig = l % 4;   // groupID, threadID_in_group
    for (int e = 0; e < na; ++e) {
      int row, col;
      if (K == 8) {   // .tf32: rows groupID (a0, a2) / +8 (a1, a3); cols tig (a0, a1) / +4
        row = (e == 0 || e == 2) ? group : group + 8;
        col = e < 2 ? tig : tig + 4;
      } else {   // .f16/.bf16: rows groupID (a0 a1 a4 a5) / +8; cols 2 tig + (i & 1), +8 from a4
        row = (e == 0 || e == 1 || e == 4 || e == 5) ? group : group + 8;
        col = tig * 2 + (e & 1) + (e >= 4 ? 8 : 0);
      }
      A[row][col] = dnnc_mma_a[first + l][e];
    }
    // B: col groupID; rows tig (+4: b1) / 2 tig + (i & 1) (+8 from b2)
    for (int e = 0; e < nb; ++e) {
      const int row = K == 8 ? tig + (e == 1 ? 4 : 0) : tig * 2 + (e & 1) + (e >= 2 ? 8 : 0);
      B[row][group] = dnnc_mma_b[first + l][e];
    }
  }
  dnnc_block->arrive_and_wait();
  const int group = lane >> 2, tig = lane % 4;
  for (int r = 0; r < 4; ++r) {   // c0 c1 rows groupID, c2 c3 +8; cols 2 tig + (i & 1)
    const int row = r < 2 ? group : group + 8, col = tig * 2 + (r & 1);
    float sum = d[r];
    for (int k = 0; k < K; ++k) sum += A[row][k] * B[k][col];
    d[r] = sum;
  }
}
#define DNNC_MMA(NAME, KIND)                                                             \
static void NAME(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, \
                 unsigned b1) {                                                          \
  const unsigned a[] = {a0, a1, a2, a3}, b[] = {b0, b1};                                 \
  dnnc_mma(KIND, d, a, b);                                                               \
}
DNNC_MMA(dnnc_mma_tf32, 0)
DNNC_MMA(dnnc_mma_fp16, 1)
DNNC_MMA(dnnc_mma_bf16, 2)
// mma.sp m16n8k32 (PTX ISA, "Sparse matrix storage", 16832 f16/bf16): A's kept 16 x 16 in
// the fp16 fragment layout, B's 32 x 8 rows 2 tig + (i & 1) + 8 (i >> 1), and the metadata
// of lanes 4 g + p (p < 2, selector 0): bits 2 c of its low half the position in its group of
// 4 of row g's kept column 8 p + c, its high half row g + 8's
static unsigned dnnc_mma_e[1024];
static void dnnc_mma_sp(int kind, float* d, const unsigned* a, const unsigned* b, unsigned e) {
  const unsigned lane = threadIdx.x % 32, first = threadIdx.x - lane;
  dnnc_unpack(kind, a, 4, dnnc_mma_a[threadIdx.x]);
  float bs[8];
  dnnc_unpack(kind, b, 4, bs);
  dnnc_mma_e[threadIdx.x] = e;
  static float dnnc_mma_b8[1024][8];
  for (int i = 0; i < 8; ++i) dnnc_mma_b8[threadIdx.x][i] = bs[i];
  dnnc_block->arrive_and_wait();
  float A[16][16], B[32][8];
  int K[16][16];
  for (int l = 0; l < 32; ++l) {
    const int group = l >> 2, tig = l % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i == 0 || i == 1 || i == 4 || i == 5) ? group : group + 8;
      A[row][tig * 2 + (i & 1) + (i >= 4 ? 8 : 0)] = dnnc_mma_a[first + l][i];
      B[tig * 2 + (i & 1) + 8 * (i >> 1)][group] = dnnc_mma_b8[first + l][i];
    }
  }
  for (int row = 0; row < 16; ++row)
    for (int c = 0; c < 16; ++c) {
      const unsigned meta = dnnc_mma_e[first + (row % 8) * 4 + c / 8];
      K[row][c] = 4 * (c / 2) + (int)((meta >> (16 * (row / 8) + 2 * (c % 8))) & 3u);
    }
  dnnc_block->arrive_and_wait();
  const int group = lane >> 2, tig = lane % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = r < 2 ? group : group + 8, col = tig * 2 + (r & 1);
    float sum = d[r];
    for (int c = 0; c < 16; ++c) sum += A[row][c] * B[K[row][c]][col];
    d[r] = sum;
  }
}
#define DNNC_MMA_SP(NAME, KIND)                                                          \
static void NAME(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, \
                 unsigned b1, unsigned b2, unsigned b3, unsigned e) {                    \
  const unsigned a[] = {a0, a1, a2, a3}, b[] = {b0, b1, b2, b3};                         \
  dnnc_mma_sp(KIND, d, a, b, e);                                                         \
}
DNNC_MMA_SP(dnnc_mma_sp_fp16, 1)
DNNC_MMA_SP(dnnc_mma_sp_bf16, 2)
// the integer mma (m16n8k32, s8 or u8 A, s8 B, int32 accumulators; PTX ISA "mma.m16n8k32"
// fragments): element i of A in byte i % 4 of register i / 4, at row groupID (+8 for
// i in 4..7 and 12..15), column 4 tig + i % 4 (+16 from i = 8); of B at row 4 tig + i % 4
// (+16 from i = 4), column groupID; sums exact, wrapping as 32-bit registers do
static unsigned dnnc_mma_ia[1024][4], dnnc_mma_ib[1024][2];
static void dnnc_mma_integer(bool unsigned_a, int* d, const unsigned* a, const unsigned* b) {
  const unsigned lane = threadIdx.x % 32, first = threadIdx.x - lane;
  std::memcpy(dnnc_mma_ia[threadIdx.x], a, 16);
  std::memcpy(dnnc_mma_ib[threadIdx.x], b, 8);
  dnnc_block->arrive_and_wait();
  int A[16][32], B[32][8];
  for (int l = 0; l < 32; ++l) {
    const int group = l >> 2, tig = l % 4;
    for (int i = 0; i < 16; ++i) {
      const unsigned byte = dnnc_mma_ia[first + l][i / 4] >> 8 * (i % 4) & 0xffu;
      const int row = (i < 4 || (i >= 8 && i < 12)) ? group : group + 8;
      const int col = tig * 4 + (i & 3) + (i >= 8 ? 16 : 0);
      A[row][col] = unsigned_a ? (int)byte : (int)(signed char)byte;
    }
    for (int i = 0; i < 8; ++i) {
      const unsigned byte = dnnc_mma_ib[first + l][i / 4] >> 8 * (i % 4) & 0xffu;
      B[tig * 4 + (i & 3) + (i >= 4 ? 16 : 0)][group] = (int)(signed char)byte;
    }
  }
  dnnc_block->arrive_and_wait();
  const int group = lane >> 2, tig = lane % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = r < 2 ? group : group + 8, col = tig * 2 + (r & 1);
    unsigned sum = (unsigned)d[r];
    for (int k = 0; k < 32; ++k) sum += (unsigned)(A[row][k] * B[k][col]);
    d[r] = (int)sum;
  }
}
static void dnnc_mma_s8(int* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                        unsigned b0, unsigned b1) {
  const unsigned a[] = {a0, a1, a2, a3}, b[] = {b0, b1};
  dnnc_mma_integer(false, d, a, b);
}
static void dnnc_mma_u8(int* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                        unsigned b0, unsigned b1) {
  const unsigned a[] = {a0, a1, a2, a3}, b[] = {b0, b1};
  dnnc_mma_integer(true, d, a, b);
}
// ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): each lane posts its row
// address; lanes 8 q .. 8 q + 7 address rows 0..7 of matrix q, 8 16-bit elements each; lane
// l's register q then holds (row l / 4, columns 2 (l % 4), + 1), or with .trans (rows
// 2 (l % 4), + 1, column l / 4), the first in the low half
static const unsigned short* dnnc_ldmatrix_rows[1024];
static void dnnc_ldmatrix(unsigned* d, const unsigned* p, int count, bool trans) {
  const unsigned lane = threadIdx.x % 32, first = threadIdx.x - lane;
  dnnc_ldmatrix_rows[threadIdx.x] = reinterpret_cast<const unsigned short*>(p);
  dnnc_block->arrive_and_wait();
  const unsigned group = lane / 4, pair = lane % 4;
  for (int q = 0; q < count; ++q) {
    const unsigned short* const* rows = dnnc_ldmatrix_rows + first + 8 * q;
    unsigned lo, hi;
    if (!trans) {
      lo = rows[group][2 * pair];
      hi = rows[group][2 * pair + 1];
    } else {
      lo = rows[2 * pair][group];
      hi = rows[2 * pair + 1][group];
    }
    d[q] = lo | hi << 16;
  }
  dnnc_block->arrive_and_wait();
}
#define DNNC_LDMATRIX(NAME, COUNT, TRANS) \
static void NAME(unsigned* d, const unsigned* p) { dnnc_ldmatrix(d, p, COUNT, TRANS); }
DNNC_LDMATRIX(dnnc_ldmatrix_x1, 1, false)
DNNC_LDMATRIX(dnnc_ldmatrix_x2, 2, false)
DNNC_LDMATRIX(dnnc_ldmatrix_x4, 4, false)
DNNC_LDMATRIX(dnnc_ldmatrix_x1_trans, 1, true)
DNNC_LDMATRIX(dnnc_ldmatrix_x2_trans, 2, true)
DNNC_LDMATRIX(dnnc_ldmatrix_x4_trans, 4, true)
// cp.async: the copy at once (it has landed by any later wait); 16 bytes, past `bytes` zero;
// a source size outside [0, 16] or an unaligned address is a kernel bug: abort
static void dnnc_cp_async(void* dst, const void* src, int bytes) {
  if (bytes < 0 || bytes > 16 || reinterpret_cast<unsigned long>(dst) % 16 ||
      (bytes && reinterpret_cast<unsigned long>(src) % 16)) __builtin_trap();
  std::memcpy(dst, src, bytes);
  std::memset(static_cast<char*>(dst) + bytes, 0, 16 - bytes);
  dnnc_unfenced_copies.push_back(static_cast<const unsigned char*>(dst));
}
static void dnnc_cp_async_commit() {}
template <int N> static void dnnc_cp_async_wait() {}
"""

WGMMA_SHIM = r"""
// warpgroup products (prelude.py's WGMMA_PRELUDE), from the PTX ISA ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate", its matrix descriptor and shared memory
// layouts): a descriptor holds the operand's shared address (from the pool's start) and its
// offsets in 16-byte units, the 128-byte swizzle; a wgmma is only recorded, and runs when a
// wait completes its group (so reading an operand after its slot is refilled, or an
// accumulator before the wait, shows as a wrong product); a thread issuing one that reads a
// chunk its cp.asyncs wrote and no fence.proxy.async has since fenced into the async proxy
// traps (copies into another slot, as `refill_first` issues them, may stay unfenced)
static unsigned long long dnnc_wgmma_desc(const void* p, unsigned leading, unsigned stride) {
  const long address = static_cast<const unsigned char*>(p) - dnnc_shared_window;
  if (!dnnc_shared_window || address < 0 || address >= (1 << 18) || address % 16 ||
      leading % 16 || stride % 16) __builtin_trap();
  return (unsigned long long)(address >> 4) | (unsigned long long)(leading >> 4) << 16 |
         (unsigned long long)(stride >> 4) << 32 | 1ull << 62;
}
// element (x, kk) of an operand (x: A's row or B's column) through its descriptor:
// K-major at (x / 8) stride + (x % 8) 128 + kk e, MN-major at (x / 64) leading + (x % 64) e
// + (kk / 8) stride + (kk % 8) 128 bytes from the start, e bytes an element; then the
// 128-byte swizzle of the shared address (bits 4-6 ^= bits 7-9)
static unsigned dnnc_wgmma_address(int kind, unsigned long long desc, bool mn, int x,
                                   int kk) {
  if (desc >> 62 != 1 || (desc >> 49 & 7) != 0) __builtin_trap();
  const unsigned start = (desc & 0x3fff) << 4, leading = (desc >> 16 & 0x3fff) << 4,
                 stride = (desc >> 32 & 0x3fff) << 4, e = kind == 0 ? 4 : kind >= 3 ? 1 : 2;
  const unsigned p = start + (mn ? x / 64 * leading + x % 64 * e + kk / 8 * stride +
                                       kk % 8 * 128
                                 : x / 8 * stride + x % 8 * 128 + kk * e);
  return p ^ (p >> 7) % 8 << 4;
}
static float dnnc_wgmma_element(int kind, unsigned long long desc, bool mn, int x, int kk) {
  const unsigned p = dnnc_wgmma_address(kind, desc, mn, x, kk);
  if (kind == 0) {   // tf32: a float32 word, its low 13 mantissa bits ignored
    unsigned bits; std::memcpy(&bits, dnnc_shared_window + p, 4);
    return dnnc_bits<float>(bits & 0xffffe000u);
  }
  if (kind >= 3) {   // s8 (3) or u8 (4): a byte; B is s8 either way (`signed_b`)
    const unsigned char byte = dnnc_shared_window[p];
    return kind == 3 ? (float)(signed char)byte : (float)byte;
  }
  unsigned short bits; std::memcpy(&bits, dnnc_shared_window + p, 2);
  return kind == 1 ? (float)dnnc_bits<_Float16>(bits) : dnnc_bits<float>((unsigned)bits << 16);
}
// d: float* (kinds 0-2) or int* (3, 4: int32 sums, exact); `sparse`: the slot of the
// metadata registers its warpgroup posted (dnnc_wgmma_e), or -1
struct dnnc_wgmma_op {
  int kind, n; bool ta, tb; void* d; unsigned long long a, b; long group; long sparse;
};
// a sparse wgmma's metadata (mma.sp's layout for each warp's 16 rows): each thread posts its
// register at its issue in slot (its sparse wgmmas so far) % 4096, read when a wait runs it
static unsigned dnnc_wgmma_e[4096][1024];
static thread_local long dnnc_wgmma_sparse_issued;
static thread_local std::vector<dnnc_wgmma_op> dnnc_wgmma_ops;
static thread_local long dnnc_wgmma_groups;   // committed so far
// thread t of a warpgroup (warp w, g, q) holds D[16 w + g + 8 (r / 2 % 2), 8 (r / 4) + 2 q
// + r % 2] in register r < n / 2
static void dnnc_wgmma_run(const dnnc_wgmma_op& op) {
  const int t = threadIdx.x % 128, warp = t / 32, g = t % 32 / 4, q = t % 4;
  const int K = op.kind == 0 ? 8 : op.kind >= 3 ? 32 : 16;
  for (int r = 0; r < op.n / 2; ++r) {
    const int i = 16 * warp + g + 8 * (r / 2 % 2), j = 8 * (r / 4) + 2 * q + r % 2;
    if (op.kind >= 3) {   // B's bytes signed whatever A's are
      int sum = static_cast<int*>(op.d)[r];
      for (int kk = 0; kk < K; ++kk)
        sum += (int)dnnc_wgmma_element(op.kind, op.a, op.ta, i, kk) *
               (int)dnnc_wgmma_element(3, op.b, op.tb, j, kk);
      static_cast<int*>(op.d)[r] = sum;
      continue;
    }
    float sum = static_cast<float*>(op.d)[r];
    if (op.sparse >= 0) {   // A's kept (i, c) at kk = c; its column from the metadata
      const unsigned first = threadIdx.x - t + 32 * (i / 16);
      for (int c = 0; c < 16; ++c) {
        const unsigned e = dnnc_wgmma_e[op.sparse][first + 4 * (i % 8) + c / 8];
        const int kk = 4 * (c / 2) + (int)(e >> (16 * (i % 16 / 8) + 2 * (c % 8)) & 3u);
        sum += dnnc_wgmma_element(op.kind, op.a, false, i, c) *
               dnnc_wgmma_element(op.kind, op.b, op.tb, j, kk);
      }
    } else {
      for (int kk = 0; kk < K; ++kk)
        sum += dnnc_wgmma_element(op.kind, op.a, op.ta, i, kk) *
               dnnc_wgmma_element(op.kind, op.b, op.tb, j, kk);
    }
    static_cast<float*>(op.d)[r] = sum;
  }
}
static void dnnc_wgmma_fence() {}
static void dnnc_fence_proxy_async() { dnnc_unfenced_copies.clear(); }
// clusters: every thread of the cluster's blocks (concurrent host threads) meets; a load
// from rank r's pool at this pool's offset
static void dnnc_cluster_sync() { dnnc_cluster->arrive_and_wait(); }
static unsigned dnnc_warp_index() { return threadIdx.x / 32; }
// mbarriers: the object's 64 bits hold its phase's parity (bit 63), its count (bits 32-51)
// and the arrivals the phase still awaits (bits 0-31); the bytes the phase still awaits
// from TMA copies (announced by expect_tx less those landed: below zero when a copy lands
// first) in a table beside; every change by the block's host threads under one lock, a
// waiter reading the parity alone. A phase completes when neither arrivals nor bytes are
// awaited. A cp.async lands at once, so its arrival is an arrival; an arrival on a phase
// whose arrivals have all come, or on an object not made, traps
static std::mutex dnnc_mbarrier_lock;
static std::map<const unsigned long long*, long> dnnc_mbarrier_bytes;
static void dnnc_mbarrier_init(unsigned long long* bar, unsigned count) {
  if (count == 0 || count >= 1u << 20) __builtin_trap();
  std::lock_guard<std::mutex> hold(dnnc_mbarrier_lock);
  dnnc_mbarrier_bytes[bar] = 0;
  std::atomic_ref<unsigned long long>(*bar).store((unsigned long long)count << 32 | count);
}
// (the lock held) the phase complete where nothing is awaited: the parity flips, the count
// of arrivals awaited starts again
static void dnnc_mbarrier_settle(unsigned long long* bar) {
  std::atomic_ref<unsigned long long> word(*bar);
  const unsigned long long old = word.load();
  if ((old & 0xffffffffull) == 0 && dnnc_mbarrier_bytes[bar] == 0)
    word.store(((old ^ 1ull << 63) & ~0xffffffffull) | (old >> 32 & 0xfffff));
}
static void dnnc_mbarrier_expect_tx(unsigned long long* bar, unsigned bytes) {
  std::lock_guard<std::mutex> hold(dnnc_mbarrier_lock);
  std::atomic_ref<unsigned long long> word(*bar);
  const unsigned long long old = word.load();
  if ((old >> 32 & 0xfffff) == 0 || (old & 0xffffffffull) == 0) __builtin_trap();
  dnnc_mbarrier_bytes[bar] += bytes;
  word.store(old - 1);
  dnnc_mbarrier_settle(bar);
}
static void dnnc_mbarrier_arrive(unsigned long long* bar) { dnnc_mbarrier_expect_tx(bar, 0); }
static void dnnc_mbarrier_copy_arrive(unsigned long long* bar) { dnnc_mbarrier_arrive(bar); }
static void dnnc_mbarrier_complete_tx(unsigned long long* bar, long bytes) {
  std::lock_guard<std::mutex> hold(dnnc_mbarrier_lock);
  if ((std::atomic_ref<unsigned long long>(*bar).load() >> 32 & 0xfffff) == 0) __builtin_trap();
  dnnc_mbarrier_bytes[bar] -= bytes;
  dnnc_mbarrier_settle(bar);
}
// the phase of `parity` has completed once the current phase's parity is the other
static void dnnc_mbarrier_wait(unsigned long long* bar, unsigned parity) {
  std::atomic_ref<unsigned long long> word(*bar);
  while ((word.load() >> 63) == (parity & 1)) std::this_thread::yield();
}
static float dnnc_cluster_load(const float* p, unsigned rank) {
  const long offset = reinterpret_cast<const unsigned char*>(p) - dnnc_shared_window;
  if (rank >= 8 || !dnnc_windows[rank] || offset < 0 || offset >= (1 << 18) || offset % 4)
    __builtin_trap();
  float v; std::memcpy(&v, dnnc_windows[rank] + offset, 4); return v;
}
// whether operand `desc` (`rows` of x, K of kk) reads an unfenced chunk: first whether one
// lies between its (0, 0) element's and its (rows - 1, K - 1) element's 128-byte row (the
// layouts grow with x and kk; the swizzle stays within a row), then, if so, whether one is
// a chunk an element is read from (copies into other chunks of its rows, as a k tile of
// half a row's shares them with the next slot's, may stay unfenced)
static bool dnnc_reads_unfenced(int kind, unsigned long long desc, bool mn, int rows,
                                int K) {
  const unsigned start = (desc & 0x3fff) << 4, last = dnnc_wgmma_address(
      kind, desc, mn, rows - 1, K - 1);
  const unsigned char *lo = dnnc_shared_window + start,
                      *hi = dnnc_shared_window + (last | 127);
  bool near = false;
  for (const unsigned char* chunk : dnnc_unfenced_copies)
    near |= chunk + 16 > lo && chunk <= hi;
  if (!near) return false;
  for (int x = 0; x < rows; ++x)
    for (int kk = 0; kk < K; ++kk) {
      const unsigned char* p = dnnc_shared_window + (dnnc_wgmma_address(kind, desc, mn, x,
                                                                         kk) & ~15u);
      for (const unsigned char* chunk : dnnc_unfenced_copies)
        if (chunk == p) return true;
    }
  return false;
}
static void dnnc_wgmma_commit() {
  for (auto& op : dnnc_wgmma_ops)
    if (op.group < 0) op.group = dnnc_wgmma_groups;
  ++dnnc_wgmma_groups;
}
template <int N, int COUNT> static void dnnc_wgmma_wait(void*) {
  // every thread of the block waits here together: a sparse wgmma to run reads the
  // metadata its warpgroup's threads posted, so they must all have issued it
  for (auto& op : dnnc_wgmma_ops)
    if (op.sparse >= 0 && op.group >= 0 && op.group < dnnc_wgmma_groups - N) {
      dnnc_block->arrive_and_wait();
      break;
    }
  std::vector<dnnc_wgmma_op> pending;
  for (auto& op : dnnc_wgmma_ops) {
    if (op.group >= 0 && op.group < dnnc_wgmma_groups - N) dnnc_wgmma_run(op);
    else pending.push_back(op);
  }
  dnnc_wgmma_ops = pending;
  // `.sync.aligned`: the warp's lanes leave the wait together, each lane's products run
  // (a lane's arrival after it speaks for its warp: the producer's ring counts warps)
  dnnc_warp->arrive_and_wait();
}
#define DNNC_WGMMA(NAME, KIND, N, T)                                                       \
template <int TA, int TB> static void NAME(T* d, unsigned long long a,                     \
                                           unsigned long long b) {                         \
  const int K = KIND == 0 ? 8 : KIND >= 3 ? 32 : 16;                                      \
  if (dnnc_reads_unfenced(KIND, a, TA != 0, 64, K) ||                                     \
      dnnc_reads_unfenced(KIND, b, TB != 0, N, K)) __builtin_trap();                       \
  dnnc_wgmma_ops.push_back({KIND, N, TA != 0, TB != 0, d, a, b, -1, -1});                  \
}
// the sparse ones (A's kept 64 x 16 K-major; B's k32): the metadata posted
#define DNNC_SPARSE_WGMMA(NAME, KIND, N)                                                   \
template <int TA, int TB> static void NAME(float* d, unsigned long long a,                 \
                                           unsigned long long b, unsigned e) {             \
  if (TA != 0 || dnnc_reads_unfenced(KIND, a, false, 64, 16) ||                            \
      dnnc_reads_unfenced(KIND, b, TB != 0, N, 32)) __builtin_trap();                      \
  const long slot = dnnc_wgmma_sparse_issued++ % 4096;                                     \
  dnnc_wgmma_e[slot][threadIdx.x] = e;                                                     \
  dnnc_wgmma_ops.push_back({KIND, N, false, TB != 0, d, a, b, -1, slot});                  \
}
""" + "".join(f"DNNC_WGMMA(dnnc_wgmma_{name}_n{n}, {kind}, {n}, {accumulator})\n"
             for kind, (name, accumulator) in enumerate((
                 ("tf32", "float"), ("fp16", "float"), ("bf16", "float"), ("s8", "int"),
                 ("u8", "int")))
             for n in WGMMA_N) + "".join(   # (WGMMA_PRELUDE's)
    f"DNNC_SPARSE_WGMMA(dnnc_wgmma_sp_{name}_n{n}, {kind}, {n})\n"
    for kind, name in ((1, "fp16"), (2, "bf16")) for n in WGMMA_N)

TMA_SHIM = r"""
// TMA (prelude.py's TMA_PRELUDE): a tensor map is the plain struct `host_tensor_map` writes
// (the tensor's address, its extents innermost first, the byte strides of dimensions 1 and
// 2, the box, the element's bytes); a copy lands at once, zeros outside the tensor, box row
// r (i1 + box1 i2) at byte r 128 + i0 e from the destination in the 128-byte swizzle (chunk
// c of row r at c ^ r % 8), then its box's bytes complete on the barrier. A destination off
// a 1024-byte boundary of the pool, or a box row other than 128 bytes, traps
struct dnnc_tensor_map {
  unsigned long long address, extents[3], strides[2], box[3], element;
};
static void dnnc_tma_load_3d(void* dst, const void* map, unsigned long long* bar, int x, int y,
                             int z) {
  const dnnc_tensor_map& m = *static_cast<const dnnc_tensor_map*>(map);
  unsigned char* const out = static_cast<unsigned char*>(dst);
  const long offset = out - dnnc_shared_window;
  if (!dnnc_shared_window || offset < 0 || offset % 1024 || m.box[0] * m.element != 128)
    __builtin_trap();
  const long long at[3] = {x, y, z};
  const unsigned e = (unsigned)m.element;
  for (unsigned long long i2 = 0; i2 < m.box[2]; ++i2)
    for (unsigned long long i1 = 0; i1 < m.box[1]; ++i1)
      for (unsigned long long i0 = 0; i0 < m.box[0]; ++i0) {
        const long long g[3] = {at[0] + (long long)i0, at[1] + (long long)i1,
                                at[2] + (long long)i2};
        unsigned long long p = (i1 + m.box[1] * i2) * 128 + i0 * e;
        p ^= (p >> 7) % 8 << 4;
        bool inside = true;
        for (int d = 0; d < 3; ++d) inside &= g[d] >= 0 && g[d] < (long long)m.extents[d];
        if (inside)
          std::memcpy(out + p, reinterpret_cast<const unsigned char*>(m.address) + g[0] * e +
                      g[1] * m.strides[0] + g[2] * m.strides[1], e);
        else
          std::memset(out + p, 0, e);
      }
  dnnc_mbarrier_complete_tx(bar, (long)(m.box[0] * m.box[1] * m.box[2] * e));
}
// an im2col map (`host_tensor_map` of a `TensorMapArg` with `im2col`): the NHWC tensor's
// address, extents (c, w, h, n), byte strides of w, h and n, the box (channels, pixels), the
// element's bytes, the spatial lower and upper corners and traversal strides (w, h). Pixel p
// of the box is the p-th of the walk from (w, h, n): w by its stride within [lower, extent
// - 1 + upper], then h, then n; its channels read at its position plus the offsets, zeros
// outside the tensor; it lands as box row p, swizzled as a tiled box's rows
struct dnnc_im2col_map {
  unsigned long long address, extents[4], strides[3], box[2], element;
  long long lower[2], upper[2], traversal[2];
};
static void dnnc_tma_load_im2col_4d(void* dst, const void* map, unsigned long long* bar,
                                    int c, int w, int h, int n, int dw, int dh) {
  const dnnc_im2col_map& m = *static_cast<const dnnc_im2col_map*>(map);
  unsigned char* const out = static_cast<unsigned char*>(dst);
  const long offset = out - dnnc_shared_window;
  if (!dnnc_shared_window || offset < 0 || offset % 1024 || m.box[0] * m.element != 128 ||
      dw < 0 || dh < 0 || w < m.lower[0] || h < m.lower[1] ||
      w > (long long)m.extents[1] - 1 + m.upper[0] || h > (long long)m.extents[2] - 1 + m.upper[1])
    __builtin_trap();
  const unsigned e = (unsigned)m.element;
  long long pw = w, ph = h, pn = n;
  for (unsigned long long row = 0; row < m.box[1]; ++row) {
    const long long x = pw + dw, y = ph + dh;
    for (unsigned long long i0 = 0; i0 < m.box[0]; ++i0) {
      const long long ch = c + (long long)i0;
      unsigned long long p = row * 128 + i0 * e;
      p ^= (p >> 7) % 8 << 4;
      if (ch >= 0 && ch < (long long)m.extents[0] && x >= 0 && x < (long long)m.extents[1] &&
          y >= 0 && y < (long long)m.extents[2] && pn >= 0 && pn < (long long)m.extents[3])
        std::memcpy(out + p, reinterpret_cast<const unsigned char*>(m.address) + ch * e +
                    x * m.strides[0] + y * m.strides[1] + pn * m.strides[2], e);
      else
        std::memset(out + p, 0, e);
    }
    pw += m.traversal[0];
    if (pw > (long long)m.extents[1] - 1 + m.upper[0]) {
      pw = m.lower[0];
      ph += m.traversal[1];
      if (ph > (long long)m.extents[2] - 1 + m.upper[1]) {
        ph = m.lower[1];
        ++pn;
      }
    }
  }
  dnnc_mbarrier_complete_tx(bar, (long)(m.box[0] * m.box[1] * e));
}
static void dnnc_fence_mbarrier_init() {}
static void dnnc_prefetch_tensor_map(const void*) {}
static bool dnnc_elect_one() { return threadIdx.x % 32 == 0; }
template <int N> static void dnnc_setmaxnreg_inc() {}
template <int N> static void dnnc_setmaxnreg_dec() {}
"""


def host_tensor_map(tensor: np.ndarray, arg) -> np.ndarray:
    """The struct TMA_SHIM reads as tensor map `arg` (a `codegen.TensorMapArg`) of host array
    `tensor`: what the runtime's `tensor_map.encode_tiled` (`encode_im2col` for an im2col
    map: `dnnc_im2col_map`) builds from the same description."""
    words = np.zeros(32 if arg.im2col else 16, np.uint64)
    fields = [tensor.ctypes.data, *arg.extents, *arg.strides, *arg.box,
              np.dtype(tensor.dtype).itemsize]
    words[:len(fields)] = fields
    if arg.im2col:   # (signed corners as two's complement words)
        words[len(fields):len(fields) + len(arg.im2col)] = \
            np.array(arg.im2col, np.int64).view(np.uint64)
    return words


def host_library(funcs, tmp_path, module=None) -> ctypes.CDLL:
    """The rendered module of `funcs` ((PrimFunc, noalias) pairs) as a host library, with
    `<launch>_host(void** args)` calling each `__global__` with its arguments."""
    module = module or render_module(funcs)
    source = module.source
    assert source.startswith(PRELUDE)
    device_only = PRELUDE[PRELUDE.index("// NaN-propagating"):]   # the templates stay
    assert "DNNC_SHARED_POOL" not in device_only   # (the shim's own: a static pool)
    wrappers = []
    for func, _ in funcs:
        kernel = module.kernels[func.name]
        types = [C_TYPES[b.dtype] for b in func.params + tuple(stages(func.body)[0])]
        assert len(types) == len(func.params) + len(kernel.workspace)
        types += ["const unsigned long long"] * len(kernel.tensor_maps)
        args = ", ".join(f"({t}*)a[{k}]" for k, t in enumerate(types))
        wrappers += [f'extern "C" void {launch.name}_host(void** a) {{ {launch.name}({args}); }}'
                     for launch in kernel.launches]
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "kernels.cc"
    # the tensor cores' inline PTX replaced by their emulation
    kernels = source[len(PRELUDE):].replace(MMA_PRELUDE, MMA_SHIM).replace(
        WGMMA_PRELUDE, WGMMA_SHIM).replace(TMA_PRELUDE, TMA_SHIM)
    path.write_text(SHIM + device_only + kernels + "\n".join(wrappers) + "\n")
    lib = tmp_path / "kernels.so"
    # -fwrapv: signed overflow wraps, as the IR says (CUDA C leaves it undefined; nvcc does
    # not exploit it in these kernels)
    proc = subprocess.run(["g++", "-std=c++20", "-pthread", "-O1", "-fwrapv", "-shared",
                           "-fPIC", "-w",
                           "-o", str(lib), str(path)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def launch_on_host(lib, info, arrays) -> None:
    """Every launch of a kernel (`info`: its `render_module` entry) from `host_library` `lib`
    on the host, on `arrays` (its parameters, then its workspace) in place; its tensor maps
    (`host_tensor_map`) made of its parameters here."""
    arrays = list(arrays) + [host_tensor_map(arrays[m.param], m) for m in info.tensor_maps]
    args = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    for launch in info.launches:
        assert launch.block[1:] == (1, 1)   # (the shim runs threadIdx.x only)
        host = ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p)
        lib.dnnc_launch_cluster(host, args, *[ctypes.c_uint(g) for g in launch.grid],
                                ctypes.c_uint(launch.block[0]), ctypes.c_uint(launch.cluster))


def _random(rng, dtype: T.DType, n: int) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(n) < 0.5
    if dtype.is_int:
        info = np.iinfo(dtype.np)
        return rng.integers(info.min, info.max, n, dtype=dtype.np, endpoint=True)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)
    x[:6] = (np.inf, -np.inf, np.nan, 0.0, -0.0, 1.5)[: n]
    return x.astype(dtype.np)


def _inputs(rng, func: L.PrimFunc) -> list[np.ndarray]:
    """Inputs on which C and the IR agree: shift amounts below the width; float -> int
    casts of the special values too (NaN, +-inf, out of range: legalize defines them)."""
    name = func.name.split("_", 1)[1]
    out = []
    for b in func.params[:-1]:
        n = b.shape[0].value
        x = _random(rng, b.dtype, n)
        if name.endswith(("_<<", "_>>")) and b is func.params[1]:
            x = (rng.integers(0, 8 * b.dtype.itemsize, n)).astype(b.dtype.np)
        dst = func.params[-1].dtype
        if "_to_" in name and b.dtype.is_float and dst.is_int:
            with np.errstate(over="ignore"):
                x = rng.choice(np.array(CAST_PROBES), n).astype(b.dtype.np)
        out.append(x)
    return out


def test_every_op_means_what_the_ir_means(rng, tmp_path):
    funcs = [f for f in _every_op() if not any(
        isinstance(n, L.Call) and n.name in L.SHUFFLES for n in L.walk(f.body))]
    lib = host_library([(f, True) for f in funcs], tmp_path)
    inputs = {f.name: _inputs(rng, f) for f in funcs}
    cuda, llvm = {}, {}
    for f in funcs:
        y = f.params[-1]
        cuda[f.name] = inputs[f.name] + [np.zeros(y.shape[0].value, y.dtype.np)]
        llvm[f.name] = [x.copy() for x in inputs[f.name]] + [np.zeros_like(cuda[f.name][-1])]
    run_on_cpu(funcs, llvm)
    failures = []
    for f in funcs:
        args = [a.ctypes.data for a in cuda[f.name]]
        fn = getattr(lib, c_name(f.name))
        fn.restype = None
        for t in range(f.params[-1].shape[0].value):
            lib.dnnc_set_thread(t)
            fn(*[ctypes.c_void_p(a) for a in args])
        got, want = cuda[f.name][-1], llvm[f.name][-1]
        if got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16:
            g, w = got.astype(np.float64), want.astype(np.float64)
            bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
        else:
            bad = got != want
        if bad.any():
            failures.append(f"{f.name}: {got[bad][:3]} != {want[bad][:3]} "
                            f"(inputs {[x[bad][:3] for x in inputs[f.name]]})")
    assert not failures, "\n".join(failures[:40])


def test_check_index_records_the_first_bad_index(tmp_path):
    """The prelude's `dnnc_check_index` means what `loop.index_checks` says: every value goes
    on, the first index outside [-5, 4] is recorded as (site + 1, index, 5) once (atomicCAS),
    over 32 threads of one block."""
    n = 32
    x, k = L.Buffer("x", T.float32, (5,)), L.Buffer("k", T.int64, (n,))
    y = L.Buffer("y", T.float32, (n,))
    t = L.Var("t")
    at = L.Call("check_index", (k[t], L.const(5), L.const(6)), L.INDEX)
    body = L.Store(y, (t,), x[(L.minimum(L.maximum(at, 0), 4),)])
    func = L.index_checks.with_errors(
        L.PrimFunc("checked", (x, k, y), L.For(t, n, body, L.ForKind.THREAD_X)))
    module = render_module([(func, True)])
    lib = host_library([(func, True)], tmp_path, module)
    launch = module.kernels["checked"].launches[0]
    xs = np.arange(5, dtype=np.float32)
    for bad, want in ((None, [0, 0, 0]), (2**62, [7, 2**62, 5]), (-6, [7, -6, 5])):
        ks = np.tile(np.array([0, 4, -5, -1], np.int64), n // 4)
        if bad is not None:
            ks[[9, 30]] = bad
        out, errors = np.zeros(n, np.float32), np.zeros(3, np.int64)
        args = (ctypes.c_void_p * 4)(*[a.ctypes.data for a in (xs, ks, out, errors)])
        host = ctypes.cast(getattr(lib, f"{launch.name}_host"), ctypes.c_void_p)
        lib.dnnc_launch(host, args, *[ctypes.c_uint(g) for g in launch.grid],
                        ctypes.c_uint(launch.block[0]))
        np.testing.assert_array_equal(out, xs[np.clip(ks, 0, 4)])
        np.testing.assert_array_equal(errors, want)


def program_on_host(lib, module, program, feeds: dict, prefix: str = "") -> dict:
    """Every kernel of `program` launched in order on the host library `lib` (its functions
    named `prefix` + their names in `module`) from `feeds` (by name; constants read from the
    graph), outputs poisoned first, a run-time index error failing the test: `feeds` with
    the values it computed."""
    values = dict(feeds)
    for kernel in program.kernels:
        info = module.kernels[prefix + kernel.func.name]
        ins = [np.ascontiguousarray(v.const if v.const is not None else
                                    _value(v, values, program.viewed))
               for v in kernel.inputs]
        outs = [poisoned(np.dtype(v.type.dtype.np), v.type.shape) for v in kernel.outputs]
        errors = [np.zeros(3, np.int64)] if L.index_checks.INDEX_ERRORS in \
            kernel.func.params else []
        launch_on_host(lib, info, ins + outs + errors +
                       [np.full(n, 0xFF, np.uint8) for n in info.workspace])
        assert not (errors and errors[0].any()), \
            f"{kernel.func.name}: index error recorded: {errors[0]}"
        values.update((v.name, out) for v, out in zip(kernel.outputs, outs))
    return values


def _value(v, values: dict, viewed) -> np.ndarray:
    """`values[v.name]`, or, for the output of a copy the program does as a view
    (`plan.views_in_place`), the bytes of its source where the view lies."""
    if v.name in values:
        return values[v.name]
    kernel = next(k for k in viewed if any(o is v for o in k.outputs))
    source = next(x for x in kernel.inputs if x.const is None)
    flat = np.ascontiguousarray(_value(source, values, viewed)).reshape(-1)
    start = 0
    for out in kernel.outputs:
        values[out.name] = flat[start:start + out.type.numel].reshape(out.type.shape)
        start += out.type.numel
    return values[v.name]


def kernel_on_host(lib, module, kernel, values) -> tuple[list[np.ndarray], np.ndarray | None]:
    """`kernel` of a Program launched on the host library `lib` of its `module`, its inputs
    its constants or `values[name]`, its outputs and workspace poisoned first: (its outputs,
    its index-error record or None where it checks no index)."""
    info = module.kernels[kernel.func.name]
    ins = [np.ascontiguousarray(v.const if v.const is not None else values[v.name])
           for v in kernel.inputs]
    outs = [poisoned(np.dtype(v.type.dtype.np), v.type.shape) for v in kernel.outputs]
    scratch = [np.full(size, 0xFF, np.uint8) for size in info.workspace]
    errors = [np.zeros(3, np.int64)] if L.index_checks.INDEX_ERRORS in kernel.func.params \
        else []
    launch_on_host(lib, info, ins + outs + errors + scratch)
    return outs, errors[0] if errors else None


def run_on_host(lib, module, program, values) -> list[str]:
    """Every kernel of `program` launched on the host library (inputs from `values`, outputs
    poisoned), against `values`: the mismatches."""
    problems = []
    for kernel in program.kernels:
        outs, errors = kernel_on_host(lib, module, kernel, values)
        if errors is not None and errors.any():   # the reference's data is in range
            problems.append(f"{kernel.func.name}: index error recorded: {errors}")
        for v, got in zip(kernel.outputs, outs):
            want = np.asarray(values[v.name])
            try:
                if want.dtype.kind == "f":
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
                else:
                    np.testing.assert_array_equal(got, want)
            except AssertionError as exc:
                problems.append(f"{kernel.func.name} {v.name}: {str(exc).strip()[:300]}")
    return problems


@pytest.mark.parametrize("model", ["mlp", "cnn",
                                   pytest.param("bert_tiny", marks=pytest.mark.emulated_full)])
def test_zoo_kernels_on_host(model, tmp_path):
    from dnnc import zoo

    graph, progs = zoo_programs(model)
    values = reference(graph, zoo.inputs_for(zoo_model(model), np.random.default_rng(0)))
    problems = []
    for p, program in enumerate(progs):
        module = render_module(program.unique)
        lib = host_library(program.unique, tmp_path / f"p{p}", module)
        problems += run_on_host(lib, module, program, values)
    assert not problems, "\n".join(problems)


@pytest.mark.emulated_full
def test_node_suite_sample_on_host(tmp_path):
    funcs, jobs = [], []
    for c, (name, case) in enumerate(suite_cases(suite_sample(100)).items()):
        graph, progs = programs(import_onnx(case.model))
        values = reference(graph, dict(zip((v.name for v in graph.inputs), suite_inputs(case))))
        for p, program in enumerate(progs):
            prefix = f"c{c}p{p}_"
            for kernel in program.kernels:
                kernel.func = L.PrimFunc(prefix + kernel.func.name, kernel.func.params,
                                         kernel.func.body)
            program.unique = renamed(program, prefix)
            funcs += program.unique
            jobs.append((name, program, values))
    module = render_module(funcs)
    lib = host_library(funcs, tmp_path, module)
    problems = []
    for name, program, values in jobs:
        problems += [f"{name}: {x}" for x in run_on_host(lib, module, program, values)]
    assert len(jobs) > 60 and not problems, "\n".join(problems)


def test_a_long_index_copy_on_host(rng, tmp_path):
    """An IndexCopy of more positions than INDEX_COPY_MOST (a prompt written into a KV
    cache), some repeated: its kernels (each cache row's last writer, then the rows) as the
    reference, the last of repeated positions winning."""
    from dnnc.ir.graph import Graph
    from dnnc.ir.ops.indexing import INDEX_COPY_MOST

    count = INDEX_COPY_MOST + 6
    g = Graph("prompt")
    cache = g.add_input("cache", T.TensorType(T.float32, (2, 80, 8)))
    pos = g.add_input("pos", T.TensorType(T.int64, (count,)))
    x = g.add_input("x", T.TensorType(T.float32, (2, count, 8)))
    g.outputs = [g.add("IndexCopy", cache, pos, x, axis=1)]
    g.verify()
    graph, progs = programs(g)
    inputs = {"cache": rng.standard_normal((2, 80, 8)).astype(np.float32),
              "pos": rng.integers(-80, 80, count).astype(np.int64),
              "x": rng.standard_normal((2, count, 8)).astype(np.float32)}
    assert len(set(inputs["pos"] % 80)) < count   # (repeats)
    values = reference(graph, inputs)
    (program,) = progs
    module = render_module(program.unique)
    lib = host_library(program.unique, tmp_path, module)
    problems = run_on_host(lib, module, program, values)
    assert not problems, "\n".join(problems)
