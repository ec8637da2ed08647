// dot_i8.cpp — the guess's integer kernels (see dot_i8.h).
#include "dot_i8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace moestream {

int32_t dot_i8_scalar(const int8_t * a, const int8_t * b, int64_t n) {
    int32_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += int32_t(a[i]) * int32_t(b[i]);
    return s;
}

namespace {

// The scale rule of quantize_i8 (dot_i8.h), shared by both paths.
float scale_of(float amax) {
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    return s > 0 ? s : 1.0f;  // (a denormal maximum whose 1/127 underflows to 0)
}

void quantize_tail(const float * x, int64_t i, int64_t n, float s, int8_t * q) {
    for (; i < n; ++i) {
        const float v = std::isfinite(x[i]) ? std::nearbyint(x[i] / s) : 0.0f;
        q[i] = int8_t(std::clamp(v, -127.0f, 127.0f));
    }
}

float amax_finite(const float * x, int64_t i, int64_t n, float amax) {
    for (; i < n; ++i)
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
    return amax;
}

void rows_scalar(const int8_t * w, size_t stride, int64_t n_rows, const int8_t * y, int64_t n,
                 int32_t * out) {
    for (int64_t r = 0; r < n_rows; ++r) out[r] = dot_i8_scalar(w + size_t(r) * stride, y, n);
}

#if defined(__x86_64__)
// |y| once per call (scratch), then per 32 bytes of a row: w with y's sign (vpsignb), times
// |y| summed in pairs (vpmaddubsw: at most 2 * 127 * 127, no saturation), then in fours into
// int32 (vpmaddwd by 1, or vpdpbusd which does both). Exact for elements in [-127, 127].
int8_t * abs_scratch(int64_t n) {
    thread_local std::vector<int8_t> buf;
    if (buf.size() < size_t(n)) buf.resize(size_t(n));
    return buf.data();
}

__attribute__((target("avx2"))) int32_t hsum(__m256i acc) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2"))) void abs_y(const int8_t * y, int64_t n32, int8_t * ay) {
    for (int64_t i = 0; i < n32; i += 32)
        _mm256_storeu_si256((__m256i *)(ay + i),
                            _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(y + i))));
}

// Row a's chunk at i with y's signs: the signed operand of the multiply by |y|.
__attribute__((target("avx2"))) inline __m256i signed_chunk(const int8_t * a, const int8_t * y,
                                                            int64_t i) {
    return _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(a + i)),
                            _mm256_loadu_si256((const __m256i *)(y + i)));
}

__attribute__((target("avx2"))) inline __m256i load32(const int8_t * p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

__attribute__((target("avx2"))) void rows_avx2(const int8_t * w, size_t stride, int64_t n_rows,
                                               const int8_t * y, int64_t n, int32_t * out) {
    const int64_t n32 = n & ~int64_t(31);
    int8_t * ay = abs_scratch(n32);
    abs_y(y, n32, ay);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t r = 0; r < n_rows; ++r) {
        const int8_t * a = w + size_t(r) * stride;
        __m256i acc = _mm256_setzero_si256();
        for (int64_t i = 0; i < n32; i += 32)  // (only the add is a chain: one accumulator)
            acc = _mm256_add_epi32(
                acc, _mm256_madd_epi16(_mm256_maddubs_epi16(load32(ay + i), signed_chunk(a, y, i)),
                                       ones));
        out[r] = hsum(acc) + dot_i8_scalar(a + n32, y + n32, n - n32);
    }
}

// The same with vpdpbusd (|y| times the signed chunk, in fours, into int32): its 5-cycle
// latency on the accumulator wants two of them.
__attribute__((target("avx2,avxvnni"))) void rows_avxvnni(const int8_t * w, size_t stride,
                                                          int64_t n_rows, const int8_t * y,
                                                          int64_t n, int32_t * out) {
    const int64_t n32 = n & ~int64_t(31);
    int8_t * ay = abs_scratch(n32);
    abs_y(y, n32, ay);
    for (int64_t r = 0; r < n_rows; ++r) {
        const int8_t * a = w + size_t(r) * stride;
        __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
        int64_t i = 0;
        for (; i + 64 <= n32; i += 64) {
            acc0 = _mm256_dpbusd_avx_epi32(acc0, load32(ay + i), signed_chunk(a, y, i));
            acc1 = _mm256_dpbusd_avx_epi32(acc1, load32(ay + i + 32), signed_chunk(a, y, i + 32));
        }
        if (i < n32) acc0 = _mm256_dpbusd_avx_epi32(acc0, load32(ay + i), signed_chunk(a, y, i));
        out[r] = hsum(_mm256_add_epi32(acc0, acc1)) + dot_i8_scalar(a + n32, y + n32, n - n32);
    }
}

