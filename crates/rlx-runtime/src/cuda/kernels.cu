// rlx CUDA kernels, compiled once per device by NVRTC when the backend
// starts. Weights stay in their GGUF block formats; every kernel that reads
// a weight dequantizes 32-element units on the fly (or, for products of many
// rows, a chunk of rows into a scratch buffer that cuBLAS multiplies).
// Arithmetic is f32 on the exactly dequantized weights (the CPU backend's
// `exact` precision), except in `q8` plans: products of up to eight rows
// multiply 8-bit activation blocks with integer dot products, larger ones
// run on bf16 tensor cores.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define NEG_INF __int_as_float(0xff800000)

// Programmatic dependent launch (sm_90 on; the host asks for it there): a
// kernel may be launched while the one before it still runs, so every
// kernel first waits until its predecessor has finished and its writes are
// visible, then lets its own successor launch, whose blocks get ready while
// this one works. Every kernel calls this before touching memory. Without
// the launch attribute both instructions do nothing.
__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Weight type codes; the Rust side passes the same numbers.
#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_Q4_0 3
#define T_Q4_1 4
#define T_Q5_0 5
#define T_Q5_1 6
#define T_Q8_0 7
#define T_Q4_K 8
#define T_Q5_K 9
#define T_Q6_K 10
#define T_Q2_K 11
#define T_Q3_K 12
#define T_IQ4_NL 13
#define T_IQ4_XS 14
#define T_MXFP4 15

// Every weight type: X(kernel-name suffix, code). Each per-type kernel
// family is instantiated from this one list.
#define FOR_EACH_TYPE(X) \
    X(f32, T_F32)        \
    X(f16, T_F16)        \
    X(bf16, T_BF16)      \
    X(q4_0, T_Q4_0)      \
    X(q4_1, T_Q4_1)      \
    X(q5_0, T_Q5_0)      \
    X(q5_1, T_Q5_1)      \
    X(q8_0, T_Q8_0)      \
    X(q4_k, T_Q4_K)      \
    X(q5_k, T_Q5_K)      \
    X(q6_k, T_Q6_K)      \
    X(q2_k, T_Q2_K)      \
    X(q3_k, T_Q3_K)      \
    X(iq4_nl, T_IQ4_NL)  \
    X(iq4_xs, T_IQ4_XS)  \
    X(mxfp4, T_MXFP4)

// The non-linear 4-bit codebooks: IQ4_NL/IQ4_XS values, and E2M1 (FP4)
// doubled (MXFP4's scale is halved to match).
__constant__ __align__(16) signed char KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                              1,    13,   25,  38,  53,  69,  89,  113};
__constant__ __align__(16) signed char KVALUES_FP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

// Bytes of one block and elements per block of each type.
__device__ __forceinline__ int block_bytes(int t) {
    switch (t) {
        case T_F32: return 128;  // 32 elements as a "block"
        case T_F16: return 64;
        case T_BF16: return 64;
        case T_Q4_0: return 18;
        case T_Q4_1: return 20;
        case T_Q5_0: return 22;
        case T_Q5_1: return 24;
        case T_Q8_0: return 34;
        case T_Q4_K: return 144;
        case T_Q5_K: return 176;
        case T_Q6_K: return 210;
        case T_Q2_K: return 84;
        case T_Q3_K: return 110;
        case T_IQ4_NL: return 18;
        case T_IQ4_XS: return 136;
        default: return 17;  // MXFP4
    }
}

__device__ __forceinline__ int block_elems(int t) {
    switch (t) {
        case T_Q4_K:
        case T_Q5_K:
        case T_Q6_K:
        case T_Q2_K:
        case T_Q3_K:
        case T_IQ4_XS: return 256;
        default: return 32;
    }
}

// MXFP4's E8M0 scale, halved (the FP4 table is doubled): 2^(e − 128).
__device__ __forceinline__ float e8m0_half(u8 e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (u32)(e - 1) << 23);
}

// Bytes of a row of k elements: float rows may have any length (the kernels
// take their last, partial 32-element unit element by element); a block
// type's k is a whole number of blocks (the GGUF reader checks).
__device__ __forceinline__ size_t row_size(int t, int k) {
    switch (t) {
        case T_F32: return 4 * (size_t)k;
        case T_F16:
        case T_BF16: return 2 * (size_t)k;
        default: return (size_t)(k / block_elems(t)) * block_bytes(t);
    }
}

// Q3_K's 6-bit scale of 16-element sub-block j, less 32, from the block's
// twelve scale bytes s.
__device__ __forceinline__ int q3_k_scale(const u8* s, int j) {
    int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    int high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

// IQ4_XS's 6-bit scale of 32-element sub-block ib, less 32: the low four
// bits from nibble ib of the four bytes at sl, the high two from bits 2 ib,
// 2 ib + 1 of sh (the block's u16 at 2).
__device__ __forceinline__ int iq4_xs_scale(const u8* sl, u32 sh, int ib) {
    return (((sl[ib >> 1] >> (4 * (ib & 1))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
}

__device__ __forceinline__ float warp_sum(float x) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
    return x;
}

// Element l of unit u (elements 32u .. 32u+32) of a float row of type T
// (any length and alignment). Block rows are read a unit at a time
// (`wunit`).
template <int T>
__device__ __forceinline__ float elem(const u8* __restrict__ row, int u, int l) {
    static_assert(T == T_F32 || T == T_F16 || T == T_BF16, "float rows only");
    if (T == T_F32) return ((const float*)row)[32 * u + l];
    u16 h = ((const u16*)row)[32 * u + l];
    return T == T_F16 ? h2f(h) : bf2f(h);
}

// ---- Products of 1–8 activation rows (decode) ----
//
// One warp per weight row, its lanes taking the row's 32-element units in
// turn; every load goes straight to registers (16-byte vectors where the
// block layout keeps that alignment, 2-byte halves where it does not), and
// each weight unit, once loaded, serves every activation row. `q8` products
// read the activations as ggml's Q8_0 blocks (`quantize_q8`, once per
// product) and multiply the codes with integer dot products (dp4a); `exact`
// ones read f32 activations and dequantize each weight in registers.

// A word at a 2-byte-aligned address.
__device__ __forceinline__ u32 ld32_2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// N words from a 2-byte-aligned address: N + 1 aligned word loads, joined
// by funnel shifts (a shift of 0 where the address is word-aligned).
template <int N>
__device__ __forceinline__ void ldw_2(const u8* p, u32* out) {
    // (Offsetting p, not rebuilding it from an integer, keeps the compiler
    // aware that it points to global memory: LDG, not generic loads.)
    size_t mis = (size_t)p & 3;
    const u32* a = (const u32*)(p - mis);
    u32 sh = 8 * (u32)mis;
    u32 w[N + 1];
    #pragma unroll
    for (int i = 0; i <= N; i++) w[i] = a[i];
    #pragma unroll
    for (int i = 0; i < N; i++) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

__device__ __forceinline__ u32 ld32_1(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Bits 0..3 of b into bit 4 of bytes 0..3 (the fifth bit of Q5 codes).
__device__ __forceinline__ u32 bit4_of_bytes(u32 b) {
    return ((b & 1) << 4) | ((b & 2) << 11) | ((b & 4) << 18) | ((b & 8) << 25);
}

// Four 4-bit indices (the bytes of v, each below 16) looked up in a table of
// 16 signed bytes held as four words: two byte permutes pick from the low
// and the high eight entries, a third picks between them by bit 3.
__device__ __forceinline__ u32 lut16(u32 v, const u32* t) {
    u32 sel = (v & 0x7) | ((v >> 4) & 0x70) | ((v >> 8) & 0x700) | ((v >> 12) & 0x7000);
    u32 lo = __byte_perm(t[0], t[1], sel);
    u32 hi = __byte_perm(t[2], t[3], sel);
    u32 b3 = v & 0x08080808;
    u32 pick = 0x3210 | ((b3 >> 1) & 0x4) | ((b3 >> 5) & 0x40) | ((b3 >> 9) & 0x400) |
               ((b3 >> 13) & 0x4000);
    return __byte_perm(lo, hi, pick);
}

// 32 codes whose low bits are 32 bytes at lo (shifted right by ls, LO
// masking each byte) and whose high bits are 32 bytes at hi (shifted right
// by hs, HI masking, then up by HS), less CENTRE in each byte: the split
// code layouts of Q6_K and Q3_K (2-byte-aligned addresses).
template <u32 LO, u32 HI, int HS, u32 CENTRE>
__device__ __forceinline__ void join_codes(const u8* lo, int ls, const u8* hi, int hs, int* q) {
    u32 lw[8], hw[8];
    ldw_2<8>(lo, lw);
    ldw_2<8>(hi, hw);
    #pragma unroll
    for (int i = 0; i < 8; i++)
        q[i] = (int)__vsub4(((lw[i] >> ls) & LO) | (((hw[i] >> hs) & HI) << HS), CENTRE);
}

// Words w0 .. w0 + N of the codes of the Q8_0, Q4_0 or Q4_1 block at b
// (four codes a word, in element order; the 4-bit ones unsigned, their
// offset apart): what `wunit` reads of a whole unit, and attention of
// eight K/V elements at a time.
template <int T, int N>
__device__ __forceinline__ void block_words(const u8* b, int w0, int* q) {
    if constexpr (T == T_Q8_0) {
        ldw_2<N>(b + 2 + 4 * w0, (u32*)q);
    } else {  // elements 0..15 are the low nibbles of the 16 code bytes, 16..31 the high
        #pragma unroll
        for (int i = 0; i < N; i++) {
            int wi = w0 + i;
            u32 v = T == T_Q4_0 ? ld32_2(b + 2 + 4 * (wi & 3))
                                : *(const u32*)(b + 4 + 4 * (wi & 3));
            q[i] = (int)((v >> (4 * (wi >> 2))) & 0x0F0F0F0F);
        }
    }
}

// One 32-element unit of a block-type weight row: its codes as signed bytes
// (element i in byte i % 4 of q[i / 4]) and, per half of 16 elements, a
// scale and an offset: element i = s[i / 16] · code + m[i / 16].
struct WUnit {
    int q[8];
    float s[2], m[2];
    // Element i's value.
    __device__ __forceinline__ float at(int i) const {
        int c = (int)(i8)(q[i >> 2] >> (8 * (i & 3)));
        return s[i >> 4] * (float)c + m[i >> 4];
    }
};

// Whether a type's halves have their own scales, and whether it has offsets.
__device__ __forceinline__ constexpr bool two_scales(int t) {
    return t == T_Q6_K || t == T_Q2_K || t == T_Q3_K;
}
__device__ __forceinline__ constexpr bool has_offset(int t) {
    return t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q4_K ||
           t == T_Q5_K || t == T_Q2_K;
}
__device__ __forceinline__ constexpr bool is_float(int t) {
    return t == T_F32 || t == T_F16 || t == T_BF16;
}

template <int T>
__device__ __forceinline__ void wunit(const u8* __restrict__ row, int u, WUnit& w) {
    w.m[0] = w.m[1] = 0.0f;
    if (T == T_Q8_0) {
        const u8* b = row + 34 * u;
        w.s[0] = h2f(*(const u16*)b);
        block_words<T, 8>(b, 0, w.q);
    } else if (T == T_Q4_0 || T == T_Q4_1) {
        const u8* b = row + (T == T_Q4_0 ? 18 : 20) * u;
        float d = h2f(*(const u16*)b);
        w.s[0] = d;
        w.m[0] = T == T_Q4_0 ? -8.0f * d : h2f(*(const u16*)(b + 2));
        block_words<T, 8>(b, 0, w.q);
    } else if (T == T_Q5_0 || T == T_Q5_1) {
        const u8* b = row + (T == T_Q5_0 ? 22 : 24) * u;
        float d = h2f(*(const u16*)b);
        w.s[0] = d;
        w.m[0] = T == T_Q5_0 ? -16.0f * d : h2f(*(const u16*)(b + 2));
        u32 qh = T == T_Q5_0 ? ld32_2(b + 2) : *(const u32*)(b + 4);
        const u8* qs = b + (T == T_Q5_0 ? 6 : 8);
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 v = T == T_Q5_0 ? ld32_2(qs + 4 * i) : *(const u32*)(qs + 4 * i);
            w.q[i] = (int)((v & 0x0F0F0F0F) | bit4_of_bytes(qh >> (4 * i)));
            w.q[i + 4] = (int)(((v >> 4) & 0x0F0F0F0F) | bit4_of_bytes(qh >> (16 + 4 * i)));
        }
    } else if (T == T_Q4_K || T == T_Q5_K) {
        // Sub-block j shares its 32 code bytes with j ^ 1 (low and high
        // nibbles); neighbouring lanes load the same vectors, once.
        // The block's head (d, dmin and the twelve scale bytes) is one
        // 16-byte load; sub-block j's 6-bit scale and min come out of it
        // as ggml's get_scale_min_k4 reads them.
        int j = u & 7;
        const u8* b = row + (T == T_Q4_K ? 144 : 176) * (u >> 3);
        uint4 head = *(const uint4*)b;
        int sb = 8 * (j & 3);
        u32 s0 = (head.y >> sb) & 0xFF, s1 = (head.z >> sb) & 0xFF, s2 = (head.w >> sb) & 0xFF;
        u32 sc = j < 4 ? s0 & 63 : (s2 & 0xF) | ((s0 >> 6) << 4);
        u32 mn = j < 4 ? s1 & 63 : (s2 >> 4) | ((s1 >> 6) << 4);
        w.s[0] = h2f((u16)(head.x & 0xFFFF)) * (float)sc;
        w.m[0] = -(h2f((u16)(head.x >> 16)) * (float)mn);
        const uint4* qs = (const uint4*)(b + (T == T_Q4_K ? 16 : 48) + 32 * (j >> 1));
        uint4 a = qs[0], c = qs[1];
        u32 v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        int sh = 4 * (j & 1);
        #pragma unroll
        for (int i = 0; i < 8; i++) w.q[i] = (int)((v[i] >> sh) & 0x0F0F0F0F);
        if (T == T_Q5_K) {
            const uint4* qh = (const uint4*)(b + 16);
            uint4 e = qh[0], f = qh[1];
            u32 h[8] = {e.x, e.y, e.z, e.w, f.x, f.y, f.z, f.w};
            #pragma unroll
            for (int i = 0; i < 8; i++) w.q[i] |= (int)(((h[i] >> j) & 0x01010101) << 4);
        }
    } else if (T == T_Q6_K) {
        // Unit j of 8 is quad (j % 4) of half (j / 4).
        int j = u & 7;
        const u8* b = row + 210 * (u >> 3);
        int half = j >> 2, quad = j & 3;
        const u8* ql = b + 64 * half + 32 * (quad & 1);
        const u8* qh = b + 128 + 32 * half;
        const i8* sc = (const i8*)(b + 192);
        float d = h2f(*(const u16*)(b + 208));
        w.s[0] = d * (float)sc[2 * j];
        w.s[1] = d * (float)sc[2 * j + 1];
        join_codes<0x0F0F0F0F, 0x03030303, 4, 0x20202020>(ql, quad < 2 ? 0 : 4, qh, 2 * quad,
                                                          w.q);
    } else if (T == T_Q2_K || T == T_Q3_K) {
        // Unit j's 2-bit codes: bytes 32 (j / 4) .. +32 of qs, shifted by
        // 2 (j % 4); its halves' scales are sub-blocks 2j and 2j + 1.
        int j = u & 7;
        const u8* b = row + (T == T_Q2_K ? 84 : 110) * (u >> 3);
        const u8* qs = b + (T == T_Q2_K ? 16 : 32) + 32 * (j >> 2);
        int sh = 2 * (j & 3);
        if (T == T_Q2_K) {
            float d = h2f(*(const u16*)(b + 80)), dmin = h2f(*(const u16*)(b + 82));
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                int sc = b[2 * j + h];
                w.s[h] = d * (float)(sc & 0xF);
                w.m[h] = -dmin * (float)(sc >> 4);
            }
            #pragma unroll
            for (int i = 0; i < 8; i++) w.q[i] = (int)((*(const u32*)(qs + 4 * i) >> sh) & 0x03030303);
        } else {
            float d = h2f(*(const u16*)(b + 108));
            #pragma unroll
            for (int h = 0; h < 2; h++) w.s[h] = d * (float)q3_k_scale(b + 96, 2 * j + h);
            // A code is its two bits less 4 where the high mask bit is clear.
            join_codes<0x03030303, 0x01010101, 2, 0x04040404>(qs, sh, b, j, w.q);
        }
    } else {  // IQ4_NL, IQ4_XS, MXFP4: 4-bit indices into a codebook
        const u8* qs;
        const u32* table = (const u32*)(T == T_MXFP4 ? KVALUES_FP4 : KVALUES_IQ4NL);
        if (T == T_IQ4_NL) {
            const u8* b = row + 18 * u;
            w.s[0] = h2f(*(const u16*)b);
            qs = b + 2;
        } else if (T == T_MXFP4) {
            const u8* b = row + 17 * u;
            w.s[0] = e8m0_half(b[0]);
            qs = b + 1;
        } else {
            const u8* b = row + 136 * (u >> 3);
            int ib = u & 7;
            w.s[0] = h2f(*(const u16*)b) * (float)iq4_xs_scale(b + 4, *(const u16*)(b + 2), ib);
            qs = b + 8 + 16 * ib;
        }
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 v = T == T_IQ4_XS ? *(const u32*)(qs + 4 * i)
                    : T == T_IQ4_NL ? ld32_2(qs + 4 * i)
                                    : ld32_1(qs + 4 * i);
            w.q[i] = (int)lut16(v & 0x0F0F0F0F, table);
            w.q[i + 4] = (int)lut16((v >> 4) & 0x0F0F0F0F, table);
        }
    }
    if (!two_scales(T)) {
        w.s[1] = w.s[0];
        w.m[1] = w.m[0];
    }
}

// One 32-element unit of a float row, with 16-byte loads.
template <int T>
__device__ __forceinline__ void funit(const u8* __restrict__ row, int u, float* v) {
    if (T == T_F32) {
        const float4* p = (const float4*)row + 8 * u;
        #pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 a = p[i];
            v[4 * i] = a.x;
            v[4 * i + 1] = a.y;
            v[4 * i + 2] = a.z;
            v[4 * i + 3] = a.w;
        }
    } else {
        const uint4* p = (const uint4*)row + 4 * u;
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 a = p[i];
            u32 h[4] = {a.x, a.y, a.z, a.w};
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                u16 lo = (u16)(h[e] & 0xFFFF), hi = (u16)(h[e] >> 16);
                v[8 * i + 2 * e] = T == T_F16 ? h2f(lo) : bf2f(lo);
                v[8 * i + 2 * e + 1] = T == T_F16 ? h2f(hi) : bf2f(hi);
            }
        }
    }
}

