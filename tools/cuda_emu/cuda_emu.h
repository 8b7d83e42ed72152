// cuda_emu.h -- a CPU emulation of the CUDA execution model, so that the system g++
// compiles the very same cuda/*.cu sources and runs their kernels on the host.
//
// What it models
//   * a grid of blocks; the threads of one block are fibers (ucontext + _setjmp) run
//     cooperatively on one OS thread; several OS threads may run different blocks.
//   * __syncthreads / __syncthreads_count/and/or: a block barrier.  Exited threads count
//     as arrived (as on sm_70+).  A barrier that can never complete is reported as a
//     deadlock, never a hang.
//   * __shared__ (static thread_local: per OS thread, hence per running block) and
//     dynamic shared memory (``extern __shared__ T name[];`` is rewritten by the Python
//     driver to ``T* name = (T*)gk_emu::dynamic_shared();``), poisoned with 0xFF bytes
//     at every block start.
//   * warps of 32 lanes: __shfl(_up/_down/_xor)_sync, __ballot/__any/__all_sync,
//     __syncwarp, __activemask, and a generic warp collective used by the mma layer
//     (cuda/common/mma.cuh).  Every lane named in a mask must arrive (lanes that do not
//     exist in a partial warp are exempt); reading a lane that did not take part gives
//     0xFF poison bytes.
//   * atomics (GCC __atomic builtins: correct across OS threads), threadIdx, blockIdx,
//     blockDim, gridDim, warpSize, __half/__nv_bfloat16 (+ 2-vectors) with round-to-
//     nearest-even conversions, vector types, the usual math intrinsics.
//   * faults: an access outside a buffer (guard pages: SIGSEGV) and, with the driver's
//     default -fsanitize=alignment (trap mode), an access through a misaligned pointer
//     (SIGILL) end the launch with an error instead of crashing or passing by luck.
//
//   * performance counters (builds with -DGK_EMU_PERF and -fsanitize=thread, made by the
//     driver for EmuBackend(perf=True)): shared-memory bank-conflict ways and global-memory
//     sectors of every warp-wide access, per call site (see "performance counters" below).
//
// Not modelled: memory ordering races between threads of a block inside one barrier
// interval (fibers run one at a time, so a missing __syncthreads may go unnoticed when
// the schedule happens to be benign), warp-synchronous code without *_sync primitives,
// texture/surface memory, cooperative-groups grid sync, clusters.
//
// The driver (tools/cuda_emu/emulator.py) generates a launcher TU that includes this
// header, then the kernel source, then a table of kernel instantiations; see README.md.
#pragma once
#ifndef GK_CUDA_EMU_H
#define GK_CUDA_EMU_H

#define GK_EMULATOR 1

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef GK_EMU_PERF
// Performance counters (GK_EMU_PERF builds, see the "performance counters" section below):
// the kernel code is compiled with -fsanitize=thread, whose instrumentation calls
// __tsan_readN/__tsan_writeN before every memory access; this header defines those
// functions (no TSan runtime is linked) and the emulator's own code is left uninstrumented.
#include <dlfcn.h>
#include <link.h>
#define GK_EMU_RT __attribute__((no_sanitize("thread")))
#define GK_EMU_RT_NOINLINE __attribute__((no_sanitize("thread"), noinline))
#else
#define GK_EMU_RT
#define GK_EMU_RT_NOINLINE
#endif

// ---------------------------------------------------------------- keywords
#define __global__
#define __device__
#define __host__
#ifdef GK_EMU_PERF
#define __forceinline__ inline __attribute__((always_inline))
#else
#define __forceinline__ inline
#endif
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __shared__ static thread_local
#define __constant__ static
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __CUDACC_EMU__ 1

// ---------------------------------------------------------------- vector types
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

#define GK_EMU_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; }; \
  inline N make_##N(T x, T y) { N v; v.x = x; v.y = y; return v; }
#define GK_EMU_VEC3(T, N) struct N { T x, y, z; }; \
  inline N make_##N(T x, T y, T z) { N v; v.x = x; v.y = y; v.z = z; return v; }
#define GK_EMU_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
  inline N make_##N(T x, T y, T z, T w) { N v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }

GK_EMU_VEC2(float, float2, 8)
GK_EMU_VEC3(float, float3)
GK_EMU_VEC4(float, float4, 16)
GK_EMU_VEC2(double, double2, 16)
GK_EMU_VEC2(int, int2, 8)
GK_EMU_VEC3(int, int3)
GK_EMU_VEC4(int, int4, 16)
GK_EMU_VEC2(unsigned int, uint2, 8)
GK_EMU_VEC4(unsigned int, uint4, 16)
GK_EMU_VEC2(short, short2, 4)
GK_EMU_VEC4(short, short4, 8)
GK_EMU_VEC2(unsigned short, ushort2, 4)
GK_EMU_VEC4(unsigned short, ushort4, 8)
GK_EMU_VEC4(signed char, char4, 4)
GK_EMU_VEC4(unsigned char, uchar4, 4)
GK_EMU_VEC2(long long, longlong2, 16)
GK_EMU_VEC2(unsigned long long, ulonglong2, 16)
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { uint3 v; v.x = x; v.y = y; v.z = z; return v; }