// Finite lanes of v: exponent bits not all set.
__attribute__((target("avx2"))) __m256 finite_mask(__m256 v) {
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    const __m256i bits = _mm256_and_si256(_mm256_castps_si256(v), e);
    return _mm256_castsi256_ps(
        _mm256_xor_si256(_mm256_cmpeq_epi32(bits, e), _mm256_set1_epi32(-1)));
}

// Rounds 8 floats like the scalar path: x / s to nearest (ties to even), clamped to
// [-127, 127], 0 where x is not finite.
__attribute__((target("avx2"))) __m256i quantize8(const float * p, __m256 vs) {
    const __m256 v = _mm256_loadu_ps(p);
    __m256 r = _mm256_round_ps(_mm256_div_ps(v, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    return _mm256_cvtps_epi32(_mm256_and_ps(r, finite_mask(v)));
}

__attribute__((target("avx2"))) float quantize_avx2(const float * x, int64_t n, int8_t * q) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_and_ps(v, abs_mask), finite_mask(v)));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float amax = 0;
    for (float l : lanes) amax = std::max(amax, l);
    amax = amax_finite(x, i, n, amax);
    const float s = scale_of(amax);
    const __m256 vs = _mm256_set1_ps(s);
    i = 0;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; i + 32 <= n; i += 32) {
        const __m256i p01 = _mm256_packs_epi32(quantize8(x + i, vs), quantize8(x + i + 8, vs));
        const __m256i p23 = _mm256_packs_epi32(quantize8(x + i + 16, vs), quantize8(x + i + 24, vs));
        const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order);
        _mm256_storeu_si256((__m256i *)(q + i), p);
    }
    quantize_tail(x, i, n, s, q);
    return s;
}
#elif defined(__aarch64__)
void rows_neon(const int8_t * w, size_t stride, int64_t n_rows, const int8_t * y, int64_t n,
               int32_t * out) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const int8_t * a = w + size_t(r) * stride;
        int32x4_t acc = vdupq_n_s32(0);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            const int8x16_t va = vld1q_s8(a + i), vb = vld1q_s8(y + i);
            acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(va), vget_low_s8(vb)));
            acc = vpadalq_s16(acc, vmull_high_s8(va, vb));
        }
        out[r] = vaddvq_s32(acc) + dot_i8_scalar(a + i, y + i, n - i);
    }
}
#endif

using RowsFn = void (*)(const int8_t *, size_t, int64_t, const int8_t *, int64_t, int32_t *);
using QuantFn = float (*)(const float *, int64_t, int8_t *);

struct Kernels {
    DotI8Kernel all[4];  // the chosen one first
    int n = 0;
    QuantFn quant = quantize_i8_scalar;
};

const Kernels & kernels() {
    static const Kernels k = [] {
        Kernels r;
#if defined(__x86_64__)
        if (__builtin_cpu_supports("avx2")) {
            if (__builtin_cpu_supports("avxvnni")) r.all[r.n++] = {"avxvnni", rows_avxvnni};
            r.all[r.n++] = {"avx2", rows_avx2};
            r.quant = quantize_avx2;
        }
#elif defined(__aarch64__)
        r.all[r.n++] = {"neon", rows_neon};
#endif
        r.all[r.n++] = {"scalar", rows_scalar};
        return r;
    }();
    return k;
}

}  // namespace

float quantize_i8_scalar(const float * x, int64_t n, int8_t * q) {
    const float s = scale_of(amax_finite(x, 0, n, 0.0f));
    quantize_tail(x, 0, n, s, q);
    return s;
}

void dot_i8_rows(const int8_t * w, size_t stride, int64_t n_rows, const int8_t * y, int64_t n,
                 int32_t * out) {
    kernels().all[0].rows(w, stride, n_rows, y, n, out);
}

int dot_i8_kernels(DotI8Kernel * out, int max) {
    const Kernels & k = kernels();
    int i = 0;
    for (; i < k.n && i < max; ++i) out[i] = k.all[i];
    return i;
}

float quantize_i8(const float * x, int64_t n, int8_t * q) { return kernels().quant(x, n, q); }

const char * dot_i8_isa() { return kernels().all[0].isa; }

}  // namespace moestream