// Unit u (elements 32u .. 32u + 32) of a row of type T into v[32]: a float
// row element by element (any alignment), a block row through `wunit`, the
// one decoder of each block format.
template <int T>
__device__ __forceinline__ void unit(const u8* __restrict__ row, int u, float* v) {
    if constexpr (is_float(T)) {
        #pragma unroll
        for (int i = 0; i < 32; i++) v[i] = elem<T>(row, u, i);
    } else {
        WUnit w;
        wunit<T>(row, u, w);
        #pragma unroll
        for (int i = 0; i < 32; i++) v[i] = w.at(i);
    }
}

// Σ v[i] · x[i] over one unit, x 16-byte aligned.
__device__ __forceinline__ float dot32(const float* v, const float* __restrict__ x) {
    const float4* xp = (const float4*)x;
    float acc = 0.0f;
    #pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 a = xp[i];
        acc += v[4 * i] * a.x + v[4 * i + 1] * a.y + v[4 * i + 2] * a.z + v[4 * i + 3] * a.w;
    }
    return acc;
}

// y[t, y_off + r] = Σ_k x[t, k] · w[r, k] for rows r < n and tokens t < m
// (where cuBLAS is missing, and for float rows whose length is not a
// multiple of 32). One warp per row and block of TM tokens, so each weight
// is read once per TM tokens.
#define TM 8

// The warp's weight row against up to TM activation rows xs[t] (mt of them,
// each k long): acc[t] = Σ row[i] · xs[t][i] summed over the warp. Float
// rows: lane l takes element l of each 32-element unit (coalesced loads,
// any length); block rows: lane l takes units l, l + 32, … whole, as the
// decode products do.
template <int T>
__device__ __forceinline__ void row_dots(const u8* __restrict__ row,
                                         const float* const* xs, int mt, int k,
                                         float* acc) {
    int lane = threadIdx.x & 31;
    #pragma unroll
    for (int t = 0; t < TM; t++) acc[t] = 0.0f;
    int units = k >> 5;
    if constexpr (is_float(T)) {
        #pragma unroll 8
        for (int u = 0; u < units; u++) {
            float v = elem<T>(row, u, lane);
            #pragma unroll
            for (int t = 0; t < TM; t++)
                if (t < mt) acc[t] += v * xs[t][32 * u + lane];
        }
        // The partial last unit.
        if (32 * units + lane < k) {
            float v = elem<T>(row, units, lane);
            #pragma unroll
            for (int t = 0; t < TM; t++)
                if (t < mt) acc[t] += v * xs[t][32 * units + lane];
        }
    } else {
        #pragma unroll 2
        for (int u = lane; u < units; u += 32) {
            float v[32];
            unit<T>(row, u, v);
            #pragma unroll
            for (int t = 0; t < TM; t++) {
                if (t >= mt) continue;
                const float* x = xs[t] + 32 * u;
                #pragma unroll
                for (int i = 0; i < 32; i++) acc[t] += v[i] * x[i];
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < TM; t++) acc[t] = warp_sum(acc[t]);
}

template <int T>
__device__ void matmul_body(const u8* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ y, int m, int n, int k, int ldy, int y_off) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= n) return;
    int t0 = blockIdx.y * TM;
    int mt = min(TM, m - t0);
    const u8* row = w + (size_t)r * row_size(T, k);
    const float* xs[TM];
    #pragma unroll
    for (int t = 0; t < TM; t++) xs[t] = x + (size_t)(t0 + min(t, mt - 1)) * k;
    float acc[TM];
    row_dots<T>(row, xs, mt, k, acc);
    #pragma unroll
    for (int t = 0; t < TM; t++)
        if (lane == 0 && t < mt) y[(size_t)(t0 + t) * ldy + y_off + r] = acc[t];
}

#define MATMUL(SUF, T)                                                                    \
    extern "C" __global__ void matmul_##SUF(const u8* w, const float* x, float* y, int m, \
                                            int n, int k, int ldy, int y_off) {           \
        pdl_begin();                                                                      \
        matmul_body<T>(w, x, y, m, n, k, ldy, y_off);                                     \
    }
FOR_EACH_TYPE(MATMUL)

// Element v of a warp's 32 (one per lane, in order) into its Q8_0 block as
// ggml's reference quantizer writes it: the code at q, and lane 0 the f16
// scale at d.
__device__ __forceinline__ void q8_store(float v, i8* q, u16* d) {
    float amax = warp_max(fabsf(v));
    float dd = amax / 127.0f;
    float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    *q = (i8)roundf(v * id);
    if ((threadIdx.x & 31) == 0) *d = f2h(dd);
}

// Rows of x (k long, k a multiple of 32) as ggml's Q8_0 blocks, byte for
// byte what its reference quantizer writes: the codes in qs (row-major, k a
// row) and the f16 scales in d (k / 32 a row). One warp per block.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ qs,
                                       u16* __restrict__ d, long long blocks) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((i >> 5) >= blocks) return;
    q8_store(x[i], qs + i, d + (i >> 5));
}

// acc[t] += unit u of row q against activation row t (t < mt): dp4a on
// the 8-bit blocks (xq, xd) or f32 on x.
template <int T, int NX, bool Q8>
__device__ __forceinline__ void unit_dot(const WUnit& q, int u, int units, int k, int mt,
                                         const float* __restrict__ x,
                                         const i8* __restrict__ xq,
                                         const u16* __restrict__ xd, float* acc) {
    if (Q8) {
        #pragma unroll
        for (int t = 0; t < NX; t++) {
            if (t >= mt) continue;
            const int4* xp = (const int4*)(xq + (size_t)t * k + 32 * u);
            int4 a = xp[0], b = xp[1];
            int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            int s0 = 0, s1 = 0;
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                s0 = __dp4a(q.q[i], xv[i], s0);
                s1 = __dp4a(q.q[i + 4], xv[i + 4], s1);
            }
            float part = two_scales(T) ? q.s[0] * (float)s0 + q.s[1] * (float)s1
                                       : q.s[0] * (float)(s0 + s1);
            if (has_offset(T)) {
                int x0 = 0, x1 = 0;
                #pragma unroll
                for (int i = 0; i < 4; i++) {
                    x0 = __dp4a(xv[i], 0x01010101, x0);
                    x1 = __dp4a(xv[i + 4], 0x01010101, x1);
                }
                part += two_scales(T) ? q.m[0] * (float)x0 + q.m[1] * (float)x1
                                      : q.m[0] * (float)(x0 + x1);
            }
            acc[t] += h2f(xd[(size_t)t * units + u]) * part;
        }
    } else {
        float v[32];
        #pragma unroll
        for (int i = 0; i < 32; i++) v[i] = q.at(i);
        #pragma unroll
        for (int t = 0; t < NX; t++)
            if (t < mt) acc[t] += dot32(v, x + (size_t)t * k + 32 * u);
    }
}

// y[t, y_off + r] = Σ_k x[t, k] · w[r, k] for rows r < n and activation
// rows t < mt ≤ NX; k a multiple of 32; x (or xq) 16-byte aligned rows.
// Q8: the activations as quantize_q8 wrote them (float weight types read x
// in both modes).
//
// One launch may cover up to three weights of one type and row length
// (a fused q/k/v or gate/up product): rows below e0 are w0's, rows below e1
// w1's (from row e0), the rest w2's, written to consecutive columns.
// UB: units a lane loads at once.
template <int T, int NX, bool Q8, int UB = 4>
__device__ void mmv_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                         const u8* __restrict__ w2, int e0, int e1,
                         const float* __restrict__ x, const i8* __restrict__ xq,
                         const u16* __restrict__ xd, float* __restrict__ y, int mt, int n, int k,
                         int ldy, int y_off) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= n) return;
    const u8* row = r < e0   ? w0 + (size_t)r * row_size(T, k)
                    : r < e1 ? w1 + (size_t)(r - e0) * row_size(T, k)
                             : w2 + (size_t)(r - e1) * row_size(T, k);
    int units = k >> 5;
    float acc[NX];
    #pragma unroll
    for (int t = 0; t < NX; t++) acc[t] = 0.0f;
    // U units a lane at a time, all their weight loads issued before any
    // arithmetic (past the row's end a lane reloads its last unit and
    // drops it): a warp waits for memory once per U units, not once per unit.
    constexpr int U = is_float(T) ? 2 : UB;
    // No kernel writes weights: the first units' loads go out before the
    // wait for the kernel before (pdl_begin), and overlap its end.
    bool waited = false;
    for (int u0 = lane; u0 < units; u0 += 32 * U) {
        if (is_float(T)) {
            float v[U][32];
            #pragma unroll
            for (int j = 0; j < U; j++) funit<T>(row, min(u0 + 32 * j, units - 1), v[j]);
            if (!waited) pdl_begin();
            waited = true;
            #pragma unroll
            for (int j = 0; j < U; j++) {
                int u = u0 + 32 * j;
                if (u >= units) break;
                #pragma unroll
                for (int t = 0; t < NX; t++)
                    if (t < mt) acc[t] += dot32(v[j], x + (size_t)t * k + 32 * u);
            }
        } else {
            WUnit q[U];
            #pragma unroll
            for (int j = 0; j < U; j++) wunit<T>(row, min(u0 + 32 * j, units - 1), q[j]);
            if (!waited) pdl_begin();
            waited = true;
            #pragma unroll
            for (int j = 0; j < U; j++) {
                int u = u0 + 32 * j;
                if (u >= units) break;
                unit_dot<T, NX, Q8>(q[j], u, units, k, mt, x, xq, xd, acc);
            }
        }
    }
    if (!waited) pdl_begin();
    #pragma unroll
    for (int t = 0; t < NX; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < mt) y[(size_t)t * ldy + y_off + r] = s;
    }
}

// Per type: mmv<n>_<type> (exact, f32 activations) and mmvq<n>_<type> (q8
// activations), for one activation row (n = 1) and up to eight (n = 8);
// mmvq1u<U>_<type> and mmvq8u<U>_<type> load U units a lane at once
// instead of four (rows of up to 32 U units in one pass with fewer
// registers, so more warps on an SM, and no loads past a short row's end).
#define MMV_PARAMS                                                                      \
    const u8 *w0, const u8 *w1, const u8 *w2, int e0, int e1, const float *x, const i8 *xq, \
        const u16 *xd, float *y, int mt, int n, int k, int ldy, int y_off