// ---------------------------------------------------------------- the scheduler
namespace gk_emu {

enum FiberState { F_NEW, F_RUNNABLE, F_WAIT_BAR, F_WAIT_WARP, F_DONE };

struct Fiber {
  jmp_buf jb;
  ucontext_t uc;
  char* stack = nullptr;
  int state = F_NEW;
  uint3 tid{0, 0, 0};
  int linear = 0;
  int lane = 0;
  int warp = 0;
  const char* where = "";  // what it waits on (diagnostics)
};

// One lane's part in a warp collective.
struct LaneSlot {
  const void* in = nullptr;
  void* out = nullptr;
};
using CollectiveFn = void (*)(const LaneSlot* slots, unsigned participants, void* ctx);

struct Warp {
  unsigned arrived = 0;   // lanes that arrived at the pending collective
  unsigned mask = 0;      // the pending collective's member mask (as given)
  unsigned exists = 0;    // lanes that exist in this warp
  unsigned done = 0;      // lanes that exited
  CollectiveFn fn = nullptr;
  void* ctx = nullptr;
  const char* what = "";
  LaneSlot slots[32];
};

struct Block {
  uint3 bid{0, 0, 0};
  dim3 bdim, gdim;
  int nthreads = 0;
  int n_done = 0;
  int bar_arrived = 0;
  int bar_count = 0;  // predicate sum for __syncthreads_count/and/or
  int bar_result = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  unsigned char* dyn_smem = nullptr;
  size_t dyn_smem_size = 0;
};

#ifdef GK_EMU_PERF
namespace perf { struct PerfWorker; }
#endif

struct Worker {
  jmp_buf sched_jb;
  ucontext_t sched_uc;
  Block* block = nullptr;
  Fiber* cur = nullptr;
  std::function<void()> body;
  std::vector<char*> stacks;
  size_t stack_size = 0;
  std::vector<unsigned char> dyn;
  std::string error;
  bool failed = false;
#ifdef GK_EMU_PERF
  perf::PerfWorker* perf = nullptr;
  bool in_runtime = false;  // a warp collective's body runs: its memory accesses are not the kernel's
#endif
};

inline thread_local Worker* tl_worker = nullptr;
inline size_t g_stack_size = 256 * 1024;

#ifdef GK_EMU_PERF
// ---------------------------------------------------------------- performance counters
// The access model (README.md, "Performance counters"):
//   * every instrumented load/store of a thread is classified by address: shared memory
//     (the block's dynamic shared memory, or this module's thread-local block, where
//     static __shared__ arrays live, minus the emulator's own thread_locals), global memory
//     (a device buffer the driver registered), anything else (locals on the fiber stack,
//     the emulator's structures) is ignored;
//   * a thread's accesses are kept in order (its trace) until the warp reconverges: a
//     __syncthreads every live thread reached, a warp collective every live lane reached,
//     the end of the block.  Then the 32 traces are merged into warp instructions: lane
//     0's trace is the first list of instructions, and each further lane's accesses are
//     matched in order to the next instruction of the same site (the same call of
//     __tsan_*: one PC of the kernel) or, when none follows, inserted as a new instruction
//     (the lanes that skipped it were inactive, as under SIMT divergence);
//   * consecutive 1-byte accesses of one lane at one site within one aligned 16-byte chunk
//     are one access (the emulator's byte-wise cp.async);
//   * shared memory: 32 banks of 4 bytes.  An instruction whose widest lane access is
//     <= 4 bytes is one phase of 32 lanes, 8 bytes two phases of 16 lanes, 16 bytes four
//     phases of 8 lanes (ldmatrix: one 8x8 matrix, i.e. 8 row addresses, per phase).  The
//     ways of a phase = the most distinct 4-byte words any one bank holds among the words
//     its lanes touch (lanes reading the same word share it: broadcast); an instruction's
//     ways = the max over its phases, its wavefronts = the sum, its ideal wavefronts = the
//     number of phases with an active lane;
//   * global memory: sectors = distinct 32-byte aligned segments the lanes' bytes touch;
//     ideal = ceil(distinct bytes / 32).
namespace perf {
// (Library templates -- std::sort, containers -- would be instrumented themselves: the
// counters use plain arrays and loops, and in_runtime keeps anything else out.)

enum : unsigned char { SHARED = 0, GLOBAL = 1 };

struct SiteKey {
  uintptr_t pc;
  unsigned char space, store;
};

constexpr int NFIELDS = 10;
struct Stats {
  unsigned long long requests, lanes, bytes, ways_sum, ways_max, conflicted, wavefronts, ideal_wavefronts, sectors,
      ideal_sectors;
};

struct Access {
  uintptr_t addr;
  unsigned site;
  unsigned short size;
  unsigned char bytewise;
};
struct Instr {  // one warp instruction: the lanes that took part and their accesses
  unsigned site;
  unsigned mask;
  uintptr_t addr[32];
  unsigned short size[32];
};
struct Range {
  uintptr_t lo, hi;
};

// A growable array of trivially copyable T (malloc'd; zero-initialised growth).
template <class T>
struct Buf {
  T* data = nullptr;
  size_t n = 0, cap = 0;
  GK_EMU_RT void reserve(size_t c) {
    if (c <= cap) return;
    size_t nc = cap ? cap : 16;
    while (nc < c) nc *= 2;
    data = static_cast<T*>(std::realloc(data, nc * sizeof(T)));
    if (!data) std::abort();
    std::memset(static_cast<void*>(data + cap), 0, (nc - cap) * sizeof(T));
    cap = nc;
  }
  GK_EMU_RT T& push(const T& v) {
    reserve(n + 1);
    data[n] = v;
    return data[n++];
  }
  GK_EMU_RT void insert(size_t i, const T& v) {
    reserve(n + 1);
    std::memmove(static_cast<void*>(data + i + 1), static_cast<const void*>(data + i), (n - i) * sizeof(T));
    data[i] = v;
    ++n;
  }
  GK_EMU_RT void release() {
    std::free(data);
    data = nullptr;
    n = cap = 0;
  }
};

struct Global {
  Worker* worker = nullptr;  // the one worker of a counted launch (a plain global: no TLS lookup per access)
  Buf<Range> ranges;         // device buffers, sorted by lo
  Buf<SiteKey> sites;        // the last launch's counters
  Buf<Stats> stats;
};
inline Global g;

struct PerfWorker {
  uintptr_t tls_lo = 0, tls_hi = 0, skip_lo = 0, skip_hi = 0;
  Buf<SiteKey> sites;  // site id -> key
  Buf<Stats> stats;    // by site id
  Buf<unsigned> table; // open addressing: site id + 1, 0 = empty
  Buf<Buf<Access>> traces;  // by thread of the block
  Buf<Instr> merged;
};

// This module's thread-local block for the calling thread (static __shared__ arrays are
// `static thread_local`), without the emulator's tl_worker (read by threadIdx & co.).
GK_EMU_RT inline void tls_range(PerfWorker& p) {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&tls_range), &info)) return;
  void* data = nullptr;
  if (void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
    dlinfo(h, RTLD_DI_TLS_DATA, &data);
    dlclose(h);
  }
  struct Ctx { uintptr_t base; size_t size; } ctx{reinterpret_cast<uintptr_t>(info.dli_fbase), 0};
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* c) -> int {
        Ctx* x = static_cast<Ctx*>(c);
        if (i->dlpi_addr != x->base) return 0;
        for (int k = 0; k < i->dlpi_phnum; ++k)
          if (i->dlpi_phdr[k].p_type == PT_TLS) x->size = i->dlpi_phdr[k].p_memsz;
        return 1;
      },
      &ctx);
  if (data) {
    p.tls_lo = reinterpret_cast<uintptr_t>(data);
    p.tls_hi = p.tls_lo + ctx.size;
  }
  p.skip_lo = reinterpret_cast<uintptr_t>(&tl_worker);
  p.skip_hi = p.skip_lo + sizeof(tl_worker);
}

GK_EMU_RT inline int classify(Worker* w, uintptr_t a) {
  const Fiber* f = w->cur;
  if (a >= reinterpret_cast<uintptr_t>(f->stack) && a < reinterpret_cast<uintptr_t>(f->stack) + w->stack_size)
    return -1;  // the thread's locals
  Block* b = w->block;
  const uintptr_t d = reinterpret_cast<uintptr_t>(b->dyn_smem);
  if (a >= d && a < d + b->dyn_smem_size) return SHARED;
  const PerfWorker* p = w->perf;
  if (a >= p->tls_lo && a < p->tls_hi && !(a >= p->skip_lo && a < p->skip_hi)) return SHARED;
  size_t lo = 0, hi = g.ranges.n;  // the last range starting at or below a
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (g.ranges.data[mid].lo <= a) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && a < g.ranges.data[lo - 1].hi) return GLOBAL;
  return -1;
}

