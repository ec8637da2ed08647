// test_dot_i8.cpp — the guess's integer kernels (src/policy/dot_i8.h): every dot path this CPU
// can run (the one chosen at run time, the other SIMD ones, the scalar loop) gives the exact
// integer sum, on random inputs, on extreme ones (every element -127 or 127, long enough to
// come near int32's range) and at lengths that are not a multiple of the vector width, one row
// or many at a stride. The quantization gives the same int8 values and scale on the SIMD path
// as on the scalar one, with non-finite, zero, denormal and half-way inputs.
// Negative controls: the same comparisons catch a kernel that drops the tail, one that sums
// in int16 (a SIMD accumulator too narrow) and a quantization that rounds ties away from zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dot_i8.h"

using namespace moestream;

namespace {

using Dot = int32_t (*)(const int8_t *, const int8_t *, int64_t);

int64_t dot_exact(const int8_t * a, const int8_t * b, int64_t n) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += int64_t(a[i]) * int64_t(b[i]);
    return s;
}

// One row through the dispatched path (what the guess runs).
int32_t dot_dispatched(const int8_t * a, const int8_t * b, int64_t n) {
    int32_t s = 0;
    dot_i8_rows(a, 0, 1, b, n, &s);
    return s;
}

// Broken kernels for the negative controls.
int32_t dot_drops_tail(const int8_t * a, const int8_t * b, int64_t n) {
    return dot_dispatched(a, b, n & ~int64_t(31));
}
int32_t dot_sums_in_int16(const int8_t * a, const int8_t * b, int64_t n) {
    int16_t s = 0;
    for (int64_t i = 0; i < n; ++i) s = int16_t(s + int32_t(a[i]) * b[i]);
    return s;
}

// One row of a kernel's many-rows path, at a stride, as a Dot.
const DotI8Kernel * g_kernel = nullptr;
int32_t dot_via_kernel(const int8_t * a, const int8_t * b, int64_t n) {
    // Three rows at a stride past n: the middle one is a; the others must not disturb it.
    const size_t stride = size_t(n) + 7;
    std::vector<int8_t> w(3 * stride, 1);
    std::copy(a, a + n, w.begin() + std::ptrdiff_t(stride));
    int32_t out[3] = {0, 0, 0};
    g_kernel->rows(w.data(), stride, 3, b, n, out);
    return out[1];
}

const int64_t kLengths[] = {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 2047, 2048, 2049, 4109};

// Mismatches of f against the exact sum over random inputs of every length.
int random_mismatches(Dot f, uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_int_distribution<int> d(-127, 127);  // (the contract: no -128)
    int bad = 0;
    for (int64_t n : kLengths)
        for (int rep = 0; rep < 20; ++rep) {
            std::vector<int8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
            for (auto & v : a) v = int8_t(d(g));
            for (auto & v : b) v = int8_t(d(g));
            if (int64_t(f(a.data(), b.data(), n)) != dot_exact(a.data(), b.data(), n)) ++bad;
        }
    return bad;
}

// Mismatches of f against the exact sum on constant and alternating extreme inputs.
int extreme_mismatches(Dot f) {
    int bad = 0;
    const int8_t vals[] = {-127, 127};
    std::vector<int64_t> lengths(std::begin(kLengths), std::end(kLengths));
    lengths.push_back((int64_t(1) << 17) - 1);  // 127 * 127 over it: just below 2^31
    for (int64_t n : lengths)
        for (int8_t x : vals)
            for (int8_t y : vals) {
                std::vector<int8_t> a(static_cast<size_t>(n), x), b(static_cast<size_t>(n), y);
                if (int64_t(f(a.data(), b.data(), n)) != dot_exact(a.data(), b.data(), n)) ++bad;
                for (int64_t i = 1; i < n; i += 2) b[size_t(i)] = int8_t(-int(y));
                if (int64_t(f(a.data(), b.data(), n)) != dot_exact(a.data(), b.data(), n)) ++bad;
            }
    return bad;
}

}  // namespace

TEST(DotI8, TheRuntimePathIsTheCpusBest) {
    std::printf("dot_i8 path: %s\n", dot_i8_isa());
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2"))
        EXPECT_STREQ(dot_i8_isa(), "avxvnni");
    else if (__builtin_cpu_supports("avx2"))
        EXPECT_STREQ(dot_i8_isa(), "avx2");
    else
        EXPECT_STREQ(dot_i8_isa(), "scalar");
#elif defined(__aarch64__)
    EXPECT_STREQ(dot_i8_isa(), "neon");
#endif
}