#define MMV_ARGS w0, w1, w2, e0, e1, x, xq, xd, y, mt, n, k, ldy, y_off
#define MMV(SUF, T)                                                                        \
    extern "C" __global__ void mmv1_##SUF(MMV_PARAMS) { mmv_body<T, 1, false>(MMV_ARGS); }  \
    extern "C" __global__ void mmv8_##SUF(MMV_PARAMS) { mmv_body<T, 8, false>(MMV_ARGS); }  \
    extern "C" __global__ void mmvq1_##SUF(MMV_PARAMS) { mmv_body<T, 1, true>(MMV_ARGS); }  \
    extern "C" __global__ void mmvq8_##SUF(MMV_PARAMS) { mmv_body<T, 8, true>(MMV_ARGS); }  \
    extern "C" __global__ void mmvq1u2_##SUF(MMV_PARAMS) { mmv_body<T, 1, true, 2>(MMV_ARGS); } \
    extern "C" __global__ void mmvq1u3_##SUF(MMV_PARAMS) { mmv_body<T, 1, true, 3>(MMV_ARGS); } \
    extern "C" __global__ void mmvq8u2_##SUF(MMV_PARAMS) { mmv_body<T, 8, true, 2>(MMV_ARGS); } \
    extern "C" __global__ void mmvq8u3_##SUF(MMV_PARAMS) { mmv_body<T, 8, true, 3>(MMV_ARGS); }
FOR_EACH_TYPE(MMV)

// ---- Products of 9–64 activation rows on the tensor cores ----
// y[t, y_off + r] = Σ_k x[t, k] · w[r, k] with bf16 operands and f32 sums
// (the numbers of dequantizing to bf16 for a library GEMM), each weight read
// once from its blocks and no dequantized copy. x: the activations as
// to_bf16 writes them, rows of k (a multiple of 32), at most 8 NB rows.
//
// A block takes MQ_ROWS weight rows (four warps of 32) and every token, and
// walks k four units (128 elements) at a time. Lane (g, t) (g = lane / 4,
// t = lane % 4) decodes unit 4s + t of its rows g, g + 8, g + 16 and g + 24
// straight from global memory (wunit, as the decode products do; the next
// group's loads go out before this group's products) and gives mma.sync its
// elements 4j .. 4j + 3 at step j. That is not mma's k order, but a sum
// over k does not care which order, only that both operands share it, and
// in this one no lane needs another lane's unit. The activations come
// through shared memory, copied asynchronously a group ahead, laid out so
// that a lane's B fragments of two steps are one conflict-free 16-byte load:
// token i's 16-byte chunk c of unit t sits at i · MQ_TOK + 64 c + 16 t.
//
// Up to three weights of one type and row length (w0 below row e0, w1
// below e1, then w2), as in the decode products. gridDim.y shares cut k
// (per groups of four units each) so that a product of few rows fills the
// GPU; with more than one, share z writes part[z][t][r] and mmq_sum adds
// the shares in order. Compute capability 8.0 on (below it the kernels are
// empty and plans do not launch them).
#define MQ_ROWS 128
#define MQ_TOK 320

__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
    u32 r = 0;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

__device__ __forceinline__ void mq_mma(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 16 bytes from global to shared memory without registers; `bytes` below 16
// fills the rest with zeros (0: all zeros, src not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
#if __CUDA_ARCH__ >= 800
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

// One unit of a weight row between its load and its use: the codes and
// scales of a block type, a float row's raw 16-bit elements.
template <int T>
struct MqUnit {
    WUnit w;
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) { wunit<T>(row, u, w); }
    // Elements 4j, 4j + 1 (lo) and 4j + 2, 4j + 3 (hi) as bf16 pairs.
    __device__ __forceinline__ void pairs(int j, u32& lo, u32& hi) const {
        // A signed code c as the float 2^23 + c + 128 (its byte, sign bit
        // flipped, under 2^23's exponent), less 2^23 + 128: exact, and no
        // slow integer conversion.
        const u32 q = (u32)w.q[j] ^ 0x80808080u;
        const float s = w.s[j >> 2], m = w.m[j >> 2];
        float v[4];
        #pragma unroll
        for (int e = 0; e < 4; e++)
            v[e] = fmaf(s, __int_as_float(__byte_perm(q, 0x4B000000u, 0x7540u + e)) - 8388736.0f, m);
        lo = bf16x2(v[0], v[1]);
        hi = bf16x2(v[2], v[3]);
    }
};
template <int T>
struct MqFloatUnit {
    uint4 raw[4];
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const uint4* p = (const uint4*)row + 4 * u;
        #pragma unroll
        for (int i = 0; i < 4; i++) raw[i] = p[i];
    }
    __device__ __forceinline__ void pairs(int j, u32& lo, u32& hi) const {
        const uint4 r = raw[j >> 1];
        const u32 a = j & 1 ? r.z : r.x, b = j & 1 ? r.w : r.y;
        if (T == T_BF16) {
            lo = a;
            hi = b;
        } else {
            lo = bf16x2(h2f((u16)(a & 0xFFFF)), h2f((u16)(a >> 16)));
            hi = bf16x2(h2f((u16)(b & 0xFFFF)), h2f((u16)(b >> 16)));
        }
    }
};
template <> struct MqUnit<T_F16> : MqFloatUnit<T_F16> {};
template <> struct MqUnit<T_BF16> : MqFloatUnit<T_BF16> {};
template <>
struct MqUnit<T_F32> {
    u32 p[16];
    __device__ __forceinline__ void load(const u8* __restrict__ row, int u) {
        const float4* q = (const float4*)row + 8 * u;
        #pragma unroll
        for (int i = 0; i < 8; i++) {
            const float4 a = q[i];
            p[2 * i] = bf16x2(a.x, a.y);
            p[2 * i + 1] = bf16x2(a.z, a.w);
        }
    }
    __device__ __forceinline__ void pairs(int j, u32& lo, u32& hi) const {
        lo = p[2 * j];
        hi = p[2 * j + 1];
    }
};

// Group s's activations (units 4s .. 4s + 3 of 8 NB tokens, zeros past
// either end) copied into one of mmq's buffers: 16 chunks of 16 bytes a
// token, a chunk a thread at a time.
template <int NB>
__device__ __forceinline__ void mq_stage(u8* xs, const u16* __restrict__ x, int s, int mt, int k,
                                         int tid) {
    #pragma unroll
    for (int i = 0; i < NB; i++) {
        const int c = tid + 128 * i, tok = c >> 4, tt = (c >> 2) & 3, jj = c & 3;
        const int u = 4 * s + tt;
        const bool ok = tok < mt && u < (k >> 5);
        const u16* src = x + (ok ? (size_t)tok * k + 32 * u + 8 * jj : 0);
        cp_async16(xs + tok * MQ_TOK + 64 * jj + 16 * tt, src, ok ? 16 : 0);
    }
    cp_async_commit();
}

template <int T, int NB>
__device__ void mmq_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                         const u8* __restrict__ w2, int e0, int e1, const u16* __restrict__ x,
                         float* __restrict__ y, float* __restrict__ part, int mt, int n, int k,
                         int ldy, int y_off, int per) {
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(16) u8 xs[2][NB * 8 * MQ_TOK];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int units = k >> 5, groups = (units + 3) >> 2;
    const int s0 = blockIdx.y * per, s1 = min(groups, s0 + per);
    const size_t rs = row_size(T, k);
    // Rows past n read row n - 1 and are not written.
    const u8* rows[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = min(blockIdx.x * MQ_ROWS + 32 * warp + g + 8 * i, n - 1);
        rows[i] = r < e0   ? w0 + (size_t)r * rs
                  : r < e1 ? w1 + (size_t)(r - e0) * rs
                           : w2 + (size_t)(r - e1) * rs;
    }
    float acc[2][NB][4];
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int nt = 0; nt < NB; nt++)
            #pragma unroll
            for (int c = 0; c < 4; c++) acc[i][nt][c] = 0.0f;
    // Past the last unit a lane reloads it; the activations there are zeros.
    MqUnit<T> cur[4], nxt[4];
    #pragma unroll
    for (int i = 0; i < 4; i++) cur[i].load(rows[i], min(4 * s0 + t, units - 1));
    // No kernel writes weights: they load before the wait for the one before.
    pdl_begin();
    mq_stage<NB>(xs[0], x, s0, mt, k, tid);
    for (int s = s0; s < s1; s++) {
        const int b = (s - s0) & 1;
        if (s + 1 < s1) mq_stage<NB>(xs[b ^ 1], x, s + 1, mt, k, tid);
        #pragma unroll
        for (int i = 0; i < 4; i++) nxt[i].load(rows[i], min(4 * (s + 1) + t, units - 1));
        if (s + 1 < s1) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        const u8* xb = &xs[b][g * MQ_TOK + 16 * t];
        #pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            // Steps 2jj and 2jj + 1: A fragments of both m-tiles.
            u32 a[2][2][4];
            #pragma unroll
            for (int h = 0; h < 2; h++)
                #pragma unroll
                for (int i = 0; i < 2; i++) {
                    cur[2 * i].pairs(2 * jj + h, a[h][i][0], a[h][i][2]);
                    cur[2 * i + 1].pairs(2 * jj + h, a[h][i][1], a[h][i][3]);
                }
            #pragma unroll
            for (int nt = 0; nt < NB; nt++) {
                const uint4 v = *(const uint4*)(xb + nt * 8 * MQ_TOK + 64 * jj);
                #pragma unroll
                for (int i = 0; i < 2; i++) {
                    mq_mma(acc[i][nt], a[0][i], v.x, v.y);
                    mq_mma(acc[i][nt], a[1][i], v.z, v.w);
                }
            }
        }
        // Buffer b takes group s + 2 next.
        __syncthreads();
        #pragma unroll
        for (int i = 0; i < 4; i++) cur[i] = nxt[i];
    }
    // acc[i][nt]: rows g (c < 2) and g + 8 of m-tile i, tokens 8 nt + 2t + c % 2.
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int nt = 0; nt < NB; nt++)
            #pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = blockIdx.x * MQ_ROWS + 32 * warp + 16 * i + g + 8 * (c >> 1);
                const int tok = 8 * nt + 2 * t + (c & 1);
                if (r >= n || tok >= mt) continue;
                if (gridDim.y == 1) y[(size_t)tok * ldy + y_off + r] = acc[i][nt][c];
                else part[((size_t)blockIdx.y * mt + tok) * n + r] = acc[i][nt][c];
            }
#endif
}

// y[t, y_off + r] = Σ_z part[z][t][r], z in order (the shares of an mmq).
extern "C" __global__ void mmq_sum(const float* __restrict__ part, float* __restrict__ y, int mt,
                                   int n, int shares, int ldy, int y_off) {
    pdl_begin();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)mt * n) return;
    const long long tok = i / n, r = i % n;
    float s = 0.0f;
    for (int z = 0; z < shares; z++) s += part[(size_t)z * mt * n + i];
    y[tok * ldy + y_off + r] = s;
}

// Per type: mmq<8 NB>_<type>, products of up to 8 NB activation rows.
#define MMQ_PARAMS                                                                       \
    const u8 *w0, const u8 *w1, const u8 *w2, int e0, int e1, const u16 *x, float *y,    \
        float *part, int mt, int n, int k, int ldy, int y_off, int per
#define MMQ_ARGS w0, w1, w2, e0, e1, x, y, part, mt, n, k, ldy, y_off, per
#define MMQ(SUF, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(128) mmq16_##SUF(MMQ_PARAMS) {          \
        mmq_body<T, 2>(MMQ_ARGS);                                                        \
    }                                                                                    \
    extern "C" __global__ void __launch_bounds__(128) mmq32_##SUF(MMQ_PARAMS) {          \
        mmq_body<T, 4>(MMQ_ARGS);                                                        \
    }                                                                                    \
    extern "C" __global__ void __launch_bounds__(128) mmq64_##SUF(MMQ_PARAMS) {          \
        mmq_body<T, 8>(MMQ_ARGS);                                                        \
    }
FOR_EACH_TYPE(MMQ)


// out[i, :] = table[ids[i], :] dequantized; one thread per 32-element unit
// (a float row's partial last unit element by element).
template <int T>
__device__ void gather_body(const u8* table, const int* ids, float* out, int n, int k) {
    int units = (k + 31) >> 5;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * units) return;
    int i = idx / units, u = idx % units;
    const u8* row = table + (size_t)ids[i] * row_size(T, k);
    float* o = out + (size_t)i * k + 32 * u;
    if constexpr (is_float(T)) {
        if (32 * u + 32 > k) {
            for (int j = 0; 32 * u + j < k; j++) o[j] = elem<T>(row, u, j);
            return;
        }
    }
    float v[32];
    unit<T>(row, u, v);
    #pragma unroll
    for (int j = 0; j < 32; j++) o[j] = v[j];
}

#define GATHER(SUF, T)                                                                   \
    extern "C" __global__ void gather_##SUF(const u8* table, const int* ids, float* out,  \
                                            int n, int k) {                              \
        pdl_begin();                                                                     \
        gather_body<T>(table, ids, out, n, k);                                           \
    }
FOR_EACH_TYPE(GATHER)

// f32 to bf16, rounded to nearest even (NaN stays NaN).
__device__ __forceinline__ u32 f2bf(float f) {
    u32 b = __float_as_uint(f);
    if ((b & 0x7fffffff) > 0x7f800000) return (b >> 16) | 0x40;
    return (b + 0x7fff + ((b >> 16) & 1)) >> 16;
}

// Rows of a weight dequantized for a library matrix product: n rows of k
// elements from w into out [n, k], as f32, or as bf16 when `bf16` is set.
// One thread per 32-element unit, written with 16-byte stores (so k is a
// multiple of 32; the host sends other products to `matmul_body`).
template <int T>
__device__ void dequant_body(const u8* w, void* out, long long n, int k, int bf16) {
    int units = k >> 5;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * units) return;
    long long i = idx / units;
    int u = (int)(idx % units);
    size_t row_bytes = row_size(T, k);
    float v[32];
    unit<T>(w + i * row_bytes, u, v);
    if (bf16) {
        uint4* o = (uint4*)((u16*)out + i * k + 32 * u);
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            const float* p = v + 8 * j;
            o[j] = make_uint4(f2bf(p[0]) | (f2bf(p[1]) << 16), f2bf(p[2]) | (f2bf(p[3]) << 16),
                              f2bf(p[4]) | (f2bf(p[5]) << 16), f2bf(p[6]) | (f2bf(p[7]) << 16));
        }
    } else {
        float4* o = (float4*)((float*)out + i * k + 32 * u);
        #pragma unroll
        for (int j = 0; j < 8; j++) o[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
    }
}

#define DEQUANT(SUF, T)                                                                   \
    extern "C" __global__ void dequant_##SUF(const u8* w, void* out, long long n, int k,  \
                                             int bf16) {                                  \
        pdl_begin();                                                                      \
        dequant_body<T>(w, out, n, k, bf16);                                              \
    }
FOR_EACH_TYPE(DEQUANT)

// Waits `ns` nanoseconds of the GPU's clock: a step being profiled queues
// behind it, so that its kernels run back to back however slowly the host
// queues them.
extern "C" __global__ void spin(long long ns) {
    pdl_begin();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (unsigned long long)ns);
}