GK_EMU_RT inline unsigned site_id(PerfWorker* p, uintptr_t pc, int space, bool store) {
  if (p->table.cap < 2 * (p->sites.n + 1)) {  // grow and rehash
    Buf<unsigned> t;
    t.reserve(p->table.cap ? 2 * p->table.cap : 1024);
    t.n = t.cap;
    for (size_t i = 0; i < p->sites.n; ++i) {
      size_t h = (p->sites.data[i].pc * 0x9E3779B97F4A7C15ull) >> 20;
      while (t.data[h & (t.cap - 1)]) ++h;
      t.data[h & (t.cap - 1)] = (unsigned)i + 1;
    }
    p->table.release();
    p->table = t;
  }
  size_t h = (pc * 0x9E3779B97F4A7C15ull) >> 20;
  for (;; ++h) {
    unsigned& slot = p->table.data[h & (p->table.cap - 1)];
    if (!slot) {
      p->sites.push(SiteKey{pc, (unsigned char)space, (unsigned char)store});
      p->stats.push(Stats{});
      slot = (unsigned)p->sites.n;
      return slot - 1;
    }
    const SiteKey& k = p->sites.data[slot - 1];
    if (k.pc == pc && k.space == space && k.store == store) return slot - 1;
  }
}

GK_EMU_RT inline void record(Worker* w, uintptr_t a, unsigned size, bool store, uintptr_t pc, int space) {
  PerfWorker* p = w->perf;
  const unsigned id = site_id(p, pc, space, store);
  Buf<Access>& tr = p->traces.data[w->cur->linear];
  if (size == 1) {  // a byte-wise copy: contiguous bytes within one 16-byte chunk are one access
    for (size_t back = 1; back <= 2 && back <= tr.n; ++back) {
      Access& e = tr.data[tr.n - back];
      if (e.site == id && e.bytewise && e.addr + e.size == a && (e.addr >> 4) == (a >> 4)) {
        e.size++;
        return;
      }
    }
  }
  tr.push(Access{a, id, (unsigned short)size, (unsigned char)(size == 1)});
}

GK_EMU_RT inline void hook(const void* ptr, unsigned size, bool store, const void* pc) {
  Worker* w = g.worker;
  if (!w || !w->cur || w->in_runtime) return;
  w->in_runtime = true;
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  const int space = classify(w, a);
  if (space >= 0) record(w, a, size, store, reinterpret_cast<uintptr_t>(pc), space);
  w->in_runtime = false;
}

struct Iv {
  uintptr_t lo, hi;
};
GK_EMU_RT inline void small_sort(Iv* x, int n) {  // insertion sorts (n <= a few hundred)
  for (int i = 1; i < n; ++i) {
    const Iv v = x[i];
    int j = i - 1;
    for (; j >= 0 && v.lo < x[j].lo; --j) x[j + 1] = x[j];
    x[j + 1] = v;
  }
}
GK_EMU_RT inline void small_sort(uintptr_t* x, int n) {
  for (int i = 1; i < n; ++i) {
    const uintptr_t v = x[i];
    int j = i - 1;
    for (; j >= 0 && v < x[j]; --j) x[j + 1] = x[j];
    x[j + 1] = v;
  }
}

GK_EMU_RT inline void account(Stats& s, int space, const Instr& I) {
  const unsigned mask = I.mask;
  if (!mask) return;
  Iv iv[32];
  int n = 0;
  unsigned widest = 0;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) {
      iv[n++] = Iv{I.addr[l], I.addr[l] + I.size[l]};
      if (I.size[l] > widest) widest = I.size[l];
    }
  small_sort(iv, n);
  unsigned long long unique = 0, sectors = 0;
  uintptr_t hi = 0;
  long long last_sector = -1;
  for (int i = 0; i < n; ++i) {
    const uintptr_t lo = iv[i].lo > hi ? iv[i].lo : hi;
    if (iv[i].hi > lo) {
      unique += iv[i].hi - lo;
      long long first = (long long)(lo >> 5);
      const long long last = (long long)((iv[i].hi - 1) >> 5);
      if (first <= last_sector) first = last_sector + 1;
      if (last >= first) sectors += last - first + 1;
      if (last > last_sector) last_sector = last;
      hi = iv[i].hi;
    }
  }
  s.requests++;
  s.lanes += __builtin_popcount(mask);
  s.bytes += unique;
  if (space == GLOBAL) {
    s.sectors += sectors;
    s.ideal_sectors += (unique + 31) / 32;
    return;
  }
  const int per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
  unsigned ways_max = 0;
  for (int ph = 0; ph < 32; ph += per_phase) {
    const unsigned pm = per_phase == 32 ? mask : mask & (((1u << per_phase) - 1u) << ph);
    if (!pm) continue;
    uintptr_t words[256];
    int nw = 0;
    for (int l = ph; l < ph + per_phase; ++l)
      if (pm >> l & 1u)
        for (uintptr_t wd = I.addr[l] >> 2; wd <= (I.addr[l] + I.size[l] - 1) >> 2 && nw < 256; ++wd)
          words[nw++] = wd;
    small_sort(words, nw);
    int bank[32] = {0};
    unsigned ways = 0;
    for (int i = 0; i < nw; ++i)
      if (i == 0 || words[i] != words[i - 1]) {
        const unsigned c = (unsigned)++bank[words[i] & 31];
        if (c > ways) ways = c;
      }
    s.wavefronts += ways;
    s.ideal_wavefronts += 1;
    if (ways > ways_max) ways_max = ways;
  }
  s.ways_sum += ways_max;
  if (ways_max > s.ways_max) s.ways_max = ways_max;
  if (ways_max > 1) s.conflicted++;
}

// Merge the traces of warp `warp`'s lanes into warp instructions and count them.
GK_EMU_RT inline void flush_warp(Worker* w, int warp) {
  PerfWorker* p = w->perf;
  const int base = warp * 32, nl = w->block->nthreads - base < 32 ? w->block->nthreads - base : 32;
  Buf<Instr>& M = p->merged;
  M.n = 0;
  for (int l = 0; l < nl; ++l) {
    Buf<Access>& tr = p->traces.data[base + l];
    size_t pos = 0;
    for (size_t i = 0; i < tr.n; ++i) {
      const Access& e = tr.data[i];
      size_t q = pos;
      const size_t lim = M.n < pos + 4096 ? M.n : pos + 4096;
      while (q < lim && M.data[q].site != e.site) ++q;
      if (q == lim) {
        q = pos;
        Instr fresh;
        fresh.site = e.site;
        fresh.mask = 0;
        M.insert(q, fresh);
      }
      Instr& I = M.data[q];
      I.mask |= 1u << l;
      I.addr[l] = e.addr;
      I.size[l] = e.size;
      pos = q + 1;
    }
    tr.n = 0;
  }
  for (size_t i = 0; i < M.n; ++i) {
    const Instr& I = M.data[i];
    account(p->stats.data[I.site], p->sites.data[I.site].space, I);
  }
  M.n = 0;
}

