// A CPU emulation of the CUDA features this crate's kernels use, so that the kernels' source runs
// (slowly) where no GPU is: every thread of a block is a fiber (ucontext), warps and blocks meet
// at emulated barriers, and the warp-wide instructions (`__shfl*_sync`, `ldmatrix`,
// `mma.sync.m16n8k16`) gather all 32 lanes' operands and compute each lane's result from the
// layouts in NVIDIA's PTX ISA documentation ("Matrix fragments for mma.m16n8k16", "ldmatrix").
// Written for this project; nothing was copied.
//
// What it checks beyond the results: all 32 lanes of a warp reach the same warp-wide
// instruction and every thread of the block the same barrier (else: "deadlock" with where each
// thread waits); `ldmatrix` and `cp.async` addresses are 16-byte aligned and inside the block's
// dynamic shared memory; shared memory starts as NaN bytes (0xff) in every block, so a read of
// what no thread wrote shows as NaN. `cp.async` copies land either at once or only at the
// issuing thread's `cp.async.wait_all` (`emu::Config::late_copies`), the two extremes the
// hardware may take, so a missing wait or barrier shows in one of the two runs. Threads run in
// turn, or (`emu::Config::seed`) by a random ranking of the warps, the highest-ranked one that can
// run always running, so that a warp gets ahead of the others as far as the barriers let it.
// `ex2.approx.ftz` is exact here but for the flush of results below 2^-126.
//
// What it does not model: timing, occupancy, register limits, bank conflicts, and the tensor
// cores' own rounding (products are summed in double and rounded once to f32). It is a check of
// the kernels' logic (indexing, fragment layouts, masking, splits, bounds), not of the GPU.
//
// Blocks run one at a time, so a function-scope `__shared__` array is an ordinary static.

#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <utility>
#include <vector>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) alignas(n)

namespace emu {

[[noreturn]] inline void fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::fprintf(stderr, "cuda emulation: ");
    std::vfprintf(stderr, fmt, ap);
    std::fprintf(stderr, "\n");
    va_end(ap);
    std::exit(3);
}

struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct Config {
    bool late_copies = false; // cp.async lands at wait_all rather than at once
    // 0: the threads run in turn, in order. Else the seed of a random ranking of each block's
    // warps: the scheduler always resumes a thread of the highest-ranked warp that can run, so a
    // warp runs ahead of lower-ranked ones until a barrier stops it, and a missing barrier lets
    // it overwrite what a slower warp has yet to read (as a GPU may).
    unsigned long long seed = 0;
};
inline Config config;

struct PendingCopy {
    void* dst;
    const void* src;
    bool valid;
};

// What the memory system would be asked (counts, not timings), for the tests' traffic checks.
// Shared memory has 32 banks of 4 bytes; a 16-byte access covers 4 of them, so 8 accesses in
// distinct 16-byte bank groups (offset / 16 mod 8) are served in one wavefront, and a phase
// whose accesses put k different addresses in one group takes k (a k-way bank conflict; one
// address read by several lanes is a broadcast). `ldmatrix.x4` reads its four matrices as four
// phases of 8 row addresses; a warp's 16-byte shared stores (cp.async's shared side) go as four
// phases of 8 lanes. cp.async's global side: the 32-byte sectors that one warp's copies of one
// instruction touch, against the bytes they ask for. And the warps' `mma.m16n8k16`
// instructions, against which the `ldmatrix` reads feeding them are weighed.
struct Traffic {
    unsigned long long ldsm_phases = 0, ldsm_wavefronts = 0;
    unsigned long long copy_phases = 0, copy_wavefronts = 0;
    unsigned long long copy_bytes = 0, copy_sectors = 0;
    unsigned long long mma = 0;
};
inline Traffic traffic;

// One thread's cp.async: its warp, how many it had issued before, its lane, where it writes
// (offset in shared memory), what it reads.
struct CopyRecord {
    unsigned warp, seq, lane;
    size_t dst_offset;
    uintptr_t src;
    bool valid;
};

// Wavefronts of one phase of 16-byte shared accesses at `offsets` (16-byte aligned).
inline unsigned long long wavefronts16(const std::vector<size_t>& offsets) {
    size_t worst = 0;
    for (size_t group = 0; group < 8; ++group) {
        std::vector<size_t> distinct;
        for (size_t off : offsets) {
            if ((off / 16) % 8 == group && std::find(distinct.begin(), distinct.end(), off) == distinct.end()) {
                distinct.push_back(off);
            }
        }
        worst = std::max(worst, distinct.size());
    }
    return worst;
}