// y = x as bf16 (the activations of a bf16 library product).
extern "C" __global__ void to_bf16(const float* x, u16* y, long long n) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (u16)f2bf(x[i]);
}

// Per row of d: x / sqrt(mean(x²) + eps) · (gamma if given). One block per row.
// y = x / rms(x) · gamma per row of d (gamma null: none); one block per row.
// Each thread holds up to NORM_HELD of the row's elements (and their gamma)
// in registers, all loaded at once, so the row is read from memory once and
// the wait for it is one round trip, not one per element; the host sizes
// blocks to about four elements a thread. Q8: written as 8-bit blocks
// (codes qs, f16 scales qd, as quantize_q8 writes them) instead of f32; d a
// multiple of 32 and the block's threads whole warps, so each warp
// quantizes whole blocks.
#define NORM_HELD 8

// Thread's elements tid + c·blockDim (c < NORM_HELD) of row r (zero past d)
// into v, and of gamma (one where null) into g.
__device__ __forceinline__ void hold_row(const float* __restrict__ r,
                                         const float* __restrict__ gamma, int d, float* v,
                                         float* g) {
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) {
        int i = threadIdx.x + c * blockDim.x;
        v[c] = i < d ? r[i] : 0.0f;
        if (g) g[c] = i < d && gamma ? gamma[i] : 1.0f;
    }
}

// 1 / rms + eps of a row whose held part is v and whose elements past
// NORM_HELD·blockDim are read from r (each thread its own), summed in the
// same order by every norm kernel. part: 32 floats of shared memory.
__device__ __forceinline__ float row_inv_rms(const float* v, const float* r, int d, float eps,
                                             float* part) {
    float s = 0.0f;
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) s += v[c] * v[c];
    for (int i = threadIdx.x + NORM_HELD * blockDim.x; i < d; i += blockDim.x) s += r[i] * r[i];
    s = warp_sum(s);
    __syncthreads();  // `part` may still be read from a previous sum
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    return rsqrtf(part[0] / (float)d + eps);
}

// Where a norm writes: f32, 8-bit blocks, or bf16 (a many-row product's
// operand, rounded as to_bf16 rounds).
#define NORM_F32 0
#define NORM_Q8 1
#define NORM_BF16 2

// The normed element o at i, written as OUT says (y is u16 for bf16).
template <int OUT>
__device__ __forceinline__ void norm_store(float o, size_t i, float* y, i8* qs, u16* qd) {
    if (OUT == NORM_Q8) q8_store(o, qs + i, qd + (i >> 5));
    else if (OUT == NORM_BF16) ((u16*)y)[i] = (u16)f2bf(o);
    else y[i] = o;
}

template <int OUT>
__device__ void rms_norm_body(const float* __restrict__ x, const float* __restrict__ gamma,
                              float* __restrict__ y, i8* qs, u16* qd, int d, float eps) {
    __shared__ float part[32];
    const float* xr = x + (size_t)blockIdx.x * d;
    float v[NORM_HELD], g[NORM_HELD];
    hold_row(xr, gamma, d, v, g);
    float inv = row_inv_rms(v, xr, d, eps, part);
    size_t base = (size_t)blockIdx.x * d;
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i >= d) break;
        norm_store<OUT>(v[c] * inv * g[c], base + i, y, qs, qd);
    }
    for (int i = threadIdx.x + NORM_HELD * blockDim.x; i < d; i += blockDim.x)
        norm_store<OUT>(xr[i] * inv * (gamma ? gamma[i] : 1.0f), base + i, y, qs, qd);
}

// A residual add between two norms, for a q8 decode product: s = x + n,
// where n = a / rms(a) · g1 (norm1) or n = a, is written (the residual
// stream goes on), and s / rms(s) · g2 as 8-bit blocks (the product's
// input) — bit for bit what rms_norm, the add and rms_norm_q8 write, one
// block per row of d (a multiple of 32), blocks of whole warps. s may be
// where a or x was: each thread reads its elements before writing them.
// (OUT NORM_BF16: the second norm's output as a many-row product's bf16
// operand instead, y16, rounded as to_bf16 rounds.)
template <int OUT>
__device__ void add_norm_body(const float* __restrict__ x, const float* a,
                              const float* __restrict__ g1, float eps1, int norm1, float* s,
                              const float* __restrict__ g2, float eps2, i8* qs, u16* qd,
                              u16* y16, int d) {
    __shared__ float part[32];
    size_t base = (size_t)blockIdx.x * d;
    const float *ar = a + base, *xr = x + base;
    float* sr = s + base;
    float v[NORM_HELD], g[NORM_HELD], xv[NORM_HELD], h[NORM_HELD];
    hold_row(ar, g1, d, v, g);
    hold_row(xr, g2, d, xv, h);  // the second norm's gammas too: one round trip for all
    float inv1 = norm1 ? row_inv_rms(v, ar, d, eps1, part) : 1.0f;
    // The elements past the held ones, then the held ones (whose a and x
    // are already in registers).
    // (Explicitly rounded operations: a contracted multiply-add would round
    // differently from the separate norm and add kernels.)
    for (int i = threadIdx.x + NORM_HELD * blockDim.x; i < d; i += blockDim.x) {
        float n = norm1 ? __fmul_rn(__fmul_rn(ar[i], inv1), g1 ? g1[i] : 1.0f) : ar[i];
        sr[i] = __fadd_rn(xr[i], n);
    }
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) {
        int i = threadIdx.x + c * blockDim.x;
        float n = norm1 ? __fmul_rn(__fmul_rn(v[c], inv1), g[c]) : v[c];
        v[c] = __fadd_rn(xv[c], n);
        if (i < d) sr[i] = v[c];
    }
    float inv2 = row_inv_rms(v, sr, d, eps2, part);
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i >= d) break;
        norm_store<OUT>(v[c] * inv2 * h[c], base + i, (float*)y16, qs, qd);
    }
    for (int i = threadIdx.x + NORM_HELD * blockDim.x; i < d; i += blockDim.x)
        norm_store<OUT>(sr[i] * inv2 * (g2 ? g2[i] : 1.0f), base + i, (float*)y16, qs, qd);
}

extern "C" __global__ void add_norm_q8(const float* __restrict__ x, const float* a,
                                       const float* __restrict__ g1, float eps1, int norm1,
                                       float* s, const float* __restrict__ g2, float eps2,
                                       i8* qs, u16* qd, int d) {
    pdl_begin();
    add_norm_body<NORM_Q8>(x, a, g1, eps1, norm1, s, g2, eps2, qs, qd, nullptr, d);
}

extern "C" __global__ void add_norm_bf16(const float* __restrict__ x, const float* a,
                                         const float* __restrict__ g1, float eps1, int norm1,
                                         float* s, const float* __restrict__ g2, float eps2,
                                         u16* y16, int d) {
    pdl_begin();
    add_norm_body<NORM_BF16>(x, a, g1, eps1, norm1, s, g2, eps2, nullptr, nullptr, y16, d);
}

extern "C" __global__ void rms_norm(const float* x, const float* gamma, float* y, int d,
                                    float eps) {
    pdl_begin();
    rms_norm_body<NORM_F32>(x, gamma, y, nullptr, nullptr, d, eps);
}

extern "C" __global__ void rms_norm_q8(const float* x, const float* gamma, i8* qs, u16* qd,
                                       int d, float eps) {
    pdl_begin();
    rms_norm_body<NORM_Q8>(x, gamma, nullptr, qs, qd, d, eps);
}

extern "C" __global__ void rms_norm_bf16(const float* x, const float* gamma, u16* y, int d,
                                         float eps) {
    pdl_begin();
    rms_norm_body<NORM_BF16>(x, gamma, (float*)y, nullptr, nullptr, d, eps);
}

// Elementwise a ∘ b, b broadcast NumPy-style: the output (and a) is
// [d0, d1, d2, d3] and b is read at strides s0..s3 (0 along broadcast axes).
#define BIN_ADD 0
#define BIN_MUL 1
extern "C" __global__ void binary(const float* a, const float* b, float* y, long long n, int d1,
                                  int d2, int d3, long long s0, long long s1, long long s2,
                                  long long s3, int op) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i;
    long long i3 = r % d3;
    r /= d3;
    long long i2 = r % d2;
    r /= d2;
    long long i1 = r % d1, i0 = r / d1;
    float bv = b[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3];
    y[i] = op == BIN_ADD ? a[i] + bv : a[i] * bv;
}

#define UN_SCALE 0
#define UN_ADD_CONST 1
#define UN_GELU 2
#define UN_SOFTCAP 3
__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

extern "C" __global__ void unary(const float* x, float* y, long long n, int op, float c) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    switch (op) {
        case UN_SCALE: y[i] = v * c; break;
        case UN_ADD_CONST: y[i] = v + c; break;
        case UN_GELU: y[i] = gelu(v); break;
        default: y[i] = c * tanhf(v / c); break;
    }
}

// Element i of gelu(gate) · up in rows of `width`, each operand's rows `gs`
// and `us` elements apart (width where contiguous; a batched step reads its
// gate and up in place in one product's output).
__device__ __forceinline__ float geglu_at(const float* gate, const float* up, long long i,
                                          long long width, long long gs, long long us) {
    long long t = i / width, c = i - t * width;
    return gelu(gate[t * gs + c]) * up[t * us + c];
}

// gelu(gate) · up over n elements (geglu_at).
extern "C" __global__ void geglu(const float* gate, const float* up, float* y, long long n,
                                 long long width, long long gs, long long us) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = geglu_at(gate, up, i, width, gs, us);
}

// geglu as 8-bit blocks for a q8 decode product (n a multiple of 32; as
// geglu then quantize_q8 write them). One warp per block.
extern "C" __global__ void geglu_q8(const float* gate, const float* up, i8* qs, u16* qd,
                                    long long n, long long width, long long gs, long long us) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((i >> 5) >= (n >> 5)) return;
    q8_store(geglu_at(gate, up, i, width, gs, us), qs + i, qd + (i >> 5));
}

// geglu as a many-row product's bf16 operand (as geglu then to_bf16 write it).
extern "C" __global__ void geglu_bf16(const float* gate, const float* up, u16* y, long long n,
                                      long long width, long long gs, long long us) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (u16)f2bf(geglu_at(gate, up, i, width, gs, us));
}

// Element c of a head after NEOX rotary embedding, where pairs (i, i + half)
// for i < half rotate by angle pos · inv[i] and a, b are the pair's values
// (c's own and its partner, in pair order). Explicitly rounded, as the CPU
// computes it (no contracted multiply-adds), so that every kernel that
// rotates gives the same bits.
__device__ __forceinline__ float rope_elem(float a, float b, int pos, float inv, bool first) {
    float s, co;
    sincosf((float)pos * inv, &s, &co);
    return first ? __fsub_rn(__fmul_rn(a, co), __fmul_rn(b, s))
                 : __fadd_rn(__fmul_rn(b, co), __fmul_rn(a, s));
}

// NEOX rotary embedding of x [n, heads, hd]: pairs (i, i + n_rot/2) for
// i < n_rot/2 rotate by pos · inv[i] (the host's f32 table, as the CPU uses).
extern "C" __global__ void rope(const float* x, const int* pos, const float* inv, float* y,
                                int n, int heads, int hd, int n_rot) {
    pdl_begin();
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int half = n_rot / 2;
    if (idx >= n * heads * hd) return;
    int c = idx % hd;
    int t = idx / (heads * hd);
    if (c >= n_rot) {
        y[idx] = x[idx];
        return;
    }
    int i = c < half ? c : c - half;
    int head = idx - c;
    y[idx] = rope_elem(x[head + i], x[head + i + half], pos[t], inv[i], c < half);
}

// Head x [hd] RMS-normed with gamma (where `norm`; else copied) into the
// shared `normed`, with rms_norm's arithmetic; the block's threads share it.
__device__ void norm_head(const float* xr, const float* gamma, bool norm, int hd, float eps,
                          float* part, float* normed) {
    float v[NORM_HELD], g[NORM_HELD];
    hold_row(xr, gamma, hd, v, g);
    float inv_rms = norm ? row_inv_rms(v, xr, hd, eps, part) : 1.0f;
    #pragma unroll
    for (int c = 0; c < NORM_HELD; c++) {
        int i = threadIdx.x + c * blockDim.x;
        if (i < hd) normed[i] = norm ? v[c] * inv_rms * g[c] : v[c];
    }
    for (int i = threadIdx.x + NORM_HELD * blockDim.x; i < hd; i += blockDim.x)
        normed[i] = norm ? xr[i] * inv_rms * (gamma ? gamma[i] : 1.0f) : xr[i];
    __syncthreads();
}

// The normed head rotated as `rope` rotates it into y (global or shared).
__device__ __forceinline__ void rope_head(const float* normed, float* y, int hd, int p,
                                          const float* inv, int n_rot) {
    int half = n_rot / 2;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) {
        if (c >= n_rot) {
            y[c] = normed[c];
            continue;
        }
        int i = c < half ? c : c - half;
        y[c] = rope_elem(normed[i], normed[i + half], p, inv[i], c < half);
    }
}

// rms_norm over each head of x [n, heads, hd] (one block per head, as
// rms_norm runs), then rope of the normed head: bit for bit the two kernels
// one after the other, in one launch. The normed head goes through shared
// memory (hd ≤ 512), since a rotated pair's two elements belong to
// different threads. y may be where x is: a block reads its head before
// writing it, and blocks touch only their own head.
extern "C" __global__ void rms_norm_rope(const float* x, const float* gamma, float* y, int hd,
                                         float eps, const int* pos, const float* inv, int heads,
                                         int n_rot) {
    pdl_begin();
    __shared__ float part[32];
    __shared__ float normed[512];
    norm_head(x + (size_t)blockIdx.x * hd, gamma, true, hd, eps, part, normed);
    rope_head(normed, y + (size_t)blockIdx.x * hd, hd, pos[blockIdx.x / heads], inv, n_rot);
}

// K/V buffers hold rows of f32, f16 or bf16 elements, or of ggml's Q8_0
// or Q4_0 blocks (whole blocks a row), stored as the CPU stores them.

// A block's f16 scale, as one 16-bit store (blocks of 34 and 18 bytes start
// 2-byte aligned). Written as two byte stores of the converted half (the
// PTX was right), the low byte came out 0 on an H200 (sm_90, CUDA 13).
__device__ __forceinline__ void st_half(u8* p, float v) { *(u16*)p = f2h(v); }