GK_EMU_RT inline void flush_block(Worker* w) {
  if (!w->perf) return;
  const bool was = w->in_runtime;
  w->in_runtime = true;
  const int nwarps = (w->block->nthreads + 31) / 32;
  for (int i = 0; i < nwarps; ++i) flush_warp(w, i);
  w->in_runtime = was;
}

GK_EMU_RT inline void block_begin(Worker* w, int nthreads) {
  PerfWorker* p = w->perf;
  p->traces.reserve((size_t)nthreads);
  if (p->traces.n < (size_t)nthreads) p->traces.n = (size_t)nthreads;
  for (size_t i = 0; i < p->traces.n; ++i) p->traces.data[i].n = 0;
}

GK_EMU_RT inline void worker_begin(Worker& w) {
  w.in_runtime = true;
  w.perf = new PerfWorker();
  tls_range(*w.perf);
  g.worker = &w;
  w.in_runtime = false;
}
GK_EMU_RT inline void worker_end(Worker& w) {
  if (!w.perf) return;
  w.in_runtime = true;
  g.worker = nullptr;
  PerfWorker* p = w.perf;
  if (!w.failed) {
    for (size_t i = 0; i < p->sites.n; ++i) {
      g.sites.push(p->sites.data[i]);
      g.stats.push(p->stats.data[i]);
    }
  }
  for (size_t i = 0; i < p->traces.cap; ++i) p->traces.data[i].release();
  p->traces.release();
  p->sites.release();
  p->stats.release();
  p->table.release();
  p->merged.release();
  delete p;
  w.perf = nullptr;
  w.in_runtime = false;
}

}  // namespace perf
#endif

struct EmuError {
  std::string message;
};

[[noreturn]] GK_EMU_RT inline void fail(const std::string& message) {
  Worker* w = tl_worker;
  std::string where;
  if (w && w->cur && w->block) {
    char buf[160];
    std::snprintf(buf, sizeof buf, " [block (%u,%u,%u) thread (%u,%u,%u)]", w->block->bid.x, w->block->bid.y,
                  w->block->bid.z, w->cur->tid.x, w->cur->tid.y, w->cur->tid.z);
    where = buf;
  }
  if (w) {
    w->failed = true;
    if (w->error.empty()) w->error = message + where;
    // abandon every fiber of the block: jump back to the scheduler
    if (w->cur) _longjmp(w->sched_jb, 2);
  }
  throw EmuError{message + where};
}

GK_EMU_RT inline Fiber* cur_fiber() { return tl_worker->cur; }
GK_EMU_RT inline Block* cur_block() { return tl_worker->block; }

GK_EMU_RT inline void yield() {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  if (!_setjmp(f->jb)) _longjmp(w->sched_jb, 1);
}

GK_EMU_RT inline void fiber_entry() {
  Worker* w = tl_worker;
  w->body();
  Fiber* f = w->cur;
  f->state = F_DONE;
  Block* b = w->block;
  b->n_done++;
  Warp& W = b->warps[f->warp];
  W.done |= 1u << f->lane;
  // a pending block barrier may now be complete
  if (b->bar_arrived > 0 && b->bar_arrived + b->n_done == b->nthreads) {
    b->bar_arrived = 0;
#ifdef GK_EMU_PERF
    perf::flush_block(w);
#endif
    for (auto& g : b->fibers)
      if (g.state == F_WAIT_BAR) g.state = F_RUNNABLE;
  }
  _longjmp(w->sched_jb, 1);
}

GK_EMU_RT inline void syncthreads_impl(int pred) {
  Worker* w = tl_worker;
  Block* b = w->block;
  Fiber* f = w->cur;
  if (b->bar_arrived == 0) b->bar_count = 0;
  b->bar_count += pred ? 1 : 0;
  b->bar_arrived++;
  f->state = F_WAIT_BAR;
  f->where = "__syncthreads";
  if (b->bar_arrived + b->n_done == b->nthreads) {
    b->bar_arrived = 0;
    b->bar_result = b->bar_count;
#ifdef GK_EMU_PERF
    perf::flush_block(w);  // every live thread is here: its accesses so far are complete
#endif
    for (auto& g : b->fibers)
      if (g.state == F_WAIT_BAR) g.state = F_RUNNABLE;
  }
  while (f->state == F_WAIT_BAR) yield();
}

// A warp collective: every lane in mask (that exists) arrives with its in/out pointers;
// the last to arrive runs fn over all slots, then all continue.
GK_EMU_RT_NOINLINE inline void warp_collective(unsigned mask, const void* in, void* out, CollectiveFn fn, void* ctx,
                            const char* what) {
  Worker* w = tl_worker;
  Block* b = w->block;
  Fiber* f = w->cur;
  Warp& W = b->warps[f->warp];
  unsigned bit = 1u << f->lane;
  if (!(mask & bit)) fail(std::string(what) + ": the calling lane is not in the member mask");
  unsigned need = mask & W.exists;
  if (W.arrived == 0) {
    W.mask = mask;
    W.fn = fn;
    W.ctx = ctx;
    W.what = what;
  } else if (W.mask != mask || W.fn != fn) {
    fail(std::string(what) + ": lanes of one warp met at different warp operations (" + W.what +
         ") or with different member masks");
  }
  if (need & W.done) fail(std::string(what) + ": a lane named in the member mask has exited");
  W.slots[f->lane].in = in;
  W.slots[f->lane].out = out;
  W.arrived |= bit;
#ifdef GK_EMU_PERF
  // ldmatrix (common/mma.cuh): each lane gives one 16-byte row of shared memory
  if (w->perf && what[0] == 'l' && std::strncmp(what, "ldmatrix", 8) == 0) {
    w->in_runtime = true;
    perf::record(w, *static_cast<const uintptr_t*>(in), 16, false,
                 reinterpret_cast<uintptr_t>(__builtin_return_address(0)), perf::SHARED);
    w->in_runtime = false;
  }
#endif
  if (W.arrived == need) {
#ifdef GK_EMU_PERF
    w->in_runtime = true;  // the collective's own reads (ldmatrix's rows) were counted above
    W.fn(W.slots, need, W.ctx);
    if (w->perf && need == (W.exists & ~W.done)) perf::flush_warp(w, f->warp);
    w->in_runtime = false;
#else
    W.fn(W.slots, need, W.ctx);
#endif
    W.arrived = 0;
    for (int l = 0; l < 32; ++l)
      if (need & (1u << l)) {
        Fiber& g = b->fibers[f->warp * 32 + l];
        if (g.state == F_WAIT_WARP) g.state = F_RUNNABLE;
      }
    return;
  }
  f->state = F_WAIT_WARP;
  f->where = what;
  while (f->state == F_WAIT_WARP) yield();
}

// -------- shuffles and votes on top of the collective
struct ShflArgs {
  unsigned long long value;  // bit pattern, up to 8 bytes
  int src;                   // absolute source lane, or -1 for "keep own value"
};
GK_EMU_RT inline void shfl_fn(const LaneSlot* s, unsigned parts, void*) {
  for (int l = 0; l < 32; ++l) {
    if (!(parts & (1u << l))) continue;
    const ShflArgs* a = static_cast<const ShflArgs*>(s[l].in);
    unsigned long long* o = static_cast<unsigned long long*>(s[l].out);
    int src = a->src < 0 ? l : a->src;
    if (parts & (1u << src))
      *o = static_cast<const ShflArgs*>(s[src].in)->value;
    else
      *o = ~0ull;  // poison: the source lane did not take part
  }
}