// One lane's operands of a warp-wide instruction.
struct Slot {
    const char* op = nullptr;
    uint32_t r[6] = {}; // mma: a0..a3, b0, b1
    float f = 0.f;
    const void* p = nullptr;
};

struct Barrier {
    unsigned arrived = 0, generation = 0;
};

struct Thread {
    ucontext_t ctx;
    std::vector<char> stack;
    Dim3 idx;
    bool done = false;
    const char* waiting = nullptr;  // what it waits at, for the deadlock message
    const Barrier* blocked = nullptr; // the barrier it waits at, released when its generation moves on
    unsigned blocked_generation = 0;
    std::vector<PendingCopy> pending;
    unsigned copies = 0; // cp.async issued in this block
    bool can_run() const { return !done && !(blocked && blocked->generation == blocked_generation); }
};

struct Block {
    Dim3 block_idx, block_dim, grid_dim;
    std::vector<Thread> threads;
    int current = 0;
    ucontext_t scheduler;
    unsigned finished = 0; // threads that have exited
    Barrier block_barrier;
    std::vector<Barrier> warp_barriers;
    std::vector<Slot> slots;
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0;
    std::vector<CopyRecord> copy_log; // this block's cp.async, for `traffic`
    std::function<void()> body;
};
inline Block* block = nullptr;

inline Thread& me() { return block->threads[block->current]; }
inline int linear_tid() { return block->current; }
inline int lane_id() { return block->current % 32; }

inline void yield() { swapcontext(&me().ctx, &block->scheduler); }

// Wait until `count` threads have arrived at `b` (this one included).
inline void arrive_and_wait(Barrier& b, unsigned count, const char* what) {
    const unsigned gen = b.generation;
    if (++b.arrived == count) {
        b.arrived = 0;
        ++b.generation;
        return;
    }
    Thread& t = me();
    t.waiting = what;
    t.blocked = &b;
    t.blocked_generation = gen;
    yield(); // the scheduler resumes this thread once the generation has moved on
    t.waiting = nullptr;
    t.blocked = nullptr;
}

inline void warp_barrier(const char* what) {
    arrive_and_wait(block->warp_barriers[linear_tid() / 32], 32, what);
}

// A warp-wide instruction: every lane deposits its slot, then (after all 32 have) `compute` reads
// the warp's slots; a second barrier keeps the slots until every lane has read them.
template <typename F> inline void warp_collective(const Slot& mine, F compute) {
    const int tid = linear_tid(), w0 = tid / 32 * 32;
    block->slots[tid] = mine;
    warp_barrier(mine.op);
    for (int l = 0; l < 32; ++l) {
        if (block->slots[w0 + l].op != mine.op) {
            fail("block (%u,%u,%u) warp %d: lane %d is at %s while lane %d is at %s", block->block_idx.x,
                 block->block_idx.y, block->block_idx.z, tid / 32, tid % 32, mine.op, l, block->slots[w0 + l].op);
        }
    }
    compute(&block->slots[w0]);
    warp_barrier(mine.op);
}

inline void entry() {
    block->body();
    me().done = true;
    ++block->finished;
    // returning resumes `uc_link`: the scheduler
}

// xorshift64*: the random schedule's generator.
inline unsigned long long next_random(unsigned long long& state) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
}

[[noreturn]] inline void deadlock(const Block& b, unsigned n) {
    std::fprintf(stderr, "cuda emulation: deadlock in block (%u,%u,%u):\n", b.block_idx.x, b.block_idx.y, b.block_idx.z);
    for (unsigned i = 0; i < n; ++i) {
        const Thread& t = b.threads[i];
        std::fprintf(stderr, "  thread %u: %s\n", i, t.done ? "exited" : (t.waiting ? t.waiting : "running"));
    }
    std::exit(3);
}

inline void resume(Block& b, unsigned i) {
    b.current = static_cast<int>(i);
    swapcontext(&b.scheduler, &b.threads[i].ctx);
}