// Unit u (elements 32u .. 32u + n, n ≤ 32, and n = 32 for block types) of
// row `row` of a K/V buffer of type t whose rows have w elements, from x.
// The block types are quantized as rlx_gguf quantizes (ggml's reference
// rounding, no fused multiply-adds).
__device__ void kv_store_unit(void* base, int t, size_t row, int w, int u, const float* x,
                              int n) {
    if (t == T_Q8_0) {
        u8* b = (u8*)base + ((row * w >> 5) + u) * 34;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        st_half(b, d);
        for (int j = 0; j < 32; j++) b[2 + j] = (u8)(int)roundf(__fmul_rn(x[j], id));
        return;
    }
    if (t == T_Q4_0) {
        u8* b = (u8*)base + ((row * w >> 5) + u) * 18;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                mx = x[j];
            }
        }
        float d = mx / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        st_half(b, d);
        for (int j = 0; j < 16; j++) {
            int lo = min(15, (int)(i8)(int)__fadd_rn(__fmul_rn(x[j], id), 8.5f));
            int hi = min(15, (int)(i8)(int)__fadd_rn(__fmul_rn(x[16 + j], id), 8.5f));
            b[2 + j] = (u8)(lo | (hi << 4));
        }
        return;
    }
    size_t i0 = row * w + 32 * u;
    for (int j = 0; j < n; j++) {
        if (t == T_F32)
            ((float*)base)[i0 + j] = x[j];
        else
            ((u16*)base)[i0 + j] = t == T_F16 ? f2h(x[j]) : (u16)f2bf(x[j]);
    }
}

// Rows t < n of k [n, kd] and v [n, vd] stored at physical rows rows[t] of
// the layer's K/V buffers (the pool's choice: a block of the row's sequence
// at its position), keys as type kt and values as vt; one thread per
// 32-element unit.
extern "C" __global__ void kv_write(const float* k, const float* v, void* kc, void* vc,
                                    const int* rows, int n, int kd, int vd, int kt, int vt) {
    pdl_begin();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int ku = (kd + 31) >> 5, vu = (vd + 31) >> 5;
    if (idx >= (long long)n * (ku + vu)) return;
    int t = (int)(idx / (ku + vu)), u = (int)(idx % (ku + vu));
    size_t row = (size_t)rows[t];
    if (u < ku)
        kv_store_unit(kc, kt, row, kd, u, k + (size_t)t * kd + 32 * u, min(32, kd - 32 * u));
    else
        kv_store_unit(vc, vt, row, vd, u - ku, v + (size_t)t * vd + 32 * (u - ku),
                      min(32, vd - 32 * (u - ku)));
}

// A layer's heads made ready for attention in one launch, per row t: the q
// heads normed (qn) and rotated into qy [n, hq, hd]; the k heads normed (kn)
// and rotated, and the v heads normed (vn, gamma vg or none), stored at
// physical row rows[t] of the layer's K/V buffers as kv_write stores them.
// One block per (row, head), hq + 2 hkv a row; hd ≤ 512 and a multiple of
// 32, so that each head is whole K/V units. Every value is what the
// separate norm, rope and kv_write kernels give, bit for bit.
struct HeadPart {
    const float* x;
    const float* gamma;
    int norm;
    float eps;
    const int* pos;
    const float* inv;
    int n_rot;
    // Elements from one row's heads to the next's.
    int stride;
};

extern "C" __global__ void head_prep(const float* qx, const float* qg, int qn, float qeps,
                                     const int* qpos, const float* qinv, int qrot, float* qy,
                                     const float* kx, const float* kg, int kn, float keps,
                                     const int* kpos, const float* kinv, int krot,
                                     const float* vx, const float* vg, int vn, float veps,
                                     void* kc, void* vc, const int* rows, int kt, int vt, int hq,
                                     int hkv, int hd, int qstride, int kstride, int vstride) {
    HeadPart qp = {qx, qg, qn, qeps, qpos, qinv, qrot, qstride};
    HeadPart kp = {kx, kg, kn, keps, kpos, kinv, krot, kstride};
    HeadPart vp = {vx, vg, vn, veps, nullptr, nullptr, 0, vstride};
    __shared__ float part[32];
    __shared__ float normed[512], roped[512], inv[256];
    int per = hq + 2 * hkv;
    int t = blockIdx.x / per, j = blockIdx.x % per;
    bool is_q = j < hq, is_k = !is_q && j < hq + hkv;
    int head = is_q ? j : is_k ? j - hq : j - hq - hkv;
    const HeadPart hp = is_q ? qp : is_k ? kp : vp;
    // The step's positions and K/V rows and the rope table, which no kernel
    // writes: loaded before the wait for the kernel before (which wrote x),
    // not in the chain after it. norm_head's barrier publishes `inv`.
    int p = hp.pos ? hp.pos[t] : 0;
    size_t row = is_q ? 0 : (size_t)rows[t];
    for (int i = threadIdx.x; i < hp.n_rot / 2; i += blockDim.x) inv[i] = hp.inv[i];
    pdl_begin();
    norm_head(hp.x + (size_t)t * hp.stride + (size_t)head * hd, hp.gamma, hp.norm, hd, hp.eps,
              part, normed);
    if (is_q) {
        rope_head(normed, qy + ((size_t)t * hq + head) * hd, hd, p, inv, hp.n_rot);
        return;
    }
    const float* src = normed;
    if (is_k) {
        rope_head(normed, roped, hd, p, inv, hp.n_rot);
        __syncthreads();
        src = roped;
    }
    int units = hd >> 5;
    for (int u = threadIdx.x; u < units; u += blockDim.x)
        kv_store_unit(is_k ? kc : vc, is_k ? kt : vt, row, hkv * hd, head * units + u,
                      src + 32 * u, 32);
}

// Rows of a K/V block; the Rust side's BLOCK_TOKENS.
#define BLOCK 32

#define MASK_CAUSAL 0
#define MASK_SLIDING 1
#define MASK_FULL 2
#define MASK_SYMMETRIC 3
__device__ __forceinline__ bool visible(int mask, int w, int qp, int kp) {
    switch (mask) {
        case MASK_CAUSAL: return kp <= qp;
        case MASK_SLIDING: return kp <= qp && qp - kp < w;
        case MASK_FULL: return true;
        default: return abs(qp - kp) <= w;
    }
}

// Where a query's keys are, for `attention_body`: its position, the end of
// its keys' positions, and a range of 32-row blocks, each a physical block
// (rows phys·BLOCK ..) holding the keys at positions lo .. lo + BLOCK.

// The paged pool: query row qi is at position qpos[qi] in run r =
// run_of_row[qi], which reads the blocks listed at table entries
// block_start[r] .. block_start[r + 1], pairs (physical block, logical
// block); rows at or past run_end[r] hold nothing of this run yet.
// With span ids (qspan, tspan not null), a query and a key of the same
// non-zero span see each other whatever the mask: qspan[qi] is the query's,
// tspan[e·BLOCK + i] that of row i of entry e's block.
struct PagedKeys {
    const int *qpos, *run_of_row, *run_end, *block_start, *table, *qspan, *tspan;
    __device__ void query(int qi, int* qp, int* end, int* e0, int* e1) const {
        int r = run_of_row[qi];
        *qp = qpos[qi];
        *end = run_end[r];
        *e0 = block_start[r];
        *e1 = block_start[r + 1];
    }
    __device__ void block(int e, int* phys, int* lo) const {
        *phys = table[2 * e];
        *lo = table[2 * e + 1] * BLOCK;
    }
    __device__ int query_span(int qi) const { return qspan ? qspan[qi] : 0; }
    __device__ int key_span(int e, int i) const { return tspan[e * BLOCK + i]; }
};

// K/V given as inputs: m keys at rows and positions 0 .. m, the n queries
// at the last n of those positions.
struct DenseKeys {
    int m, n;
    __device__ void query(int qi, int* qp, int* end, int* e0, int* e1) const {
        *qp = m - n + qi;
        *end = m;
        *e0 = 0;
        *e1 = (m + BLOCK - 1) / BLOCK;
    }
    __device__ void block(int e, int* phys, int* lo) const {
        *phys = e;
        *lo = e * BLOCK;
    }
    __device__ int query_span(int) const { return 0; }
    __device__ int key_span(int, int) const { return 0; }
};

// One block of AW warps per (query row, group of gq query heads that share
// a K/V head, split of the query's listed key blocks): each key and value
// is read once for the gq heads, and a split is a contiguous share of the
// listed blocks (gridDim.y splits, so that a few queries over a long
// context still fill the GPU). Query row qi [hq, hd] of q [n, hq, hd] reads
// the keys `keys` gives it: row i of a block holds the key at position
// lo + i, in row phys·BLOCK + i of kc [rows, hkv, hd] and vc [rows, hkv,
// hdv].
//
// The warps work apart, flash-decoding style, so that a short context costs
// about one round trip to memory rather than one a phase: the keys come in
// chunks of `AttnShape::KPW` rows, and warp w takes chunks w, w + AW, ...;
// for each it issues the chunk's key and value loads together (lane l holds
// elements 8l .. 8l + 8 of each row, and 256 + 8l .. for rows longer than
// 256), scores every (key, head) pair with one exchange of partial sums over
// the lanes (`warp_sums`), takes one online-softmax step per head, and adds
// the weighted values to its own sums. At the end the warps' sums are
// merged through shared memory in warp order. The splits share the listed
// blocks evenly (one block each up to gridDim.y blocks, so a short context
// uses few); where one split has them all, it writes out [n, hq, hdv] itself
// (a query that sees no key gets zeros). Otherwise each writes its heads'
// unnormalized sums, maxima and totals into part (ATTN_PART floats a
// split), counts itself done in done[blockIdx.x] (zeros between launches),
// and the last split of the block to finish merges them (attention_merge):
// no launch of its own, and only the splits that had keys are read. With
// qs, the output goes out as the next product's 8-bit blocks instead (as
// quantize_q8 writes them; hdv a multiple of 32), with ob as its bf16
// operand (as to_bf16 writes it). hd, hdv ≤ 512, gq ≤
// ATTN_MAXG and gq · max(hd, hdv) ≤ ATTN_QF (the Rust side's
// attention_group); keys of type KT and values of type VT (`KvPiece`).
#define AW 4
#define ATTN_PART (512 + 2)
#define ATTN_MAXG 4
// Floats of a block's query heads (and of one warp's sums): gq · hd.
#define ATTN_QF 1024
// The most splits of one query's context (the Rust side's ATTN_MAX_SPLITS).
#define ATTN_MAX_SPLITS 128

// Whether any key at positions lo .. hi may be visible to a query at qp:
// lets whole chunks be skipped without reading them.
__device__ __forceinline__ bool range_visible(int mask, int w, int qp, int lo, int hi) {
    switch (mask) {
        case MASK_CAUSAL: return lo <= qp;
        case MASK_SLIDING: return lo <= qp && qp - hi < w;
        case MASK_FULL: return true;
        default: return lo - qp <= w && qp - hi <= w;
    }
}

// Eight consecutive elements c .. c + 8 of a K/V row of type T as a lane
// holds them between loading and use: 16-bit types as the loaded 16 bytes
// (converted when used, so a chunk's loads fit in registers), the others
// as floats. Only elements below `lim` are read (the others are 0); `vec`
// where the row keeps 16-byte alignment.
template <int T, bool RAW = (T == T_F16 || T == T_BF16)>
struct KvPiece;

template <int T>
struct KvPiece<T, true> {
    uint4 raw;
    __device__ __forceinline__ void load(const void* base, size_t c, int lim, bool vec) {
        if (vec && lim >= 8) {
            raw = *(const uint4*)((const u16*)base + c);
            return;
        }
        u32 h[4] = {0, 0, 0, 0};
        #pragma unroll
        for (int e = 0; e < 8; e++)
            if (e < lim) h[e / 2] |= (u32)((const u16*)base)[c + e] << (16 * (e % 2));
        raw = make_uint4(h[0], h[1], h[2], h[3]);
    }
    __device__ __forceinline__ void get(float* v) const {
        u32 h[4] = {raw.x, raw.y, raw.z, raw.w};
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            u16 lo = (u16)(h[e] & 0xFFFF), hi = (u16)(h[e] >> 16);
            v[2 * e] = T == T_F16 ? h2f(lo) : bf2f(lo);
            v[2 * e + 1] = T == T_F16 ? h2f(hi) : bf2f(hi);
        }
    }
};

template <int T>
struct KvPiece<T, false> {
    float v8[8];
    __device__ __forceinline__ void load(const void* base, size_t c, int lim, bool vec) {
        if (vec && lim >= 8 && T == T_F32) {
            float4 a = *(const float4*)((const float*)base + c);
            float4 b = *((const float4*)((const float*)base + c) + 1);
            v8[0] = a.x, v8[1] = a.y, v8[2] = a.z, v8[3] = a.w;
            v8[4] = b.x, v8[5] = b.y, v8[6] = b.z, v8[7] = b.w;
            return;
        }
        if constexpr (T == T_F32) {
            #pragma unroll
            for (int e = 0; e < 8; e++) v8[e] = e < lim ? ((const float*)base)[c + e] : 0.0f;
        } else {
            // Rows are whole blocks, so a piece lies in one block, whole or
            // past the row's end.
            if (lim < 8) {
                #pragma unroll
                for (int e = 0; e < 8; e++) v8[e] = 0.0f;
                return;
            }
            const u8* b = (const u8*)base + (c >> 5) * (T == T_Q8_0 ? 34 : 18);
            int q[2];
            block_words<T, 2>(b, (int)(c & 31) >> 2, q);
            float d = h2f(*(const u16*)b);
            #pragma unroll
            for (int e = 0; e < 8; e++) {
                float code = (float)(int)(i8)(q[e >> 2] >> (8 * (e & 3)));
                v8[e] = T == T_Q4_0 ? d * code + -8.0f * d : d * code;
            }
        }
    }
    __device__ __forceinline__ void get(float* v) const {
        #pragma unroll
        for (int e = 0; e < 8; e++) v[e] = v8[e];
    }
};

// Rows a warp takes at once: eight where keys and values are 16-bit (a
// lane's share of a chunk is then 16 × 16 bytes of registers), four
// otherwise. A lane holds partial scores for every (row, head) pair.
template <int KT, int VT>
struct AttnShape {
    static constexpr bool narrow =
        (KT == T_F16 || KT == T_BF16) && (VT == T_F16 || VT == T_BF16);
    static constexpr int KPW = narrow ? 8 : 4;
    static constexpr int NV = KPW * ATTN_MAXG;
};