template <class T>
GK_EMU_RT inline T shfl(unsigned mask, T var, int src, const char* what) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  ShflArgs a;
  a.value = 0;
  std::memcpy(&a.value, &var, sizeof(T));
  a.src = src;
  unsigned long long out;
  warp_collective(mask, &a, &out, shfl_fn, nullptr, what);
  T r;
  std::memcpy(&r, &out, sizeof(T));
  return r;
}

GK_EMU_RT inline int lane_id() { return tl_worker->cur->lane; }

GK_EMU_RT inline void vote_fn(const LaneSlot* s, unsigned parts, void*) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((parts & (1u << l)) && *static_cast<const int*>(s[l].in)) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l)
    if (parts & (1u << l)) *static_cast<unsigned*>(s[l].out) = ballot;
}
GK_EMU_RT inline unsigned ballot(unsigned mask, int pred, const char* what) {
  int p = pred != 0;
  unsigned out = 0;
  warp_collective(mask, &p, &out, vote_fn, nullptr, what);
  return out;
}
GK_EMU_RT inline void nop_fn(const LaneSlot*, unsigned, void*) {}

GK_EMU_RT inline unsigned char* dynamic_shared() {
  Block* b = tl_worker->block;
  return b->dyn_smem;
}

// ---------------------------------------------------------------- launching
GK_EMU_RT inline char* new_stack(size_t size) {
  // one guard page below the stack catches overflows as SIGSEGV
  long page = sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw EmuError{"cannot allocate a fiber stack"};
  mprotect(p, page, PROT_NONE);
  return static_cast<char*>(p) + page;
}

GK_EMU_RT inline void run_block(Worker& w, Block& b) {
  int n = b.nthreads;
  if ((int)w.stacks.size() < n || w.stack_size != g_stack_size) {
    w.stack_size = g_stack_size;
    while ((int)w.stacks.size() < n) w.stacks.push_back(new_stack(g_stack_size));
  }
  b.fibers.assign(n, Fiber());
  int nwarps = (n + 31) / 32;
  b.warps.assign(nwarps, Warp());
  for (int i = 0; i < nwarps; ++i) {
    int lanes = std::min(32, n - 32 * i);
    b.warps[i].exists = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
  }
  int i = 0;
  for (unsigned z = 0; z < b.bdim.z; ++z)
    for (unsigned y = 0; y < b.bdim.y; ++y)
      for (unsigned x = 0; x < b.bdim.x; ++x, ++i) {
        Fiber& f = b.fibers[i];
        f.tid = make_uint3(x, y, z);
        f.linear = i;
        f.lane = i % 32;
        f.warp = i / 32;
        f.stack = w.stacks[i];
      }
  if (b.dyn_smem_size) std::memset(b.dyn_smem, 0xFF, b.dyn_smem_size);
  w.block = &b;
#ifdef GK_EMU_PERF
  if (w.perf) perf::block_begin(&w, n);
#endif
  for (;;) {
    bool alive = false, progressed = false;
    for (int k = 0; k < n; ++k) {
      Fiber& f = b.fibers[k];
      if (f.state == F_DONE) continue;
      alive = true;
      if (f.state != F_NEW && f.state != F_RUNNABLE) continue;
      progressed = true;
      w.cur = &f;
      int r = _setjmp(w.sched_jb);
      if (r == 0) {
        if (f.state == F_NEW) {
          f.state = F_RUNNABLE;
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack;
          f.uc.uc_stack.ss_size = w.stack_size;
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, (void (*)())fiber_entry, 0);
          swapcontext(&w.sched_uc, &f.uc);
        } else {
          _longjmp(f.jb, 1);
        }
      }
      w.cur = nullptr;
      if (r == 2 || w.failed) return;
    }
    if (!alive) {
#ifdef GK_EMU_PERF
      perf::flush_block(&w);
#endif
      break;
    }
    if (!progressed) {
      std::string msg = "deadlock: no thread of the block can proceed;";
      int shown = 0;
      for (auto& f : b.fibers)
        if (f.state == F_WAIT_BAR || f.state == F_WAIT_WARP) {
          if (shown++ < 4) {
            char buf[120];
            std::snprintf(buf, sizeof buf, " thread (%u,%u,%u) waits in %s;", f.tid.x, f.tid.y, f.tid.z, f.where);
            msg += buf;
          }
        }
      char buf[160];
      std::snprintf(buf, sizeof buf, " %d of %d threads exited [block (%u,%u,%u)]", b.n_done, n, b.bid.x, b.bid.y,
                    b.bid.z);
      msg += buf;
      w.failed = true;
      w.error = msg;
      return;
    }
  }
}

// -------- catching memory faults: a SIGSEGV/SIGBUS inside a kernel becomes an error
inline thread_local sigjmp_buf* tl_fault_jb = nullptr;
inline thread_local void* tl_fault_addr = nullptr;

