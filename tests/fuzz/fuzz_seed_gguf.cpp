// fuzz_seed_gguf IN.gguf OUT — writes a fuzz_gguf_index seed for a GGUF file: the u64 pad
// (bytes after the tensor table and its alignment padding) followed by the bytes up to the
// data section. The seed's file validates exactly like IN (its data section reads as zeros).
#include <cstdio>
#include <fstream>
#include <vector>

#include "moestream/gguf_index.h"

int main(int argc, char ** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: fuzz_seed_gguf IN.gguf OUT\n");
        return 64;
    }
    moestream::ModelIndex m;
    moestream::Status st = moestream::load_model_index(argv[1], &m);
    if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
    }
    std::vector<char> head(m.data_offset);
    std::ifstream in(argv[1], std::ios::binary);
    if (!in.read(head.data(), std::streamsize(head.size()))) return 1;
    const uint64_t pad = m.file_size - m.data_offset;
    std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(&pad), 8);
    out.write(head.data(), std::streamsize(head.size()));
    return out ? 0 : 1;
}
