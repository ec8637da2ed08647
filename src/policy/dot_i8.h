// dot_i8.h — the integer kernels of the next-layer guess (prefetch.h): an int8 x int8 dot
// product summed in int32, and the symmetric int8 quantization of a float vector.
//
// Contract: the results are exact integers (and, for the quantization, the same int8 values
// and scale) on every CPU: the guess decides which bytes are read, and replays and tests rely on
// it being deterministic. The SIMD paths compute exactly what the scalar ones do: integer sums
// do not depend on their order, the quantization rounds each element on its own (to nearest,
// ties to even, as std::nearbyint in the default rounding mode) and its scale is a maximum.
// The path is chosen once per process at run time: AVX-VNNI or AVX2 where the CPU has it
// (x86-64), NEON on aarch64, the scalar loop elsewhere.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moestream {

// The elements of every int8 operand below must lie in [-127, 127] (what quantize_i8 makes):
// the SIMD paths multiply |y| by w with y's sign (exact there, not for -128).

// sum_i a[i] * b[i] in int32 (exact for n below 2^17), by the plain loop on every CPU: the
// reference the SIMD paths are tested against.
int32_t dot_i8_scalar(const int8_t * a, const int8_t * b, int64_t n);
// out[r] = sum_i w[r * stride + i] * y[i] in int32 for r < n_rows: one guess's router rows
// against its input, on the fastest path this CPU has.
void dot_i8_rows(const int8_t * w, size_t stride, int64_t n_rows, const int8_t * y, int64_t n,
                 int32_t * out);

// Every dot_i8_rows path this CPU can run, the one dot_i8_rows uses first (for tests).
struct DotI8Kernel {
    const char * isa;
    void (*rows)(const int8_t * w, size_t stride, int64_t n_rows, const int8_t * y, int64_t n,
                 int32_t * out);
};
int dot_i8_kernels(DotI8Kernel * out, int max);

// q[i] = the int8 nearest x[i] / s, clamped to [-127, 127], 0 where x[i] is not finite;
// s = max |x[i]| over the finite x[i], / 127 (1 when that maximum is 0). Returns s.
float quantize_i8(const float * x, int64_t n, int8_t * q);
float quantize_i8_scalar(const float * x, int64_t n, int8_t * q);

// Which path dot_i8_rows runs here: "avxvnni", "avx2", "neon" or "scalar" (quantize_i8: AVX2 where
// the CPU has it, else scalar).
const char * dot_i8_isa();

}  // namespace moestream