// Each of a lane's N values (N a power of two, 2 ≤ N ≤ 32) summed over the
// warp's 32 lanes, lane l getting the sum of value l % N: each exchange
// swaps half of the values still held, so the N sums take N − 1 shuffles
// (and one more per doubling from N to 32) where one sum at a time would
// take 5 N. The order of the additions is fixed.
// One exchange of warp_sums: the lanes whose bit N/2 is set keep values
// N/2 .. N of the N still held, the others values 0 .. N/2, each adding its
// partner's share; then the next exchange on the half kept. A template per
// exchange so that every index is a constant and x stays in registers.
template <int N>
struct WarpHalve {
    static __device__ __forceinline__ void run(float* x, int lane) {
        constexpr int n = N / 2;
        bool up = lane & n;
        #pragma unroll
        for (int i = 0; i < n; i++) {
            float send = up ? x[i] : x[i + n];
            float keep = up ? x[i + n] : x[i];
            x[i] = keep + __shfl_xor_sync(0xffffffff, send, n);
        }
        WarpHalve<n>::run(x, lane);
    }
};
template <>
struct WarpHalve<1> {
    static __device__ __forceinline__ void run(float*, int) {}
};

template <int N>
__device__ __forceinline__ float warp_sums(float* x, int lane) {
    WarpHalve<N>::run(x, lane);
    float s = x[0];
    #pragma unroll
    for (int o = N; o < 32; o <<= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    return s;
}

// Element i of attention's output: to out, as 8-bit blocks with qs
// (called by the 32 lanes of a warp for 32 consecutive elements), or as
// bf16 with ob (the next product's operand, as to_bf16 rounds it).
__device__ __forceinline__ void attention_store(float o, size_t i, float* out, i8* qs, u16* qd,
                                                u16* ob) {
    if (qs)
        q8_store(o, qs + i, qd + (i >> 5));
    else if (ob)
        ob[i] = (u16)f2bf(o);
    else
        out[i] = o;
}

// The `used` splits of heads oh0 .. oh0 + gq (rows of part, ATTN_PART floats
// a split) merged by the one block of 4 warps that finished last: each
// split's sum scaled from its own maximum to the largest, over the scaled
// totals, summed in split order (zeros where no split saw a key). The other
// splits wrote part from other multiprocessors, so it is read from L2.
__device__ void attention_merge(const float* part, float* out, i8* qs, u16* qd, u16* ob,
                                size_t oh0, int gq, int used, int hdv) {
    __shared__ float sw[ATTN_MAXG][ATTN_MAX_SPLITS];
    __shared__ float stotal[ATTN_MAXG];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int splits = gridDim.y;
    for (int h = warp; h < gq; h += AW) {
        const float* p = part + (oh0 + h) * splits * ATTN_PART;
        float big = NEG_INF;
        for (int s = lane; s < used; s += 32) big = fmaxf(big, __ldcg(p + s * ATTN_PART + 512));
        big = warp_max(big);
        float t = 0.0f;
        for (int s = lane; s < used; s += 32) {
            float m = __ldcg(p + s * ATTN_PART + 512);
            float w = m > NEG_INF ? expf(m - big) : 0.0f;
            sw[h][s] = w;
            t += w * __ldcg(p + s * ATTN_PART + 513);
        }
        t = warp_sum(t);
        if (lane == 0) stotal[h] = t;
    }
    __syncthreads();
    #pragma unroll
    for (int h = 0; h < ATTN_MAXG; h++) {
        if (h >= gq) break;
        const float* p = part + (oh0 + h) * splits * ATTN_PART;
        float total = stotal[h];
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            int c = threadIdx.x + 128 * j;
            if (c >= hdv) break;
            float o = 0.0f;
            for (int s = 0; s < used; s++) o += sw[h][s] * __ldcg(p + s * ATTN_PART + c);
            attention_store(total > 0.0f ? o / total : 0.0f, (oh0 + h) * hdv + c, out, qs, qd,
                            ob);
        }
    }
}

// Elements c .. c + 8 of a chunk's KPW rows into p: rows phys·BLOCK + r0
// .. of a K/V buffer of `width`-element rows (head g of hkv), rows past the
// run's end (at `rows`) read as its last (their weight is 0; their memory
// may hold anything).
template <int KPW, class Piece>
__device__ __forceinline__ void load_chunk(Piece* p, const void* base, int phys, int r0,
                                           int rows, int hkv, int g, int width, int c,
                                           bool vec) {
    #pragma unroll
    for (int t = 0; t < KPW; t++) {
        size_t r = ((size_t)phys * BLOCK + min(r0 + t, rows - 1)) * hkv + g;
        p[t].load(base, r * width + c, width - c, vec);
    }
}

template <int KT, int VT, class Keys>
__device__ void attention_body(const float* q, const void* kc, const void* vc, Keys keys,
                               float* out, i8* qs, u16* qd, u16* ob, float* part, int* done,
                               int hq,
                               int hkv, int hd, int hdv, int gq, float scale, float softcap,
                               int mask, int window) {
    constexpr int KPW = AttnShape<KT, VT>::KPW, NV = AttnShape<KT, VT>::NV;
    constexpr int CPB = BLOCK / KPW;
    __shared__ __align__(16) float sq[ATTN_QF];
    __shared__ __align__(16) float sp[AW][NV];
    __shared__ __align__(16) float sa[AW][ATTN_MAXG];
    __shared__ float swm[AW][ATTN_MAXG], swl[AW][ATTN_MAXG];
    __shared__ float sacc[AW][ATTN_QF];
    int per = hq / gq;
    int qi = blockIdx.x / per, h0 = (blockIdx.x % per) * gq;
    int g = h0 / (hq / hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qp, end, e0, e_end;
    keys.query(qi, &qp, &end, &e0, &e_end);
    int qspan = keys.query_span(qi);
    // Splits past the last with keys return at once, uncounted; with one
    // split that has keys, it writes the output as an unsplit block does.
    int used = 1;
    if (gridDim.y > 1) {
        int listed = e_end - e0;
        int share = (listed + gridDim.y - 1) / gridDim.y;
        used = share > 0 ? (listed + share - 1) / share : 1;
        if ((int)blockIdx.y >= used) return;
        e0 += blockIdx.y * share;
        e_end = min(e_end, e0 + share);
    }
    bool merged = used > 1;
    // Row pieces a lane holds: one for rows of up to 256 elements, two up
    // to 512. A warp's sums, slot s: head s / nc, piece s % nc.
    int nc = max(hd, hdv) > 256 ? 2 : 1;
    // After the lane sums, lane l holds the score of the chunk's row
    // (l % NV) / ATTN_MAXG for head l % ATTN_MAXG, and keeps that head's
    // running maximum and total.
    int pv = lane % NV, pt = pv / ATTN_MAXG, ph = pv % ATTN_MAXG;
    // The key lists come from the step's metadata, which no kernel writes:
    // they are read before waiting for the kernel before, which wrote q and
    // this step's K/V rows, the warp's first chunk's block entry included.
    int ch0 = e0 * CPB + warp, phys0 = 0, lo0 = 0;
    if (ch0 < e_end * CPB) keys.block(ch0 / CPB, &phys0, &lo0);
    pdl_begin();
    const float* qr = q + ((size_t)qi * hq + h0) * hd;
    // Zeros past the heads: a lane's piece may run past a row's end.
    for (int i = threadIdx.x; i < ATTN_QF; i += blockDim.x) sq[i] = i < gq * hd ? qr[i] : 0.0f;
    float m_run = NEG_INF, l_run = 0.0f;
    float acc[ATTN_MAXG][8];
    #pragma unroll
    for (int s = 0; s < ATTN_MAXG; s++)
        #pragma unroll
        for (int e = 0; e < 8; e++) acc[s][e] = 0.0f;
    bool kvec = hd % 8 == 0, vvec = hdv % 8 == 0;
    __syncthreads();
    for (int ch = e0 * CPB + warp; ch < e_end * CPB; ch += AW) {
        int e = ch / CPB, r0 = (ch % CPB) * KPW;
        int phys = phys0, lo = lo0;
        if (ch != ch0) keys.block(e, &phys, &lo);
        // A query in a span may see any block's keys of its span.
        if (lo + r0 >= end ||
            (qspan == 0 && !range_visible(mask, window, qp, lo + r0, lo + r0 + KPW - 1)))
            continue;
        int rows = min(BLOCK, end - lo);
        KvPiece<KT> kp[KPW];
        KvPiece<VT> vp[KPW];
        load_chunk<KPW>(kp, kc, phys, r0, rows, hkv, g, hd, 8 * lane, kvec);
        load_chunk<KPW>(vp, vc, phys, r0, rows, hkv, g, hdv, 8 * lane, vvec);
        float x[NV];
        #pragma unroll
        for (int i = 0; i < NV; i++) x[i] = 0.0f;
        for (int j = 0; j < nc; j++) {
            int c = 8 * (lane + 32 * j);
            if (j > 0) load_chunk<KPW>(kp, kc, phys, r0, rows, hkv, g, hd, c, kvec);
            if (c >= hd) continue;
            #pragma unroll
            for (int t = 0; t < KPW; t++) {
                float k8[8];
                kp[t].get(k8);
                #pragma unroll
                for (int h = 0; h < ATTN_MAXG; h++) {
                    if (h >= gq) break;
                    const float4* qv = (const float4*)(sq + h * hd + c);
                    if (kvec) {
                        float4 a = qv[0], b = qv[1];
                        x[t * ATTN_MAXG + h] += a.x * k8[0] + a.y * k8[1] + a.z * k8[2] +
                                                a.w * k8[3] + b.x * k8[4] + b.y * k8[5] +
                                                b.z * k8[6] + b.w * k8[7];
                    } else {
                        #pragma unroll
                        for (int y = 0; y < 8; y++)
                            x[t * ATTN_MAXG + h] += sq[h * hd + c + y] * k8[y];
                    }
                }
            }
        }
        float sc = warp_sums<NV>(x, lane) * scale;
        if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
        int i = r0 + pt;
        bool seen = ph < gq && i < rows &&
                    (visible(mask, window, qp, lo + i) ||
                     (qspan != 0 && keys.key_span(e, i) == qspan));
        sc = seen ? sc : NEG_INF;
        // One online-softmax step for the lane's head over the chunk's rows.
        float mx = sc;
        #pragma unroll
        for (int o = ATTN_MAXG; o < NV; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
        float m_new = fmaxf(m_run, mx);
        float p = m_new == NEG_INF ? 0.0f : expf(sc - m_new);
        float alpha = m_new == NEG_INF ? 1.0f : expf(m_run - m_new);
        float ps = p;
        #pragma unroll
        for (int o = ATTN_MAXG; o < NV; o <<= 1) ps += __shfl_xor_sync(0xffffffff, ps, o);
        l_run = l_run * alpha + ps;
        m_run = m_new;
        // Every lane needs every (row, head) weight: through shared memory,
        // a row's heads as one 16-byte read.
        if (lane < NV) sp[warp][lane] = p;
        if (lane < ATTN_MAXG) sa[warp][lane] = alpha;
        __syncwarp();
        float4 al = *(const float4*)sa[warp];
        float a4[4] = {al.x, al.y, al.z, al.w};
        #pragma unroll
        for (int s = 0; s < ATTN_MAXG; s++) {
            float a = nc == 1 ? a4[s] : a4[s / 2];
            #pragma unroll
            for (int y = 0; y < 8; y++) acc[s][y] *= a;
        }
        for (int j = 0; j < nc; j++) {
            int c = 8 * (lane + 32 * j);
            if (j > 0) load_chunk<KPW>(vp, vc, phys, r0, rows, hkv, g, hdv, c, vvec);
            if (c >= hdv) continue;
            #pragma unroll
            for (int t = 0; t < KPW; t++) {
                float v8[8];
                vp[t].get(v8);
                float4 w = *(const float4*)(sp[warp] + t * ATTN_MAXG);
                float w4[4] = {w.x, w.y, w.z, w.w};
                #pragma unroll
                for (int s = 0; s < ATTN_MAXG; s++) {
                    if (nc == 2 && s % 2 != j) continue;
                    float pw = nc == 1 ? w4[s] : w4[s / 2];
                    #pragma unroll
                    for (int y = 0; y < 8; y++) acc[s][y] += pw * v8[y];
                }
            }
        }
        // The next chunk's weights overwrite these.
        __syncwarp();
    }
    // The warps' results merged in warp order: thread x takes columns
    // x + 128 j of each head.
    if (lane < ATTN_MAXG) {
        swm[warp][lane] = m_run;
        swl[warp][lane] = l_run;
    }
    #pragma unroll
    for (int s = 0; s < ATTN_MAXG; s++) {
        int h = s / nc, c = 8 * (lane + 32 * (s % nc));
        if (h >= gq || c >= hdv) continue;
        #pragma unroll
        for (int y = 0; y < 8; y++)
            if (c + y < hdv) sacc[warp][h * hdv + c + y] = acc[s][y];
    }
    __syncthreads();
    #pragma unroll
    for (int h = 0; h < ATTN_MAXG; h++) {
        if (h >= gq) break;
        float big = NEG_INF;
        #pragma unroll
        for (int w = 0; w < AW; w++) big = fmaxf(big, swm[w][h]);
        float ww[AW], total = 0.0f;
        #pragma unroll
        for (int w = 0; w < AW; w++) {
            ww[w] = swm[w][h] > NEG_INF ? expf(swm[w][h] - big) : 0.0f;
            total += ww[w] * swl[w][h];
        }
        size_t oh = (size_t)qi * hq + h0 + h;
        float* prow = merged ? part + (oh * gridDim.y + blockIdx.y) * ATTN_PART : nullptr;
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            int c = threadIdx.x + 128 * j;
            if (c >= hdv) break;
            float o = 0.0f;
            #pragma unroll
            for (int w = 0; w < AW; w++) o += ww[w] * sacc[w][h * hdv + c];
            if (merged)
                prow[c] = o;
            else
                attention_store(total > 0.0f ? o / total : 0.0f, oh * hdv + c, out, qs, qd, ob);
        }
        if (merged && threadIdx.x == 0) {
            prow[512] = big;
            prow[513] = total;
        }
    }
    if (!merged) return;
    // This split's sums are out; a count of the splits done, and the last
    // to finish merges them all.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(done + blockIdx.x, 1) == used - 1;
        // Ready for the next launch: every split of this one has counted.
        if (last) done[blockIdx.x] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    attention_merge(part, out, qs, qd, ob, (size_t)qi * hq + h0, gq, used, hdv);
}

// attention_<k>_<v>: the paged pool, one kernel per pair of key and value
// types.
#define ATTN_KV(KS, KT, VS, VT)                                                                  \
    extern "C" __global__ void attention_##KS##_##VS(                                            \
        const float* q, const void* kc, const void* vc, const int* qpos, const int* run_of_row, \
        const int* run_end, const int* block_start, const int* table, const int* qspan,         \
        const int* tspan, float* out, i8* qs, u16* qd, u16* ob, float* part, int* done, int hq, \
        int hkv, int hd, int hdv, int gq, float scale, float softcap, int mask, int window) {   \
        PagedKeys keys = {qpos, run_of_row, run_end, block_start, table, qspan, tspan};        \
        attention_body<KT, VT>(q, kc, vc, keys, out, qs, qd, ob, part, done, hq, hkv, hd, hdv,  \
                               gq, scale, softcap, mask, window);                               \
    }
