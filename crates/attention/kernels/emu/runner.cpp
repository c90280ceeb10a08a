// Runs this crate's CUDA kernels (kernels/fused_attention.cu, kernels/fused_layers.cu) on the
// CPU under cuda_emu.h. The unit tests in crates/attention/src/cuda_plan/ write a request
// (buffers and launches, as the Rust launch code plans them) to stdin and read the buffers they
// ask for from stdout. Build: c++ -std=c++17 -DUNET_CUDA_EMULATE -I crates/attention/kernels
// crates/attention/kernels/emu/runner.cpp.
//
// Request, little-endian: u32 magic "UEMU"; u32 late copies (0/1); u64 schedule seed (0: in
// order; see emu::Config); u32 buffer count, each
// buffer u64 bytes + u32 fill (0: the bytes follow, 1: zeros, 2: 0xff bytes, NaN in any float
// dtype); u32 launch count, each launch: name (u32 length + bytes), grid x, y, z and threads
// (u32 each), dynamic shared memory (u64), u32 argument count, each argument a u32 tag and its
// value: 0 a buffer (u32 index, 0xffffffff for a null pointer), 1 i32, 2 i64, 3 f32, 4 a struct
// (u32 bytes, u32 pointer count n, the bytes: its first n u64 fields are buffer indices + 1, or 0
// for null, which the runner replaces with the buffers' addresses); then u32 output count and
// the buffer index of each. Answer: those buffers' bytes, in order, then the seven counters of
// `emu::traffic` over all the launches (u64 each, in the struct's order).
//
// Every buffer is allocated exactly as long as the request says, so AddressSanitizer (when
// built with it) reports any access past its end, and 256-byte aligned, as cudaMalloc's are.

#include "../fused_attention.cu"
#include "../fused_layers.cu"

#include <map>
#include <new>
#include <string>