GK_EMU_RT inline void fault_handler(int sig, siginfo_t* info, void*) {
  if (tl_fault_jb) {
    tl_fault_addr = info->si_addr;
    siglongjmp(*tl_fault_jb, sig);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

struct LaunchResult {
  int status;  // 0 ok
  std::string message;
  void* fault_addr;
};

// Run one grid.  kernel_thread(args) runs one CUDA thread's body.
inline LaunchResult launch(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body, int nworkers) {
  long long nblocks = (long long)grid.x * grid.y * grid.z;
  int nthreads = (int)(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > 1024) return {1, "invalid block size " + std::to_string(nthreads), nullptr};
  if (block.z > 64) return {1, "blockDim.z > 64", nullptr};
  if (grid.y > 65535 || grid.z > 65535) return {1, "gridDim.y/z > 65535", nullptr};
  if (nblocks <= 0) return {1, "empty grid", nullptr};
  if (nworkers < 1) nworkers = 1;
  if (nworkers > nblocks) nworkers = (int)nblocks;
#ifdef GK_EMU_PERF
  nworkers = 1;  // counted launches run their blocks on one OS thread (perf::g.worker)
#endif

  std::atomic<long long> next{0};
  std::mutex mu;
  LaunchResult result{0, "", nullptr};

  auto work = [&]() {
    Worker w;
    w.body = body;
    w.dyn.assign(smem + 16, 0);
    Block b;
    b.bdim = block;
    b.gdim = grid;
    b.nthreads = nthreads;
    b.dyn_smem = w.dyn.data() + ((16 - ((uintptr_t)w.dyn.data() % 16)) % 16);
    b.dyn_smem_size = smem;
    tl_worker = &w;
    // alternate signal stack so that a fault on a fiber stack (overflow) is handled
    stack_t ss{}, old_ss{};
    std::vector<char> altstack(1 << 16);
    ss.ss_sp = altstack.data();
    ss.ss_size = altstack.size();
    sigaltstack(&ss, &old_ss);
#ifdef GK_EMU_PERF
    perf::worker_begin(w);
#endif
    sigjmp_buf fjb;
    tl_fault_jb = &fjb;
    int sig = sigsetjmp(fjb, 1);
    if (sig == 0) {
      for (;;) {
        long long i = next.fetch_add(1);
        if (i >= nblocks) break;
        b.bid = make_uint3((unsigned)(i % grid.x), (unsigned)((i / grid.x) % grid.y), (unsigned)(i / ((long long)grid.x * grid.y)));
        b.n_done = 0;
        b.bar_arrived = 0;
        run_block(w, b);
        if (w.failed) {
          next.store(nblocks);
          break;
        }
      }
    } else {
      next.store(nblocks);
      w.failed = true;
      char buf[300];
      if (sig == SIGILL)  // the alignment check's trap (-fsanitize=alignment, trap mode)
        std::snprintf(buf, sizeof buf, "misaligned address: a load or store through a pointer not aligned to "
                      "its type (alignment check trapped at %p) in block (%u,%u,%u)", tl_fault_addr, b.bid.x,
                      b.bid.y, b.bid.z);
      else
        std::snprintf(buf, sizeof buf, "memory fault (signal %d) at address %p in block (%u,%u,%u)", sig,
                      tl_fault_addr, b.bid.x, b.bid.y, b.bid.z);
      w.error = buf;
      std::lock_guard<std::mutex> g(mu);
      if (result.status == 0 && sig != SIGILL) result.fault_addr = tl_fault_addr;
    }
    tl_fault_jb = nullptr;
#ifdef GK_EMU_PERF
    perf::worker_end(w);
#endif
    sigaltstack(&old_ss, nullptr);
    tl_worker = nullptr;
    for (char* s : w.stacks) munmap(s - sysconf(_SC_PAGESIZE), w.stack_size + sysconf(_SC_PAGESIZE));
    if (w.failed) {
      std::lock_guard<std::mutex> g(mu);
      if (result.status == 0) {
        result.status = 2;
        result.message = w.error;
      }
    }
  };

  struct sigaction sa{}, old_segv{}, old_bus{}, old_ill{};
  sa.sa_sigaction = fault_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  sigaction(SIGILL, &sa, &old_ill);
  try {
    if (nworkers == 1) {
      work();
    } else {
      std::vector<std::thread> ts;
      for (int t = 0; t < nworkers; ++t) ts.emplace_back(work);
      for (auto& t : ts) t.join();
    }
  } catch (const EmuError& e) {
    result = {2, e.message, nullptr};
  }
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  sigaction(SIGILL, &old_ill, nullptr);
  return result;
}

// Unpack a cuLaunchKernel-style argument array into a kernel's parameters.
template <class... P, size_t... I>
inline void call_kernel(void (*fn)(P...), void** args, std::index_sequence<I...>) {
  fn(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

// Parameter signature, checked by the Python driver: one letter per parameter
// ('p' pointer, 'i' signed int, 'u' unsigned int, 'f' float, 'b' bool, 's' struct) + size.
template <class T>
inline std::string param_code() {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  char c = std::is_pointer<U>::value ? 'p'
           : std::is_same<U, bool>::value ? 'b'
           : std::is_floating_point<U>::value ? 'f'
           : std::is_integral<U>::value ? (std::is_signed<U>::value ? 'i' : 'u')
                                         : 's';
  return std::string(1, c) + std::to_string(sizeof(U));
}
template <class... P>
inline std::string signature(void (*)(P...)) {
  std::string s;
  ((s += param_code<P>() + ","), ...);
  return s;
}

template <class... P>
inline LaunchResult launch_kernel(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, void** args, int nworkers) {
  std::function<void()> body = [fn, args]() { call_kernel(fn, args, std::index_sequence_for<P...>{}); };
  return launch(grid, block, smem, body, nworkers);
}

}  // namespace gk_emu

#ifdef GK_EMU_PERF
// ---------------------------------------------------------------- TSan entry points
// Called by -fsanitize=thread instrumentation of the kernel code (no TSan runtime is linked).
extern "C" {
#define GK_EMU_TSAN_RW(N)                                                                                 \
  GK_EMU_RT_NOINLINE void __tsan_read##N(void* p) { gk_emu::perf::hook(p, N, false, __builtin_return_address(0)); } \
  GK_EMU_RT_NOINLINE void __tsan_write##N(void* p) { gk_emu::perf::hook(p, N, true, __builtin_return_address(0)); } \
  GK_EMU_RT_NOINLINE void __tsan_unaligned_read##N(void* p) {                                           \
    gk_emu::perf::hook(p, N, false, __builtin_return_address(0));                                        \
  }                                                                                                       \
  GK_EMU_RT_NOINLINE void __tsan_unaligned_write##N(void* p) {                                          \
    gk_emu::perf::hook(p, N, true, __builtin_return_address(0));                                         \
  }
GK_EMU_TSAN_RW(1)
GK_EMU_TSAN_RW(2)
GK_EMU_TSAN_RW(4)
GK_EMU_TSAN_RW(8)
GK_EMU_TSAN_RW(16)
#undef GK_EMU_TSAN_RW
GK_EMU_RT void __tsan_init() {}
GK_EMU_RT void __tsan_func_entry(void*) {}
GK_EMU_RT void __tsan_func_exit() {}
GK_EMU_RT void __tsan_vptr_update(void**, void*) {}
GK_EMU_RT void __tsan_vptr_read(void**) {}
GK_EMU_RT void __tsan_read_range(void*, unsigned long) {}
GK_EMU_RT void __tsan_write_range(void*, unsigned long) {}
// atomics of instrumented code (std::atomic in the launcher, the atomic*() helpers), done as
// written (sequentially consistent) and not counted
#define GK_EMU_TSAN_ATOMIC(N, T)                                                                          \
  GK_EMU_RT T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                                    \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                  \
  }                                                                                                       \
  GK_EMU_RT T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  GK_EMU_RT T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {                                  \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                  \
  }                                                                                                       \
  GK_EMU_RT int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {        \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);               \
  }                                                                                                       \
  GK_EMU_RT int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {          \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
  }                                                                                                       \
  GK_EMU_RT T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {              \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                     \
    return c;                                                                                             \
  }