// Runs the block's threads (already set up) until all have exited, in turn or (with a seed) by
// warp rank; exits the process with where each thread waits when none can run.
inline void run_block(Block& b, unsigned n) {
    const unsigned warps = n / 32;
    std::vector<unsigned> order(warps); // warps, highest rank first
    for (unsigned w = 0; w < warps; ++w) order[w] = w;
    if (config.seed) {
        unsigned long long rng = config.seed ^ (b.block_idx.x * 0x9e3779b97f4a7c15ull) ^
                                 (b.block_idx.y * 0xbf58476d1ce4e5b9ull) ^ (b.block_idx.z + 1);
        for (unsigned w = warps; w > 1; --w) std::swap(order[w - 1], order[next_random(rng) % w]);
    }
    for (;;) {
        bool ran = false;
        if (!config.seed) {
            for (unsigned i = 0; i < n; ++i) {
                if (b.threads[i].can_run()) {
                    resume(b, i);
                    ran = true;
                }
            }
        } else {
            for (unsigned w = 0; w < warps && !ran; ++w) {
                for (unsigned l = 0; l < 32 && !ran; ++l) {
                    const unsigned i = order[w] * 32 + l;
                    if (b.threads[i].can_run()) {
                        resume(b, i);
                        ran = true;
                    }
                }
            }
        }
        if (b.finished == n) return;
        if (!ran) deadlock(b, n);
    }
}

// Adds one block's cp.async to `traffic`: the records of one warp with the same count of
// earlier copies are one instruction (every loop over a tile runs the same trips in each lane),
// its lanes stored in four phases of 8, its valid sources read in 32-byte sectors.
inline void count_copies(std::vector<CopyRecord>& log) {
    std::sort(log.begin(), log.end(), [](const CopyRecord& a, const CopyRecord& b) {
        return a.warp != b.warp ? a.warp < b.warp : a.seq != b.seq ? a.seq < b.seq : a.lane < b.lane;
    });
    for (size_t i = 0; i < log.size();) {
        size_t end = i;
        while (end < log.size() && log[end].warp == log[i].warp && log[end].seq == log[i].seq) ++end;
        std::vector<uintptr_t> sectors;
        for (unsigned phase = 0; phase < 4; ++phase) {
            std::vector<size_t> offsets;
            for (size_t j = i; j < end; ++j) {
                if (log[j].lane / 8 == phase) offsets.push_back(log[j].dst_offset);
            }
            if (!offsets.empty()) {
                traffic.copy_phases += 1;
                traffic.copy_wavefronts += wavefronts16(offsets);
            }
        }
        for (size_t j = i; j < end; ++j) {
            if (!log[j].valid) continue;
            traffic.copy_bytes += 16;
            if (std::find(sectors.begin(), sectors.end(), log[j].src / 32) == sectors.end()) sectors.push_back(log[j].src / 32);
        }
        traffic.copy_sectors += sectors.size();
        i = end;
    }
}

// Runs `body` once per thread of each block of `grid`, with `smem_bytes` of dynamic shared
// memory. Exits the process with a message on a deadlock.
inline void launch(Dim3 grid, Dim3 threads, size_t smem_bytes, std::function<void()> body) {
    const unsigned n = threads.x * threads.y * threads.z;
    if (n == 0 || n > 1024 || n % 32 != 0) fail("block of %u threads: expected a multiple of 32 up to 1024", n);
    Block b;
    b.block_dim = threads;
    b.grid_dim = grid;
    b.threads.resize(n);
    for (auto& t : b.threads) t.stack.resize(256 * 1024);
    b.warp_barriers.resize(n / 32);
    b.slots.resize(n);
    // Exactly as long as asked for (16-byte aligned), so that AddressSanitizer, where the emulator
    // is built with it, catches any access past its end.
    struct SharedMemory {
        unsigned char* p;
        ~SharedMemory() { ::operator delete(p, std::align_val_t{16}); }
    } smem_store{static_cast<unsigned char*>(::operator new(smem_bytes ? smem_bytes : 1, std::align_val_t{16}))};
    b.smem = smem_store.p;
    b.smem_bytes = smem_bytes;
    b.body = std::move(body);
    block = &b;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                b.block_idx = {x, y, z};
                std::memset(b.smem, 0xff, smem_bytes);
                b.block_barrier = {};
                b.finished = 0;
                for (auto& w : b.warp_barriers) w = {};
                for (unsigned i = 0; i < n; ++i) {
                    Thread& t = b.threads[i];
                    t.idx = {i % threads.x, i / threads.x % threads.y, i / (threads.x * threads.y)};
                    t.done = false;
                    t.waiting = nullptr;
                    t.blocked = nullptr;
                    t.pending.clear();
                    t.copies = 0;
                    getcontext(&t.ctx);
                    t.ctx.uc_stack.ss_sp = t.stack.data();
                    t.ctx.uc_stack.ss_size = t.stack.size();
                    t.ctx.uc_link = &b.scheduler;
                    makecontext(&t.ctx, entry, 0);
                }
                b.copy_log.clear();
                run_block(b, n);
                count_copies(b.copy_log);
            }
    block = nullptr;
}