#define ATTN_K(KS, KT)                  \
    ATTN_KV(KS, KT, f32, T_F32)         \
    ATTN_KV(KS, KT, f16, T_F16)         \
    ATTN_KV(KS, KT, bf16, T_BF16)       \
    ATTN_KV(KS, KT, q8_0, T_Q8_0)       \
    ATTN_KV(KS, KT, q4_0, T_Q4_0)
ATTN_K(f32, T_F32)
ATTN_K(f16, T_F16)
ATTN_K(bf16, T_BF16)
ATTN_K(q8_0, T_Q8_0)
ATTN_K(q4_0, T_Q4_0)

// K/V from inputs: k [m, hkv, hd] and v [m, hkv, hdv] of this step, f32.
extern "C" __global__ void attention_inputs(const float* q, const float* k, const float* v,
                                            int m, int n, float* out, i8* qs, u16* qd,
                                            u16* ob, int hq, int hkv, int hd, int hdv, int gq,
                                            float scale, float softcap, int mask, int window) {
    DenseKeys keys = {m, n};
    attention_body<T_F32, T_F32>(q, k, v, keys, out, qs, qd, ob, nullptr, nullptr, hq, hkv, hd,
                                 hdv, gq, scale, softcap, mask, window);
}

// Sum of v over the block (all threads get it), in f64 as the CPU sums
// row statistics; `part` is 32 doubles of shared memory.
__device__ __forceinline__ double block_sum(double v, double* part) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    __syncthreads();  // `part` may still be read from a previous sum
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += part[w];
    return t;
}

// Per row of d (one block): x · rms(target) / sqrt(max(mean(x²), floor)).
extern "C" __global__ void match_rms(const float* x, const float* target, float* y, int d,
                                     float floor) {
    pdl_begin();
    __shared__ double part[32];
    const float* xr = x + (size_t)blockIdx.x * d;
    const float* tr = target + (size_t)blockIdx.x * d;
    double sx = 0.0, st = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        sx += (double)xr[i] * (double)xr[i];
        st += (double)tr[i] * (double)tr[i];
    }
    sx = block_sum(sx, part);
    st = block_sum(st, part);
    float want = sqrtf((float)(st / d));
    float have = sqrtf(fmaxf((float)(sx / d), floor));
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        y[(size_t)blockIdx.x * d + i] = __fmul_rn(xr[i], want) / have;
}

// Per row of d (one block): relu(x − (mean + k · std)), population std.
extern "C" __global__ void gaussian_topk(const float* x, float* y, int d, float k) {
    pdl_begin();
    __shared__ double part[32];
    const float* xr = x + (size_t)blockIdx.x * d;
    double s = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += (double)xr[i];
    float mean = (float)(block_sum(s, part) / d);
    double v = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        double c = (double)xr[i] - (double)mean;
        v += c * c;
    }
    float sd = (float)sqrt(block_sum(v, part) / d);
    float cutoff = __fadd_rn(mean, __fmul_rn(sd, k));
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        y[(size_t)blockIdx.x * d + i] = fmaxf(xr[i] - cutoff, 0.0f);
}

// out[t] = a[t] · b[t] for a [n, p, q], b [n, q, r]; one thread per output.
extern "C" __global__ void batch_matmul(const float* a, const float* b, float* out, long long n,
                                        int p, int q, int r) {
    pdl_begin();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * p * r) return;
    int j = (int)(idx % r);
    long long ti = idx / r;
    int i = (int)(ti % p);
    long long t = ti / p;
    const float* ar = a + (t * p + i) * q;
    const float* bc = b + t * q * r + j;
    float acc = 0.0f;
    for (int c = 0; c < q; c++) acc = __fadd_rn(acc, __fmul_rn(ar[c], bc[(size_t)c * r]));
    out[idx] = acc;
}

// Mixture of experts. A step's tokens each choose top_k experts; choice j of
// token t is slot t·top_k + j. `moe_route` picks the experts and weights,
// `moe_lists` lists each expert's slots, `moe_rows_<type>` multiplies each
// chosen expert's rows by the activations of its slots (the gate/up rows,
// then, after `moe_geglu`, the down rows), and `moe_combine` adds each
// token's weighted expert outputs.

// Per token t (one thread): softmax of logits[t] over E experts, the top_k
// largest (ties to the lower index), their probabilities renormalised over
// the chosen times scale[e].
extern "C" __global__ void moe_route(const float* logits, const float* scale, int* sel,
                                     float* wts, int n, int E, int top_k) {
    pdl_begin();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float* l = logits + (size_t)t * E;
    float mx = NEG_INF;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(l[e] - mx);
    int* st = sel + (size_t)t * top_k;
    float* wt = wts + (size_t)t * top_k;
    float chosen = 0.0f;
    for (int j = 0; j < top_k; j++) {
        int best = -1;
        float bp = -1.0f;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= st[i] == e;
            float p = expf(l[e] - mx) / sum;
            if (!taken && p > bp) {
                bp = p;
                best = e;
            }
        }
        st[j] = best;
        wt[j] = bp;
        chosen += bp;
    }
    for (int j = 0; j < top_k; j++) wt[j] = wt[j] / chosen * scale[st[j]];
}

// Per expert e (one thread): the slots routed to it, in slot order, at
// list[e·cap ..], and how many.
extern "C" __global__ void moe_lists(const int* sel, int slots, int E, int cap, int* list,
                                     int* count) {
    pdl_begin();
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    int c = 0;
    for (int s = 0; s < slots; s++)
        if (sel[s] == e) list[(size_t)e * cap + c++] = s;
    count[e] = c;
}

// Expert e = blockIdx.y, a warp per row r of its n rows (w_e starts e·n rows
// into w): y[slot·n + r] = w_e[r] · x[slot / x_div] for every slot listed
// for e, TM slots at a time, so a chosen expert's rows are read from memory
// once per step and the others not at all.
template <int T>
__device__ void moe_rows_body(const u8* __restrict__ w, const float* __restrict__ x,
                              float* __restrict__ y, const int* list, const int* count,
                              int cap, int n, int k, int x_div) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int e = blockIdx.y;
    int r = blockIdx.x * (blockDim.x >> 5) + warp;
    int c = count[e];
    if (r >= n || c == 0) return;
    const u8* row = w + ((size_t)e * n + r) * row_size(T, k);
    const int* slots = list + (size_t)e * cap;
    for (int s0 = 0; s0 < c; s0 += TM) {
        int mt = min(TM, c - s0);
        const float* xs[TM];
        #pragma unroll
        for (int t = 0; t < TM; t++) xs[t] = x + (size_t)(slots[s0 + min(t, mt - 1)] / x_div) * k;
        float acc[TM];
        row_dots<T>(row, xs, mt, k, acc);
        #pragma unroll
        for (int t = 0; t < TM; t++)
            if (lane == 0 && t < mt) y[(size_t)slots[s0 + t] * n + r] = acc[t];
    }
}

#define MOE_ROWS(SUF, T)                                                                  \
    extern "C" __global__ void moe_rows_##SUF(const u8* w, const float* x, float* y,      \
                                              const int* list, const int* count, int cap, \
                                              int n, int k, int x_div) {                  \
        pdl_begin();                                                                      \
        moe_rows_body<T>(w, x, y, list, count, cap, n, k, x_div);                         \
    }
FOR_EACH_TYPE(MOE_ROWS)

// a[s, i] = gelu(h[s, i]) · h[s, ff + i] for the slots' gate/up rows h [slots, 2·ff].
extern "C" __global__ void moe_geglu(const float* h, float* a, long long slots, int ff) {
    pdl_begin();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= slots * ff) return;
    long long s = idx / ff;
    int i = (int)(idx % ff);
    a[idx] = gelu(h[s * 2 * ff + i]) * h[s * 2 * ff + ff + i];
}

// out[t, c] = Σ_j wts[t, j] · y[t·top_k + j, c], the chosen experts added in
// ascending expert order (as the CPU adds them).
extern "C" __global__ void moe_combine(const float* y, const int* sel, const float* wts,
                                       float* out, int n, int d, int top_k) {
    pdl_begin();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * d) return;
    int t = (int)(idx / d), c = (int)(idx % d);
    const int* st = sel + (size_t)t * top_k;
    float acc = 0.0f;
    int last = -1;
    for (int j = 0; j < top_k; j++) {
        int bj = -1;
        for (int i = 0; i < top_k; i++)
            if (st[i] > last && (bj < 0 || st[i] < st[bj])) bj = i;
        if (bj < 0) break;  // no expert chosen (NaN logits)
        last = st[bj];
        acc = __fadd_rn(acc, __fmul_rn(wts[(size_t)t * top_k + bj],
                                       y[((size_t)t * top_k + bj) * d + c]));
    }
    out[idx] = acc;
}

// y [m, width] = rows rows[i] of x [n, width] (checked < n on the host).
extern "C" __global__ void take_rows(const float* x, const int* rows, float* y, long long m,
                                     long long width) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * width) return;
    long long r = i / width, c = i % width;
    y[i] = x[(long long)rows[r] * width + c];
}

// y [outer, len] = x [outer, x_len] columns start .. start+len.
extern "C" __global__ void narrow(const float* x, float* y, long long outer, long long x_len,
                                  long long start, long long len, long long inner) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outer * len * inner) return;
    long long o = i / (len * inner), r = i % (len * inner);
    y[i] = x[o * x_len * inner + start * inner + r];
}

// One part of a concatenation: y [outer, y_len, inner] gets x [outer, len,
// inner] at rows off .. off + len of its middle axis.
extern "C" __global__ void concat_part(const float* x, float* y, long long outer, long long len,
                                       long long y_len, long long off, long long inner) {
    pdl_begin();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= outer * len * inner) return;
    long long o = i / (len * inner), r = i % (len * inner);
    y[o * y_len * inner + off * inner + r] = x[i];
}

// ---------------------------------------------------------------------------
// Logit rows reduced on the device (see rlx-runtime's `reduce` module). A row
// is cut into `splits` slices, one block each (`reduce_part`), so that even
// one row fills the GPU; each warp walks a share of its slice 256 tokens at a
// time (eight coalesced loads in flight a lane), applies the row's logit
// changes (sorted by token, so a warp-uniform pointer meets them in order)
// with the sampler's f64 arithmetic, counts live tokens, keeps an online max
// and Σ exp, and keeps its best candidates: tokens better than its current
// last one wait in a pending area and join by a sort of 128 entries when it
// fills. A draw (`reduce_draw`) is an exponential race, one pass: token i
// wins with probability w_i / Σ w, w_i = exp((v_i − max) / T), by the least
// log(E_i) − (v_i − max) / T, E_i = −ln U_i, U_i hashed from the row's seed
// and i. `reduce_merge` puts a row's slices together.

#define RD_THREADS 256
#define RD_WARPS (RD_THREADS / 32)
#define RD_TOP 64
#define RD_NONE 0xffffffffu
// Tokens a warp takes a step: eight a lane.
#define RD_STEP 256

struct RdReq {  // 72 bytes, as the host writes it
    double repeat, frequency, presence;
    double inv_temp;  // 1 / temperature (0: no draw)
    double ln_min_p;
    double u;         // the draw's seed: u × 2^53
    u32 adj_start, adj_len, top;
    // A constraint's mask: whether there is one, and its words, counted in
    // u32s from the start of the changes.
    u32 masked, mask_at, mask_len;
};

struct RdAdj {  // 16 bytes
    double bias;
    u32 token, count;
};

// One slice's results (RD_PART_BYTES).
struct RdPart {
    double v[RD_TOP];
    u32 id[RD_TOP];
    double m, s;
    u32 live, invalid;
    float key;  // the draw's least key in the slice, and its token
    u32 drawn;
};

// Output per row (RD_OUT_BYTES): sum_exp (f64), then u32 live, drawn,
// invalid token, invalid value bits, listed; then RD_TOP f64 values and
// RD_TOP u32 tokens.
#define RD_OUT_BYTES (8 + 5 * 4 + 4 + RD_TOP * 8 + RD_TOP * 4)

__device__ __forceinline__ bool rd_better(double av, u32 ai, double bv, u32 bi) {
    return av > bv || (av == bv && ai < bi);
}

// Bitonic sort of n (a power of two) entries, better first, by `threads`
// threads from `t`: the whole block (WHOLE) or one warp. Not inlined, so
// that the loops that call it unroll into registers.
template <bool WHOLE>
__device__ __noinline__ void rd_sort(double* v, u32* id, int n, int t, int threads) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int a = t; a < n; a += threads) {
                int b = a ^ j;
                if (b > a) {
                    double x = v[a], y = v[b];
                    u32 ix = id[a], iy = id[b];
                    bool first = (a & k) == 0;
                    if (first ? rd_better(y, iy, x, ix) : rd_better(x, ix, y, iy)) {
                        v[a] = y;
                        v[b] = x;
                        id[a] = iy;
                        id[b] = ix;
                    }
                }
            }
            if (WHOLE) __syncthreads(); else __syncwarp();
        }
    }
}

// The sampler's adjustment of one change, in correctly rounded f64.
__device__ __forceinline__ double rd_apply(double v, const RdAdj& a, const RdReq& r) {
    v = __dadd_rn(v, a.bias);
    if (a.count > 0) {
        v = v > 0.0 ? __ddiv_rn(v, r.repeat) : __dmul_rn(v, r.repeat);
        v = __dsub_rn(v, __dadd_rn(__dmul_rn((double)a.count, r.frequency), r.presence));
    }
    return v;
}

