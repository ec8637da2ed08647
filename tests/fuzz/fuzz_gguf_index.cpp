// fuzz_gguf_index.cpp — libFuzzer target for moestream's GGUF / expert-map validation
// (load_model_index, include/moestream/gguf_index.h). docs/reliability.md, "Fuzzing".
//
// Input: [u64 little-endian pad][file bytes]. The file given to load_model_index is the file
// bytes followed by min(pad, 1 GiB) zero bytes (a sparse memfd: nothing is allocated). The pad
// lets a small input stand for a whole model: the seeds (fuzz_seed_gguf) are synth models cut
// after their metadata and tensor table, with pad = the size of the cut-off data section, so
// a seed validates exactly like the full model and the fuzzer starts from deep inside the
// expert-map checks. A short input (< 8 bytes) is the file itself with no pad.
//
// Checked: no crash / sanitizer report / abort, and on success the ModelIndex invariants of
// gguf_index.h hold (every tensor and expert slice inside the file, 1 <= k <= n_expert).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "moestream/gguf_index.h"
#include "moestream/log.h"

using namespace moestream;

namespace {

void check(bool ok, const char * what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_gguf_index: invariant violated: %s\n", what);
        std::abort();
    }
}

void check_invariants(const ModelIndex & m) {
    check(m.n_expert_used >= 1 && m.n_expert_used <= m.n_expert, "1 <= n_expert_used <= n_expert");
    for (const TensorInfo & t : m.tensors) {
        check(t.file_offset <= m.file_size && t.nbytes <= m.file_size - t.file_offset,
              "tensor inside the file");
    }
    for (const MoeLayer & L : m.moe_layers) {
        check(!L.tensors.empty(), "MoE layer has expert tensors");
        for (const ExpertTensor & e : L.tensors) {
            check(e.ne[2] >= 1 && uint64_t(e.ne[2]) == m.n_expert, "expert count matches");
            check(e.slice_bytes > 0 && e.tensor_bytes / e.slice_bytes == uint64_t(e.ne[2]) &&
                      e.tensor_bytes % e.slice_bytes == 0,
                  "tensor_bytes = n_expert * slice_bytes");
            check(e.file_offset <= m.file_size && e.tensor_bytes <= m.file_size - e.file_offset,
                  "expert tensor inside the file");
            const uint32_t last = uint32_t(e.ne[2] - 1);
            check(e.slice_offset(last) + e.slice_bytes <= m.file_size, "last slice inside the file");
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log_set_level(LogLevel::kError);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    uint64_t pad = 0;
    if (size >= 8) {
        std::memcpy(&pad, data, 8);
        pad = std::min<uint64_t>(pad, 1ull << 30);
        data += 8;
        size -= 8;
    }
    const int fd = memfd_create("fuzz-gguf", MFD_CLOEXEC);
    if (fd < 0) return 0;
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::write(fd, data + done, size - done);
        if (n <= 0) break;
        done += size_t(n);
    }
    if (done == size && (pad == 0 || ftruncate(fd, off_t(size + pad)) == 0)) {
        const std::string path = "/proc/self/fd/" + std::to_string(fd);
        ModelIndex m;
        Status st = load_model_index(path, &m);
        if (st.ok()) check_invariants(m);
        else check(st.code() == ErrorCode::kBadModel && !st.message().empty(), "error is kBadModel");
    }
    ::close(fd);
    return 0;
}