// ---- 16-bit floats (round to nearest even, as __float2half_rn / __float2bfloat16_rn) ----

inline uint32_t f32_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

inline uint16_t f32_to_bf16(float x) {
    const uint32_t u = f32_bits(x);
    if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
    return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_f16(float x) {
    const uint32_t u = f32_bits(x);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
    const float a = std::fabs(x);
    if (std::isnan(x)) return sign | 0x7e00;
    if (a >= 65520.f) return sign | 0x7c00; // rounds to infinity
    if (a < 6.103515625e-05f) {
        // subnormal: a multiple of 2^-24, rounded to nearest even by the FPU's own rounding
        const float q = std::nearbyint(a * 16777216.f);
        return sign | static_cast<uint16_t>(q);
    }
    const uint32_t au = f32_bits(a);
    const uint32_t exp = (au >> 23) - 127 + 15, mant = au & 0x7fffff;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h; // may carry into the exponent: right
    return sign | static_cast<uint16_t>(h);
}
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) return (sign ? -1.f : 1.f) * static_cast<float>(mant) * 5.9604644775390625e-08f;
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

// ---- warp-wide instructions ----

inline float shfl(float v, int src_lane, int xor_mask, const char* op) {
    Slot s;
    s.op = op;
    s.f = v;
    float out = 0.f;
    const int lane = lane_id();
    const int src = xor_mask >= 0 ? (lane ^ xor_mask) : src_lane;
    warp_collective(s, [&](const Slot* w) { out = w[src & 31].f; });
    return out;
}

inline void check_shared(const void* p, size_t bytes, const char* op) {
    const auto* c = static_cast<const unsigned char*>(p);
    if (c < block->smem || c + bytes > block->smem + block->smem_bytes) {
        fail("%s: address %p (%zu bytes) outside the block's %zu bytes of shared memory", op, p, bytes,
             block->smem_bytes);
    }
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail("%s: address %p is not 16-byte aligned", op, p);
}

// The shared-memory wavefronts of one warp's ldmatrix.x4 (`w`: the 32 lanes' slots).
inline void count_ldmatrix(const Slot* w) {
    for (int i = 0; i < 4; ++i) {
        std::vector<size_t> rows;
        for (int r = 0; r < 8; ++r) rows.push_back(static_cast<const unsigned char*>(w[8 * i + r].p) - block->smem);
        traffic.ldsm_phases += 1;
        traffic.ldsm_wavefronts += wavefronts16(rows);
    }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the 8 row addresses (16
// bytes each) of matrix i; register i of lane l receives row l/4, columns 2(l%4) and 2(l%4)+1 of
// matrix i (low half first), or with .trans column l/4 of rows 2(l%4) and 2(l%4)+1.
inline void ldmatrix_x4(uint32_t r[4], const void* p, bool trans) {
    const char* op = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    check_shared(p, 16, op);
    Slot s;
    s.op = op;
    s.p = p;
    const int lane = lane_id();
    warp_collective(s, [&](const Slot* w) {
        if (lane == 0) count_ldmatrix(w);
        for (int i = 0; i < 4; ++i) {
            uint16_t e[2];
            for (int j = 0; j < 2; ++j) {
                const int row = trans ? 2 * (lane % 4) + j : lane / 4;
                const int col = trans ? lane / 4 : 2 * (lane % 4) + j;
                e[j] = static_cast<const uint16_t*>(w[8 * i + row].p)[col];
            }
            r[i] = static_cast<uint32_t>(e[0]) | (static_cast<uint32_t>(e[1]) << 16);
        }
    });
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, D = A·B + C. With g = lane/4,
// t = lane%4: A (16×16) a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..);
// B (16×8, k × n) b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g); C and D c0, c1 = (g, 2t..2t+1),
// c2, c3 = (g+8, 2t..2t+1).
template <float (*ToF32)(uint16_t)>
inline void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const char* op) {
    Slot s;
    s.op = op;
    for (int i = 0; i < 4; ++i) s.r[i] = a[i];
    s.r[4] = b0;
    s.r[5] = b1;
    const int lane = lane_id();
    float d[4];
    warp_collective(s, [&](const Slot* w) {
        if (lane == 0) traffic.mma += 1;
        auto half = [](uint32_t reg, int j) { return ToF32(static_cast<uint16_t>(reg >> (16 * j))); };
        float A[16][16], B[16][8];
        for (int l = 0; l < 32; ++l) {
            const int g = l / 4, t = l % 4;
            for (int j = 0; j < 2; ++j) {
                A[g][2 * t + j] = half(w[l].r[0], j);
                A[g + 8][2 * t + j] = half(w[l].r[1], j);
                A[g][2 * t + 8 + j] = half(w[l].r[2], j);
                A[g + 8][2 * t + 8 + j] = half(w[l].r[3], j);
                B[2 * t + j][g] = half(w[l].r[4], j);
                B[2 * t + 8 + j][g] = half(w[l].r[5], j);
            }
        }
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8 * (i / 2), col = 2 * t + (i & 1);
            double acc = c[i];
            for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
            d[i] = static_cast<float>(acc);
        }
    });
    for (int i = 0; i < 4; ++i) c[i] = d[i];
}

// ---- asynchronous copies ----

inline void apply(const PendingCopy& c) {
    if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
    } else {
        std::memset(c.dst, 0, 16);
    }
}