// First change at or after token t (binary search, warp-uniform).
__device__ __forceinline__ u32 rd_first(const RdAdj* adj, u32 n, u32 t) {
    u32 lo = 0, hi = n;
    while (lo < hi) {
        u32 mid = (lo + hi) / 2;
        if (adj[mid].token < t) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Raw values of tokens base + lane + 32c (c < 8) below `end` (others
// −inf): eight loads in flight.
__device__ __forceinline__ void rd_load(const float* __restrict__ x, int base, int end, int lane,
                                        float* raw) {
    #pragma unroll
    for (int c = 0; c < 8; c++) {
        const int i = base + lane + 32 * c;
        raw[c] = i < end ? x[i] : NEG_INF;
    }
}

// Token i's adjusted logit, its raw value `raw`; the warp steps through the
// changes below `until` (the end of this 32-token part) with *p, so every
// lane sees every change once and in order.
__device__ __forceinline__ double rd_adjust(float raw, int i, int until,
                                            const RdAdj* __restrict__ adj, u32 n, u32* p,
                                            const RdReq& r, const u32* __restrict__ mask) {
    double v = __dadd_rn((double)raw, 0.0);
    // A token the constraint rules out is banned before any change.
    if (mask && ((u32)i / 32 >= r.mask_len || !((mask[i / 32] >> (i % 32)) & 1u)))
        v = NEG_INF;
    while (*p < n && adj[*p].token < (u32)until) {
        if (adj[*p].token == (u32)i) v = rd_apply(v, adj[*p], r);
        (*p)++;
    }
    return v;
}

// A slice [lo, hi) of `splits` over V, and a warp's share of it, in whole steps.
__device__ __forceinline__ void rd_share(long long V, int splits, int split, int w, int* lo,
                                         int* hi) {
    const long long steps = (V + RD_STEP - 1) / RD_STEP;
    const long long per = (steps + splits - 1) / splits;
    const long long s0 = min(steps, per * split), s1 = min(steps, s0 + per);
    const long long wper = (s1 - s0 + RD_WARPS - 1) / RD_WARPS;
    const long long w0 = min(s1, s0 + wper * w), w1 = min(s1, w0 + wper);
    *lo = (int)(w0 * RD_STEP);
    *hi = (int)min(V, w1 * RD_STEP);
}

// The uniform in (0, 1) of token i under a row's seed (splitmix64's mix).
__device__ __forceinline__ float rd_uniform(unsigned long long seed, u32 i) {
    unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

extern "C" __global__ void __launch_bounds__(RD_THREADS)
reduce_part(const float* __restrict__ logits, long long V, const RdReq* __restrict__ reqs,
            const RdAdj* __restrict__ adj_all, RdPart* __restrict__ parts, int splits) {
    pdl_begin();
    __shared__ double sv[RD_WARPS][128];
    __shared__ u32 si[RD_WARPS][128];
    __shared__ double wm[RD_WARPS], ws[RD_WARPS];
    __shared__ u32 wlive[RD_WARPS];
    __shared__ u32 s_invalid;
    const int row = blockIdx.x, split = blockIdx.y;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RdReq r = reqs[row];
    const RdAdj* adj = adj_all + r.adj_start;
    const u32* mask = r.masked ? (const u32*)adj_all + r.mask_at : nullptr;
    const float* x = logits + (long long)row * V;
    const int N = r.top;
    if (threadIdx.x == 0) s_invalid = RD_NONE;
    int lo, hi;
    rd_share(V, splits, split, w, &lo, &hi);
    double* bv = sv[w];
    u32* bi = si[w];
    for (int t = lane; t < 128; t += 32) {
        bv[t] = NEG_INF;
        bi[t] = RD_NONE;
    }
    __syncthreads();
    int nb = 0, np = 0;  // listed (sorted, at 0..) and pending (at 64..)
    double m = NEG_INF, s = 0.0, best_v = NEG_INF;
    u32 live = 0, best_i = RD_NONE;
    u32 p = rd_first(adj, r.adj_len, (u32)lo);
    for (int base = lo; base < hi; base += RD_STEP) {
        float raw[8];
        rd_load(x, base, hi, lane, raw);
        #pragma unroll
        for (int c = 0; c < 8; c++) {
            const int i = base + lane + 32 * c;
            const double vc =
                rd_adjust(raw[c], i, base + 32 * (c + 1), adj, r.adj_len, &p, r, mask);
            if (i < hi && (isnan(raw[c]) || raw[c] == __int_as_float(0x7f800000)))
                atomicMin(&s_invalid, (u32)i);
            const bool ok = i < hi && vc != (double)NEG_INF && !isnan(vc);
            if (ok) {
                live++;
                if (vc > m) {
                    s = (m == (double)NEG_INF ? 0.0 : s * (double)__expf((float)(m - vc))) + 1.0;
                    m = vc;
                } else {
                    s += (double)__expf((float)(vc - m));
                }
            }
            if (N == 1) {
                // Greedy: each lane keeps its best; no lists.
                if (ok && rd_better(vc, (u32)i, best_v, best_i)) {
                    best_v = vc;
                    best_i = (u32)i;
                }
                continue;
            }
            const bool better = ok && (nb < N || rd_better(vc, (u32)i, bv[N - 1], bi[N - 1]));
            const unsigned mask = __ballot_sync(0xffffffff, better);
            if (mask == 0) continue;
            const int n = __popc(mask);
            if (np + n > 64) {
                rd_sort<false>(bv, bi, 128, lane, 32);
                nb = min(N, nb + np);
                for (int t = nb + lane; t < 128; t += 32) {
                    bv[t] = NEG_INF;
                    bi[t] = RD_NONE;
                }
                __syncwarp();
                np = 0;
            }
            if (better) {
                const int at = 64 + np + __popc(mask & ((1u << lane) - 1));
                bv[at] = vc;
                bi[at] = (u32)i;
            }
            np += n;
            __syncwarp();
        }
    }
    if (np > 0) {
        rd_sort<false>(bv, bi, 128, lane, 32);
        nb = min(N, nb + np);
    }
    if (N == 1) {
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const double v2 = __shfl_xor_sync(0xffffffff, best_v, o);
            const u32 i2 = __shfl_xor_sync(0xffffffff, best_i, o);
            if (rd_better(v2, i2, best_v, best_i)) {
                best_v = v2;
                best_i = i2;
            }
        }
        nb = best_i != RD_NONE;
        if (lane == 0) {
            bv[0] = best_v;
            bi[0] = best_i;
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        live += __shfl_xor_sync(0xffffffff, live, o);
        const double m2 = __shfl_xor_sync(0xffffffff, m, o);
        const double s2 = __shfl_xor_sync(0xffffffff, s, o);
        const double mm = fmax(m, m2);
        if (mm != (double)NEG_INF) {
            s = (m == (double)NEG_INF ? 0.0 : s * (double)__expf((float)(m - mm))) +
                (m2 == (double)NEG_INF ? 0.0 : s2 * (double)__expf((float)(m2 - mm)));
        }
        m = mm;
    }
    if (lane == 0) {
        wm[w] = m;
        ws[w] = s;
        wlive[w] = live;
    }
    // Each warp's first 64 entries, side by side, sorted by the block.
    __syncwarp();
    double keep_v[2];
    u32 keep_i[2];
    for (int k = 0; k < 2; k++) {
        const int t = lane + 32 * k;
        keep_v[k] = t < nb ? bv[t] : (double)NEG_INF;
        keep_i[k] = t < nb ? bi[t] : RD_NONE;
    }
    __syncthreads();
    double* all_v = &sv[0][0];
    u32* all_i = &si[0][0];
    for (int k = 0; k < 2; k++) {
        all_v[w * 64 + lane + 32 * k] = keep_v[k];
        all_i[w * 64 + lane + 32 * k] = keep_i[k];
    }
    __syncthreads();
    if (N == 1) {
        if (threadIdx.x == 0)
            for (int k = 1; k < RD_WARPS; k++)
                if (rd_better(all_v[k * 64], all_i[k * 64], all_v[0], all_i[0])) {
                    all_v[0] = all_v[k * 64];
                    all_i[0] = all_i[k * 64];
                }
        __syncthreads();
    } else {
        rd_sort<true>(all_v, all_i, RD_WARPS * 64, threadIdx.x, RD_THREADS);
    }
    RdPart* out = parts + (size_t)row * gridDim.y + split;
    for (int t = threadIdx.x; t < RD_TOP; t += RD_THREADS) {
        out->v[t] = t < N ? all_v[t] : (double)NEG_INF;
        out->id[t] = t < N ? all_i[t] : RD_NONE;
    }
    if (threadIdx.x == 0) {
        double M = NEG_INF, S = 0.0;
        u32 L = 0;
        for (int k = 0; k < RD_WARPS; k++) {
            M = fmax(M, wm[k]);
            L += wlive[k];
        }
        for (int k = 0; k < RD_WARPS; k++)
            if (wm[k] != (double)NEG_INF) S += ws[k] * (double)__expf((float)(wm[k] - M));
        out->m = M;
        out->s = S;
        out->live = L;
        out->invalid = s_invalid;
        out->key = __int_as_float(0x7f800000);
        out->drawn = RD_NONE;
    }
}

// The draw's race over one slice, for rows that ask for a draw; after
// reduce_part (the row's max comes from its slices).
extern "C" __global__ void __launch_bounds__(RD_THREADS)
reduce_draw(const float* __restrict__ logits, long long V, const RdReq* __restrict__ reqs,
            const RdAdj* __restrict__ adj_all, RdPart* __restrict__ parts, int splits) {
    pdl_begin();
    __shared__ float wk[RD_WARPS];
    __shared__ u32 wi[RD_WARPS];
    const int row = blockIdx.x, split = blockIdx.y;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const RdReq r = reqs[row];
    if (r.inv_temp == 0.0) return;
    __shared__ double s_m;
    const RdPart* mine = parts + (size_t)row * gridDim.y;
    if (w == 0) {
        // The row's max over its slices, read in parallel.
        double M = lane < splits ? mine[lane].m : (double)NEG_INF;
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmax(M, __shfl_xor_sync(0xffffffff, M, o));
        if (lane == 0) s_m = M;
    }
    __syncthreads();
    const double M = s_m;
    if (M == (double)NEG_INF) return;
    const double floor_v = __dadd_rn(M, r.ln_min_p);
    const unsigned long long seed = (unsigned long long)(r.u * 9007199254740992.0);
    const RdAdj* adj = adj_all + r.adj_start;
    const u32* mask = r.masked ? (const u32*)adj_all + r.mask_at : nullptr;
    const float* x = logits + (long long)row * V;
    int lo, hi;
    rd_share(V, splits, split, w, &lo, &hi);
    float best = __int_as_float(0x7f800000);
    u32 best_i = RD_NONE;
    u32 p = rd_first(adj, r.adj_len, (u32)lo);
    for (int base = lo; base < hi; base += RD_STEP) {
        float raw[8];
        rd_load(x, base, hi, lane, raw);
        #pragma unroll
        for (int c = 0; c < 8; c++) {
            const u32 i = (u32)(base + lane + 32 * c);
            const double vc =
                rd_adjust(raw[c], (int)i, base + 32 * (c + 1), adj, r.adj_len, &p, r, mask);
            if ((int)i < hi && vc != (double)NEG_INF && vc >= floor_v) {
                const float e = -logf(rd_uniform(seed, i));
                const float key = logf(e) - (float)((vc - M) * r.inv_temp);
                if (key < best || (key == best && i < best_i)) {
                    best = key;
                    best_i = i;
                }
            }
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float k2 = __shfl_xor_sync(0xffffffff, best, o);
        const u32 i2 = __shfl_xor_sync(0xffffffff, best_i, o);
        if (k2 < best || (k2 == best && i2 < best_i)) {
            best = k2;
            best_i = i2;
        }
    }
    if (lane == 0) {
        wk[w] = best;
        wi[w] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < RD_WARPS; k++)
            if (wk[k] < best || (wk[k] == best && wi[k] < best_i)) {
                best = wk[k];
                best_i = wi[k];
            }
        RdPart* out = parts + (size_t)row * gridDim.y + split;
        out->key = best;
        out->drawn = best_i;
    }
}

// A row's slices put together: its digest in the RD_OUT layout. One block
// of RD_THREADS per row; `splits` × RD_TOP entries sorted once.
extern "C" __global__ void __launch_bounds__(RD_THREADS)
reduce_merge(const float* __restrict__ logits, long long V, const RdPart* __restrict__ parts,
             int splits, const RdReq* __restrict__ reqs, u8* __restrict__ out) {
    pdl_begin();
    __shared__ double v[32 * RD_TOP];
    __shared__ u32 id[32 * RD_TOP];
    const int row = blockIdx.x;
    const RdPart* mine = parts + (size_t)row * splits;
    const int N = reqs[row].top;
    // Entries: each slice's first N, padded to a power of two.
    int n = 1;
    while (n < splits * N) n <<= 1;
    for (int t = threadIdx.x; t < n; t += RD_THREADS) {
        const int k = t / N, j = t % N;
        const bool in = k < splits;
        v[t] = in ? mine[k].v[j] : (double)NEG_INF;
        id[t] = in ? mine[k].id[j] : RD_NONE;
    }
    __syncthreads();
    rd_sort<true>(v, id, n, threadIdx.x, RD_THREADS);
    u8* o = out + (size_t)row * RD_OUT_BYTES;
    // The slices' scalars, one lane a slice (splits <= 32), combined by
    // shuffles: loads in parallel, not one after another.
    __shared__ double s_S;
    __shared__ u32 s_L, s_bad, s_drawn;
    if (threadIdx.x < 32) {
        const int k = threadIdx.x;
        const bool in = k < splits;
        double m = in ? mine[k].m : (double)NEG_INF, sum = in ? mine[k].s : 0.0;
        u32 live = in ? mine[k].live : 0, bad = in ? mine[k].invalid : RD_NONE;
        u32 drawn = in ? mine[k].drawn : RD_NONE;
        float key = in && drawn != RD_NONE ? mine[k].key : __int_as_float(0x7f800000);
        double M = m;
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmax(M, __shfl_xor_sync(0xffffffff, M, o));
        sum = m == (double)NEG_INF ? 0.0 : sum * (double)__expf((float)(m - M));
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_xor_sync(0xffffffff, sum, o);
            live += __shfl_xor_sync(0xffffffff, live, o);
            bad = min(bad, __shfl_xor_sync(0xffffffff, bad, o));
            const float k2 = __shfl_xor_sync(0xffffffff, key, o);
            const u32 d2 = __shfl_xor_sync(0xffffffff, drawn, o);
            if (d2 != RD_NONE && (drawn == RD_NONE || k2 < key || (k2 == key && d2 < drawn))) {
                key = k2;
                drawn = d2;
            }
        }
        if (k == 0) {
            s_S = sum;
            s_L = live;
            s_bad = bad;
            s_drawn = drawn;
        }
    }
    __syncthreads();
    const u32 L = s_L, bad = s_bad, drawn = s_drawn;
    const u32 listed = bad != RD_NONE ? 0 : min((u32)N, L);
    double* ov = (double*)(o + 32);
    u32* oi = (u32*)(o + 32 + RD_TOP * 8);
    for (int t = threadIdx.x; t < RD_TOP; t += RD_THREADS) {
        ov[t] = t < (int)listed ? v[t] : (double)NEG_INF;
        oi[t] = t < (int)listed ? id[t] : RD_NONE;
    }
    if (threadIdx.x == 0) {
        *(double*)o = bad != RD_NONE ? 0.0 : s_S;
        u32* h = (u32*)(o + 8);
        h[0] = bad != RD_NONE ? 0 : L;
        h[1] = bad != RD_NONE ? RD_NONE : drawn;
        h[2] = bad;
        h[3] = bad != RD_NONE ? __float_as_uint(logits[(long long)row * V + bad]) : 0;
        h[4] = listed;
    }
}