GK_EMU_TSAN_ATOMIC(8, unsigned char)
GK_EMU_TSAN_ATOMIC(16, unsigned short)
GK_EMU_TSAN_ATOMIC(32, unsigned int)
GK_EMU_TSAN_ATOMIC(64, unsigned long long)
#undef GK_EMU_TSAN_ATOMIC
GK_EMU_RT void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
GK_EMU_RT void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// The driver's interface: register the device buffers before a launch, take the counters
// after it (one record of 3 + NFIELDS u64 per site: pc offset in this library, space,
// store, then the Stats fields in order).
GK_EMU_RT void gk_emu_perf_set_ranges(const unsigned long long* pairs, size_t n) {
  auto& r = gk_emu::perf::g.ranges;
  r.n = 0;
  for (size_t i = 0; i < n; ++i) r.push(gk_emu::perf::Range{(uintptr_t)pairs[2 * i], (uintptr_t)pairs[2 * i + 1]});
  for (size_t i = 1; i < r.n; ++i)  // by lo
    for (size_t j = i; j > 0 && r.data[j].lo < r.data[j - 1].lo; --j) {
      gk_emu::perf::Range t = r.data[j];
      r.data[j] = r.data[j - 1];
      r.data[j - 1] = t;
    }
}
GK_EMU_RT size_t gk_emu_perf_take(unsigned long long* out, size_t cap) {
  auto& g = gk_emu::perf::g;
  Dl_info info;
  uintptr_t base = 0;
  if (dladdr(reinterpret_cast<void*>(&gk_emu_perf_take), &info)) base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  const size_t n = g.sites.n;
  if (n > cap) return n;  // kept until a buffer large enough comes
  for (size_t i = 0; i < n; ++i) {
    unsigned long long* o = out + i * (3 + gk_emu::perf::NFIELDS);
    const gk_emu::perf::SiteKey& k = g.sites.data[i];
    const gk_emu::perf::Stats& s = g.stats.data[i];
    o[0] = k.pc - base - 1;  // the call instruction, not the return address
    o[1] = k.space;
    o[2] = k.store;
    const unsigned long long f[gk_emu::perf::NFIELDS] = {s.requests, s.lanes, s.bytes, s.ways_sum, s.ways_max,
                                                         s.conflicted, s.wavefronts, s.ideal_wavefronts,
                                                         s.sectors, s.ideal_sectors};
    for (int j = 0; j < gk_emu::perf::NFIELDS; ++j) o[3 + j] = f[j];
  }
  g.sites.n = 0;
  g.stats.n = 0;
  return n;
}
}
#endif

// ---------------------------------------------------------------- built-in variables
#define threadIdx (::gk_emu::tl_worker->cur->tid)
#define blockIdx (::gk_emu::tl_worker->block->bid)
#define blockDim (::gk_emu::tl_worker->block->bdim)
#define gridDim (::gk_emu::tl_worker->block->gdim)
#define warpSize 32

// ---------------------------------------------------------------- synchronisation
inline void __syncthreads() { gk_emu::syncthreads_impl(0); }
inline int __syncthreads_count(int p) { gk_emu::syncthreads_impl(p); return gk_emu::cur_block()->bar_result; }
inline int __syncthreads_and(int p) { gk_emu::syncthreads_impl(p); return gk_emu::cur_block()->bar_result == gk_emu::cur_block()->nthreads - gk_emu::cur_block()->n_done; }
inline int __syncthreads_or(int p) { gk_emu::syncthreads_impl(p); return gk_emu::cur_block()->bar_result != 0; }
inline void __syncwarp(unsigned mask = 0xffffffffu) { gk_emu::warp_collective(mask, nullptr, nullptr, gk_emu::nop_fn, nullptr, "__syncwarp"); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) {}
inline unsigned __activemask() {
  gk_emu::Block* b = gk_emu::cur_block();
  gk_emu::Warp& W = b->warps[gk_emu::cur_fiber()->warp];
  return W.exists & ~W.done;
}
inline long long clock64() { static thread_local long long t = 0; return t += 1; }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  int lane = gk_emu::lane_id();
  int base = lane & ~(width - 1);
  return gk_emu::shfl(mask, v, base + (src & (width - 1)), "__shfl_sync");
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int lane = gk_emu::lane_id();
  int base = lane & ~(width - 1);
  int s = lane - (int)delta;
  return gk_emu::shfl(mask, v, s < base ? -1 : s, "__shfl_up_sync");
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  int lane = gk_emu::lane_id();
  int base = lane & ~(width - 1);
  int s = lane + (int)delta;
  return gk_emu::shfl(mask, v, s >= base + width ? -1 : s, "__shfl_down_sync");
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
  int lane = gk_emu::lane_id();
  int base = lane & ~(width - 1);
  int s = lane ^ lm;
  return gk_emu::shfl(mask, v, s >= base + width ? -1 : s, "__shfl_xor_sync");
}
inline unsigned __ballot_sync(unsigned mask, int p) { return gk_emu::ballot(mask, p, "__ballot_sync"); }
inline int __any_sync(unsigned mask, int p) { return gk_emu::ballot(mask, p, "__any_sync") != 0; }
inline int __all_sync(unsigned mask, int p) {
  unsigned need = mask & gk_emu::cur_block()->warps[gk_emu::cur_fiber()->warp].exists;
  return gk_emu::ballot(mask, p, "__all_sync") == need;
}