// cp.async.cg.shared.global [dst], [src], 16, valid ? 16 : 0.
inline void cp_async16(void* dst, const void* src, bool valid) {
    check_shared(dst, 16, "cp.async (shared destination)");
    if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async: global source %p is not 16-byte aligned", src);
    Thread& t = me();
    block->copy_log.push_back({static_cast<unsigned>(linear_tid() / 32), t.copies++, static_cast<unsigned>(lane_id()),
                               static_cast<size_t>(static_cast<unsigned char*>(dst) - block->smem),
                               reinterpret_cast<uintptr_t>(src), valid});
    const PendingCopy c{dst, src, valid};
    if (config.late_copies) {
        t.pending.push_back(c);
    } else {
        apply(c);
    }
}
inline void cp_async_commit() {}
inline void cp_async_wait_all() {
    for (const auto& c : me().pending) apply(c);
    me().pending.clear();
}

template <typename T> inline T* dynamic_smem() { return reinterpret_cast<T*>(block->smem); }

// ex2.approx.ftz.f32: 2^x, results below the smallest normal flushed to 0 (here exact otherwise;
// the hardware's is within about 2^-22 relative).
inline float exp2_approx(float x) {
    const float y = std::exp2(x);
    return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}

// The 16-bit types as the kernels use them (their bits, and conversions to and from f32).
template <uint16_t (*Bits)(float), float (*Value)(uint16_t)> struct Half16 {
    static uint32_t pack(float a, float b) {
        return static_cast<uint32_t>(Bits(a)) | (static_cast<uint32_t>(Bits(b)) << 16);
    }
    static uint16_t bits(float x) { return Bits(x); }
    static void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        mma_m16n8k16<Value>(c, a, b0, b1, Bits == f32_to_f16 ? "mma.m16n8k16.f16" : "mma.m16n8k16.bf16");
    }
};
using F16 = Half16<f32_to_f16, f16_to_f32>;
using BF16 = Half16<f32_to_bf16, bf16_to_f32>;

} // namespace emu

// ---- CUDA's names ----

#define threadIdx (emu::me().idx)
#define blockIdx (emu::block->block_idx)
#define blockDim (emu::block->block_dim)
#define gridDim (emu::block->grid_dim)

inline void __syncthreads() {
    const unsigned n = emu::block->block_dim.x * emu::block->block_dim.y * emu::block->block_dim.z;
    emu::arrive_and_wait(emu::block->block_barrier, n, "__syncthreads");
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    if (mask != 0xffffffffu) emu::fail("__shfl_xor_sync: only the full-warp mask is emulated");
    return emu::shfl(v, 0, lane_mask, "__shfl_xor_sync");
}
inline float __shfl_sync(unsigned mask, float v, int src_lane) {
    if (mask != 0xffffffffu) emu::fail("__shfl_sync: only the full-warp mask is emulated");
    return emu::shfl(v, src_lane, -1, "__shfl_sync");
}
inline float __int_as_float(int x) { return emu::bits_f32(static_cast<uint32_t>(x)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// cuda_fp16.h / cuda_bf16.h storage types and conversions.
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __half2float(__half h) { return emu::f16_to_f32(h.bits); }
inline __half __float2half_rn(float x) { return {emu::f32_to_f16(x)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return emu::bf16_to_f32(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {emu::f32_to_bf16(x)}; }