namespace {

template <typename T> T read() {
    T x;
    if (std::fread(&x, sizeof(T), 1, stdin) != 1) emu::fail("request: truncated");
    return x;
}

void read_bytes(void* p, size_t n) {
    if (n && std::fread(p, 1, n, stdin) != n) emu::fail("request: truncated");
}

struct Buffer {
    unsigned char* p = nullptr;
    size_t bytes = 0;
    explicit Buffer(size_t n) : p(static_cast<unsigned char*>(::operator new(n ? n : 1, std::align_val_t{256}))), bytes(n) {}
    Buffer(Buffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
    ~Buffer() {
        if (p) ::operator delete(p, std::align_val_t{256});
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
};
std::vector<Buffer> buffers;

enum Tag : uint32_t { BUF = 0, I32 = 1, I64 = 2, F32 = 3, STRUCT = 4 };

struct Arg {
    Tag tag;
    void* ptr = nullptr;
    int32_t i32 = 0;
    int64_t i64 = 0;
    float f32 = 0.f;
    std::vector<unsigned char> bytes;
};

void* buffer_ptr(uint64_t index) {
    if (index >= buffers.size()) emu::fail("request: no buffer %llu", (unsigned long long)index);
    return buffers[index].p;
}

Arg read_arg() {
    Arg a;
    a.tag = static_cast<Tag>(read<uint32_t>());
    switch (a.tag) {
    case BUF: {
        const uint32_t i = read<uint32_t>();
        a.ptr = i == 0xffffffffu ? nullptr : buffer_ptr(i);
        break;
    }
    case I32: a.i32 = read<int32_t>(); break;
    case I64: a.i64 = read<int64_t>(); break;
    case F32: a.f32 = read<float>(); break;
    case STRUCT: {
        const uint32_t n = read<uint32_t>(), ptrs = read<uint32_t>();
        if (n > 4096 || ptrs * 8 > n) emu::fail("request: a struct of %u bytes with %u pointers", n, ptrs);
        a.bytes.resize(n);
        read_bytes(a.bytes.data(), n);
        for (uint32_t i = 0; i < ptrs; ++i) {
            uint64_t ref;
            std::memcpy(&ref, a.bytes.data() + 8 * i, 8);
            const uint64_t addr = ref == 0 ? 0 : reinterpret_cast<uintptr_t>(buffer_ptr(ref - 1));
            std::memcpy(a.bytes.data() + 8 * i, &addr, 8);
        }
        break;
    }
    default: emu::fail("request: argument tag %u", a.tag);
    }
    return a;
}

// A kernel's arguments, taken in order and checked against the kernel's parameter types.
struct Args_ {
    const std::vector<Arg>& v;
    const std::string& kernel;
    size_t next = 0;
    const Arg& take(Tag t) {
        if (next >= v.size()) emu::fail("%s: too few arguments (%zu)", kernel.c_str(), v.size());
        const Arg& a = v[next++];
        if (a.tag != t) emu::fail("%s: argument %zu has tag %u, the kernel takes %u", kernel.c_str(), next - 1, a.tag, t);
        return a;
    }
    template <typename T> T* ptr() { return static_cast<T*>(take(BUF).ptr); }
    int i32() { return take(I32).i32; }
    long long i64() { return take(I64).i64; }
    float f32() { return take(F32).f32; }
    template <typename S> S strct() {
        const Arg& a = take(STRUCT);
        if (a.bytes.size() != sizeof(S)) emu::fail("%s: a struct of %zu bytes, the kernel's is %zu", kernel.c_str(), a.bytes.size(), sizeof(S));
        S s;
        std::memcpy(&s, a.bytes.data(), sizeof(S));
        return s;
    }
    void done() {
        if (next != v.size()) emu::fail("%s: %zu arguments, the kernel takes %zu", kernel.c_str(), v.size(), next);
    }
};

using Call = std::function<void()>;
using Binder = Call (*)(Args_&);

std::map<std::string, Binder> kernels() {
    std::map<std::string, Binder> k;
#define ATTENTION(name) k[#name] = [](Args_& a) -> Call { const Args s = a.strct<Args>(); a.done(); return [s] { name(s); }; };
#define ATTENTION_VARIANT(X, name, warps, exp2) ATTENTION(name)
#define ATTENTION_FAMILY(TY, T, DVC, BC) FATTN_MMA_VARIANTS(ATTENTION_VARIANT, _, TY, DVC)
    FATTN_MMA_FAMILIES(ATTENTION_FAMILY)
#define ATTENTION_R32(TY, T, DVC, BC) ATTENTION(fattn_##TY##_dv##DVC##_r32_e2)
    FATTN_MMA_R32_FAMILIES(ATTENTION_R32)
#undef ATTENTION_R32
    ATTENTION(fattn_f32_ni1) ATTENTION(fattn_f32_ni2) ATTENTION(fattn_f32_ni4) ATTENTION(fattn_f32_ni8)
    ATTENTION(fattn_f32_ni16)
    ATTENTION(fattn_f16_wide) ATTENTION(fattn_f16_wide_e2) ATTENTION(fattn_bf16_wide) ATTENTION(fattn_bf16_wide_e2)
    ATTENTION(fattn_f16_wide32) ATTENTION(fattn_f16_wide32_e2) ATTENTION(fattn_bf16_wide32)
    ATTENTION(fattn_bf16_wide32_e2)
#undef ATTENTION_FAMILY
#undef ATTENTION_VARIANT
#undef ATTENTION
#define MERGE(name, T)                                                                                          \
    k[#name] = [](Args_& a) -> Call {                                                                          \
        auto o = a.ptr<const float>(); auto ml = a.ptr<const float>(); auto out = a.ptr<T>();                    \
        int rows = a.i32(), d = a.i32(), splits = a.i32();                                                     \
        a.done();                                                                                              \
        return [=] { name(o, ml, out, rows, d, splits); };                                                     \
    };
    MERGE(fattn_merge_f32, float) MERGE(fattn_merge_f16, uint16_t) MERGE(fattn_merge_bf16, uint16_t)
#undef MERGE
#define LAYERS(SFX, T)                                                                                          \
    k["gn_stats_" #SFX] = [](Args_& a) -> Call {                                                               \
        auto x = a.ptr<const T>(); auto add = a.ptr<const T>(); auto part = a.ptr<float>();                      \
        auto stats = a.ptr<float>(); int c = a.i32(), g = a.i32(), sp = a.i32(), chunk = a.i32();               \
        int splits = a.i32(); float eps = a.f32();                                                             \
        a.done();                                                                                              \
        return [=] { gn_stats_##SFX(x, add, part, stats, c, g, sp, chunk, splits, eps); };                     \
    };                                                                                                         \
    k["gn_apply_" #SFX] = [](Args_& a) -> Call {                                                               \
        auto x = a.ptr<const T>(); auto add = a.ptr<const T>(); auto stats = a.ptr<const float>();               \
        auto gamma = a.ptr<const float>(); auto beta = a.ptr<const float>(); auto out = a.ptr<T>();              \
        int c = a.i32(), g = a.i32(), sp = a.i32(), tile = a.i32(), act = a.i32();                              \
        a.done();                                                                                              \
        return [=] { gn_apply_##SFX(x, add, stats, gamma, beta, out, c, g, sp, tile, act); };                  \
    };                                                                                                         \
    k["ln_" #SFX] = [](Args_& a) -> Call {                                                                     \
        auto x = a.ptr<const T>(); auto gamma = a.ptr<const float>(); auto beta = a.ptr<const float>();         \
        auto out = a.ptr<T>(); long long rows = a.i64(); int n = a.i32(); float eps = a.f32();                  \
        a.done();                                                                                              \
        return [=] { ln_##SFX(x, gamma, beta, out, rows, n, eps); };                                           \
    };                                                                                                         \
    k["gated_" #SFX] = [](Args_& a) -> Call {                                                                  \
        auto h = a.ptr<const T>(); auto out = a.ptr<T>(); long long rows = a.i64(); int n = a.i32();            \
        int act = a.i32();                                                                                     \
        a.done();                                                                                              \
        return [=] { gated_##SFX(h, out, rows, n, act); };                                                     \
    };                                                                                                         \
    k["epilogue_" #SFX] = [](Args_& a) -> Call {                                                               \
        auto h = a.ptr<const T>(); auto bias = a.ptr<const T>(); auto res = a.ptr<const T>();                    \
        auto out = a.ptr<T>(); long long rows = a.i64(); int cols = a.i32(), bias_len = a.i32();                \
        int on_rows = a.i32(); float div = a.f32(); int has_div = a.i32();                                     \
        a.done();                                                                                              \
        return [=] { epilogue_##SFX(h, bias, res, out, rows, cols, bias_len, on_rows, div, has_div); };       \
    };
    LAYERS(f32, float) LAYERS(f16, __half) LAYERS(bf16, __nv_bfloat16)
#undef LAYERS
    k["gn_finalize"] = [](Args_& a) -> Call {
        auto part = a.ptr<const float>();
        auto stats = a.ptr<float>();
        int n = a.i32(), len = a.i32(), chunk = a.i32(), splits = a.i32();
        float eps = a.f32();
        a.done();
        return [=] { gn_finalize(part, stats, n, len, chunk, splits, eps); };
    };
    return k;
}

} // namespace

int main() {
    if (read<uint32_t>() != 0x554d4555u) emu::fail("request: bad magic");
    emu::config.late_copies = read<uint32_t>() != 0;
    emu::config.seed = read<uint64_t>();
    const uint32_t nbuf = read<uint32_t>();
    for (uint32_t i = 0; i < nbuf; ++i) {
        const uint64_t n = read<uint64_t>();
        if (n > (1ull << 31)) emu::fail("request: a buffer of %llu bytes", (unsigned long long)n);
        Buffer b(n);
        const uint32_t fill = read<uint32_t>();
        if (fill == 0) {
            read_bytes(b.p, n);
        } else {
            std::memset(b.p, fill == 1 ? 0 : 0xff, n);
        }
        buffers.push_back(std::move(b));
    }
    const auto table = kernels();
    const uint32_t nlaunch = read<uint32_t>();
    for (uint32_t l = 0; l < nlaunch; ++l) {
        const uint32_t len = read<uint32_t>();
        if (len > 64) emu::fail("request: a kernel name of %u bytes", len);
        std::string name(len, '\0');
        read_bytes(name.data(), len);
        emu::Dim3 grid;
        grid.x = read<uint32_t>();
        grid.y = read<uint32_t>();
        grid.z = read<uint32_t>();
        const emu::Dim3 threads{read<uint32_t>(), 1, 1};
        const uint64_t smem = read<uint64_t>();
        const uint32_t nargs = read<uint32_t>();
        if (nargs > 32) emu::fail("request: %u arguments", nargs);
        std::vector<Arg> args;
        for (uint32_t i = 0; i < nargs; ++i) args.push_back(read_arg());
        const auto it = table.find(name);
        if (it == table.end()) emu::fail("request: no kernel %s", name.c_str());
        Args_ taker{args, name};
        emu::launch(grid, threads, smem, it->second(taker));
    }
    const uint32_t nout = read<uint32_t>();
    for (uint32_t i = 0; i < nout; ++i) {
        const uint32_t b = read<uint32_t>();
        if (b >= buffers.size()) emu::fail("request: no output buffer %u", b);
        if (std::fwrite(buffers[b].p, 1, buffers[b].bytes, stdout) != buffers[b].bytes) emu::fail("could not write the output");
    }
    const emu::Traffic& t = emu::traffic;
    const unsigned long long counts[7] = {t.ldsm_phases, t.ldsm_wavefronts, t.copy_phases, t.copy_wavefronts,
                                          t.copy_bytes,  t.copy_sectors,    t.mma};
    if (std::fwrite(counts, sizeof counts, 1, stdout) != 1) emu::fail("could not write the traffic counts");
    return 0;
}