// ---------------------------------------------------------------- atomics
#define GK_EMU_ATOMIC_INT(T)                                                                       \
  inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }            \
  inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }            \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }            \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }              \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }            \
  inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }          \
  inline T atomicCAS(T* a, T cmp, T v) {                                                           \
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
    return cmp;                                                                                    \
  }                                                                                                \
  inline T atomicMax(T* a, T v) {                                                                  \
    T old = __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                  \
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
    return old;                                                                                    \
  }                                                                                                \
  inline T atomicMin(T* a, T v) {                                                                  \
    T old = __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                  \
    while (old > v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {} \
    return old;                                                                                    \
  }
GK_EMU_ATOMIC_INT(int)
GK_EMU_ATOMIC_INT(unsigned int)
GK_EMU_ATOMIC_INT(unsigned long long)
GK_EMU_ATOMIC_INT(long long)
#undef GK_EMU_ATOMIC_INT

template <class F>
inline F gk_emu_atomic_float(F* a, F v, int op) {
  using I = typename std::conditional<sizeof(F) == 4, unsigned int, unsigned long long>::type;
  I* ai = reinterpret_cast<I*>(a);
  I old = __atomic_load_n(ai, __ATOMIC_SEQ_CST), nw;
  for (;;) {
    F o;
    std::memcpy(&o, &old, sizeof(F));
    F n = op == 0 ? o + v : op == 1 ? (std::isnan(o) || o < v ? v : o) : (std::isnan(o) || o > v ? v : o);
    std::memcpy(&nw, &n, sizeof(F));
    if (__atomic_compare_exchange_n(ai, &old, nw, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return o;
  }
}
inline float atomicAdd(float* a, float v) { return gk_emu_atomic_float(a, v, 0); }
inline double atomicAdd(double* a, double v) { return gk_emu_atomic_float(a, v, 0); }
inline float atomicExch(float* a, float v) {
  unsigned r = atomicExch(reinterpret_cast<unsigned*>(a), *reinterpret_cast<unsigned*>(&v));
  float f;
  std::memcpy(&f, &r, 4);
  return f;
}
inline unsigned atomicInc(unsigned* a, unsigned lim) {
  unsigned old = __atomic_load_n(a, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(a, &old, old >= lim ? 0u : old + 1, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  return old;
}
#define atomicAdd_block atomicAdd
#define atomicMax_block atomicMax

// ---------------------------------------------------------------- bits and math
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
inline long long __double_as_longlong(double f) { long long i; std::memcpy(&i, &f, 8); return i; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
  return (x >> 16) | (x << 16);
}
inline int __mul24(int a, int b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

using std::min;
using std::max;
inline long long min(long long a, int b) { return a < b ? a : b; }
inline long long min(int a, long long b) { return a < b ? a : b; }
inline long long max(long long a, int b) { return a > b ? a : b; }
inline long long max(int a, long long b) { return a > b ? a : b; }

inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / std::cbrt(x); }
inline float exp10f(float x) { return std::pow(10.f, x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : (x == x ? x : 0.f)); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)std::floor(x); }
inline int __float2int_ru(float x) { return (int)std::ceil(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)std::nearbyint(x); }
inline long long __float2ll_rn(float x) { return (long long)std::nearbyint(x); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
inline void sincos(double x, double* s, double* c) { *s = std::sin(x); *c = std::cos(x); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x / std::sqrt(2.0f)); }
template <class T> __forceinline__ T __ldg(const T* p) { return *p; }
template <class T> __forceinline__ T __ldcs(const T* p) { return *p; }
template <class T> __forceinline__ T __ldcg(const T* p) { return *p; }
template <class T> __forceinline__ T __ldlu(const T* p) { return *p; }
template <class T> __forceinline__ void __stcs(T* p, T v) { *p = v; }
template <class T> __forceinline__ void __stcg(T* p, T v) { *p = v; }
template <class T> __forceinline__ void __stwt(T* p, T v) { *p = v; }
// fabsf, fmaxf, expf, ... come from <math.h> (global namespace), as in CUDA.
using std::isnan; using std::isinf; using std::isfinite; using std::signbit;

// ---------------------------------------------------------------- half types
namespace gk_emu {
inline unsigned short f32_to_f16_bits(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  unsigned sign = (x >> 16) & 0x8000u;
  unsigned ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (unsigned short)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (ax < 0x38800000u) {                                          // subnormal half (or zero)
    float a;
    std::memcpy(&a, &ax, 4);
    // a * 2^24 rounded to nearest even integer = the subnormal mantissa
    float m = std::nearbyint(a * 16777216.0f);
    return (unsigned short)(sign | (unsigned)m);
  }
  unsigned e = ((ax >> 23) - 127 + 15);
  unsigned mant = ax & 0x7fffffu;
  unsigned h = (e << 10) | (mant >> 13);
  unsigned rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return (unsigned short)(sign | h);
}
inline float f16_bits_to_f32(unsigned short h) {
  unsigned sign = (h & 0x8000u) << 16;
  unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  unsigned x;
  if (e == 0) {
    float f = std::ldexp((float)m, -24);
    std::memcpy(&x, &f, 4);
    x |= sign;
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline unsigned short f32_to_bf16_bits(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  unsigned r = x + 0x7fffu + ((x >> 16) & 1u);
  return (unsigned short)(r >> 16);
}
inline float bf16_bits_to_f32(unsigned short b) {
  unsigned x = (unsigned)b << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace gk_emu

struct __half_raw { unsigned short x; };
struct __nv_bfloat16_raw { unsigned short x; };

struct __attribute__((aligned(2))) __half {
  unsigned short __x;
  __half() = default;
  __half(const __half_raw& r) : __x(r.x) {}
  __half(float f) : __x(gk_emu::f32_to_f16_bits(f)) {}
  __half(double f) : __x(gk_emu::f32_to_f16_bits((float)f)) {}
  __half(int i) : __x(gk_emu::f32_to_f16_bits((float)i)) {}
  operator float() const { return gk_emu::f16_bits_to_f32(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};
struct __attribute__((aligned(2))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(gk_emu::f32_to_bf16_bits(f)) {}
  __nv_bfloat16(double f) : __x(gk_emu::f32_to_bf16_bits((float)f)) {}
  __nv_bfloat16(int i) : __x(gk_emu::f32_to_bf16_bits((float)i)) {}
  operator float() const { return gk_emu::bf16_bits_to_f32(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
using half = __half;
using nv_bfloat16 = __nv_bfloat16;
struct __attribute__((aligned(4))) __half2 { __half x, y; };
struct __attribute__((aligned(4))) __nv_bfloat162 { __nv_bfloat16 x, y; };
using half2 = __half2;
using nv_bfloat162 = __nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return (float)h; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __half __ushort_as_half(unsigned short x) { return __half(__half_raw{x}); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16(__nv_bfloat16_raw{x}); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline float2 __half22float2(__half2 h) { return make_float2((float)h.x, (float)h.y); }
inline __half2 __float22half2_rn(float2 f) { return __half2{__half(f.x), __half(f.y)}; }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(a)}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return make_float2((float)h.x, (float)h.y); }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __nv_bfloat162{__nv_bfloat16(f.x), __nv_bfloat16(f.y)}; }
inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }

#define GK_EMU_HALF_OPS(H)                                                                   \
  inline H operator+(H a, H b) { return H((float)a + (float)b); }                           \
  inline H operator-(H a, H b) { return H((float)a - (float)b); }                           \
  inline H operator*(H a, H b) { return H((float)a * (float)b); }                           \
  inline H operator/(H a, H b) { return H((float)a / (float)b); }                           \
  inline H operator-(H a) { H r = a; r.__x ^= 0x8000u; return r; }                           \
  inline H& operator+=(H& a, H b) { return a = a + b; }                                      \
  inline H& operator-=(H& a, H b) { return a = a - b; }                                      \
  inline H& operator*=(H& a, H b) { return a = a * b; }                                      \
  inline bool operator==(H a, H b) { return (float)a == (float)b; }                          \
  inline bool operator!=(H a, H b) { return (float)a != (float)b; }                          \
  inline bool operator<(H a, H b) { return (float)a < (float)b; }                            \
  inline bool operator>(H a, H b) { return (float)a > (float)b; }                            \
  inline bool operator<=(H a, H b) { return (float)a <= (float)b; }                          \
  inline bool operator>=(H a, H b) { return (float)a >= (float)b; }
GK_EMU_HALF_OPS(__half)
GK_EMU_HALF_OPS(__nv_bfloat16)
#undef GK_EMU_HALF_OPS
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hfma(__half a, __half b, __half c) { return __half(std::fma((float)a, (float)b, (float)c)); }
inline __half __hneg(__half a) { return -a; }
inline __half __hmax(__half a, __half b) { return (float)a >= (float)b ? a : b; }
inline __half __hmin(__half a, __half b) { return (float)a <= (float)b ? a : b; }
inline bool __hisnan(__half a) { return std::isnan((float)a); }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) { return __nv_bfloat16(std::fma((float)a, (float)b, (float)c)); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{a.x + b.x, a.y + b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x + b.x, a.y + b.y}; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x * b.x, a.y * b.y}; }
inline __half hexp(__half a) { return __half(std::exp((float)a)); }
inline __half hsqrt(__half a) { return __half(std::sqrt((float)a)); }

#endif  // GK_CUDA_EMU_H