TEST(DotI8, EveryPathGivesTheExactSum) {
    DotI8Kernel ks[8];
    const int n = dot_i8_kernels(ks, 8);
    ASSERT_GE(n, 1);
    EXPECT_STREQ(ks[0].isa, dot_i8_isa());
    EXPECT_STREQ(ks[n - 1].isa, "scalar");
    for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(ks[i].isa);
        g_kernel = &ks[i];
        for (uint32_t seed : {1u, 2u, 3u}) EXPECT_EQ(random_mismatches(dot_via_kernel, seed), 0);
        EXPECT_EQ(extreme_mismatches(dot_via_kernel), 0);
    }
    EXPECT_EQ(random_mismatches(dot_dispatched, 4), 0);
    EXPECT_EQ(extreme_mismatches(dot_dispatched), 0);
    EXPECT_EQ(random_mismatches(dot_i8_scalar, 4), 0);
    EXPECT_EQ(extreme_mismatches(dot_i8_scalar), 0);
}

TEST(DotI8, NegativeControlsBrokenKernelsAreCaught) {
    EXPECT_GT(random_mismatches(dot_drops_tail, 1), 0);
    EXPECT_GT(extreme_mismatches(dot_drops_tail), 0);
    // Short random inputs rarely leave int16; the extreme ones do.
    EXPECT_GT(extreme_mismatches(dot_sums_in_int16), 0);
}

namespace {

using Quant = float (*)(const float *, int64_t, int8_t *);

// The scalar rule but rounding ties away from zero (std::round): a negative control.
float quantize_ties_away(const float * x, int64_t n, int8_t * q) {
    const float s = quantize_i8_scalar(x, n, q);
    for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) q[i] = int8_t(std::fmax(-127.0f, std::fmin(127.0f, std::round(x[i] / s))));
    return s;
}

// Whether f (by default the chosen path) and quantize_i8_scalar agree on x: scale bits and q.
bool quantize_agrees(const std::vector<float> & x, Quant f = quantize_i8) {
    const int64_t n = int64_t(x.size());
    std::vector<int8_t> q1(x.size(), 99), q2(x.size(), 99);
    const float s1 = f(x.data(), n, q1.data());
    const float s2 = quantize_i8_scalar(x.data(), n, q2.data());
    return std::memcmp(&s1, &s2, sizeof s1) == 0 && q1 == q2;
}

}  // namespace

TEST(QuantizeI8, SimdAndScalarAgreeBitForBit) {
    std::mt19937 g(7);
    std::normal_distribution<float> d(0.0f, 2.0f);
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t n : kLengths)
        for (int rep = 0; rep < 10; ++rep) {
            std::vector<float> x(static_cast<size_t>(n));
            for (auto & v : x) v = d(g);
            if (n > 40 && rep % 2) {
                x[3] = nan;
                x[5] = -inf;
                x[size_t(n) - 1] = inf;
                x[7] = -0.0f;
                x[9] = 1e-40f;  // denormal
            }
            EXPECT_TRUE(quantize_agrees(x)) << "n " << n << " rep " << rep;
        }
    // All zero, all non-finite, a denormal maximum (its 1/127 underflows).
    EXPECT_TRUE(quantize_agrees(std::vector<float>(70, 0.0f)));
    EXPECT_TRUE(quantize_agrees(std::vector<float>(70, nan)));
    EXPECT_TRUE(quantize_agrees(std::vector<float>(70, 1e-45f)));
}

TEST(QuantizeI8, RoundsToNearestTiesToEven) {
    // Maximum 127: the scale is 1 and each value rounds on its own.
    std::vector<float> x(40, 0.0f);
    const float in[] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -126.5f, 3.49f};
    const int8_t want[] = {127, 0, 2, 2, 0, -2, -126, 3};
    for (size_t i = 0; i < 8; ++i) x[i] = in[i];
    x[39] = 2.5f;  // in the scalar tail
    std::vector<int8_t> q(x.size());
    EXPECT_EQ(quantize_i8(x.data(), int64_t(x.size()), q.data()), 1.0f);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(int(q[i]), int(want[i])) << i;
    EXPECT_EQ(int(q[39]), 2);
    EXPECT_TRUE(quantize_agrees(x));
    // Negative control: the comparison catches rounding ties away from zero.
    EXPECT_FALSE(quantize_agrees(x, quantize_ties_away));
}
