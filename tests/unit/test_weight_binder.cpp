// test_weight_binder.cpp — WeightBinder::bind decides "this is the file's weight" by name and
// exact place, never by address range alone, and binds each weight once.
//
// A stand-in for llama.cpp's mapping (an anonymous region of the file's size) and ggml tensors
// placed in it reproduce, deterministically, what llama.cpp's unmapped holes allow at random:
//  - a tensor of llama.cpp's own (the KV cache) lying in the mapping's range, even reaching past
//    its end, is left alone (it is not a weight of the file);
//  - a weight at its file offset is rebound to its heap copy, and a view made before that
//    follows it;
//  - once bound, a weight whose data then lies in the mapping's range (the heap copy landing in
//    a hole) is not looked at again;
//  - control: an unbound weight in the mapping at the wrong offset is still refused.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <string>

#include "ggml.h"
#include "io_lanes.h"
#include "moestream/gguf_index.h"
#include "test_util.h"
#include "weight_binder.h"

using namespace moestream;

namespace {

struct GgmlCtx {
    ggml_context * c = nullptr;
    GgmlCtx() {
        ggml_init_params p{64 * ggml_tensor_overhead(), nullptr, true};
        c = ggml_init(p);
    }
    ~GgmlCtx() { ggml_free(c); }
};

// A ggml tensor shaped like the index's `name`, data at `data`.
ggml_tensor * weight(ggml_context * c, const TensorInfo & ti, void * data) {
    ggml_tensor * t = ggml_new_tensor(c, ggml_type(ti.type), int(ti.n_dims), ti.ne);
    ggml_set_name(t, ti.name.c_str());
    t->data = data;
    return t;
}

}  // namespace

TEST(WeightBinder, BindsByNameAndPlaceOnce) {
    const std::string model = test::synth_model("tiny", "qwen3moe", "q8_0");
    ModelIndex idx;
    ASSERT_TRUE(load_model_index(model, &idx).ok());
    const TensorInfo * embd = idx.find_tensor("token_embd.weight");
    const TensorInfo * norm = idx.find_tensor("output_norm.weight");
    ASSERT_TRUE(embd && norm);

    void * map = ::mmap(nullptr, idx.file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    uint8_t * base = static_cast<uint8_t *>(map);
    LoadedModel lm;
    lm.maps = {FileMapping{base, idx.file_size}};
    IoLanes io;
    ASSERT_TRUE(io.open(model, 1, false, 1 << 20).ok());
    WeightBinder b(idx, nullptr, lm);
    ASSERT_TRUE(b.read_dense(&io).ok());
    GgmlCtx g;

    // llama.cpp's own tensor in the mapping's range, reaching past its end: not the file's.
    ggml_tensor * kv = ggml_new_tensor_1d(g.c, GGML_TYPE_F32, 4096);
    ggml_set_name(kv, "cache_k_l2");
    kv->data = base + idx.file_size - 4096;
    Status st = b.bind(kv);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(kv->data, base + idx.file_size - 4096);

    // The weight at its file offset, and a view of it made before binding.
    ggml_tensor * e = weight(g.c, *embd, base + embd->file_offset);
    ggml_tensor * row = ggml_view_1d(g.c, e, embd->ne[0], size_t(ggml_row_size(e->type, embd->ne[0])));
    ASSERT_EQ(row->data, base + embd->file_offset + ggml_row_size(e->type, embd->ne[0]));
    st = b.bind(row);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(e->data, b.dense_copy("token_embd.weight"));
    EXPECT_EQ(row->data, static_cast<uint8_t *>(e->data) + ggml_row_size(e->type, embd->ne[0]));

    // Bound once: its data now in the mapping's range (its copy in a hole), a second operand
    // use (token_embd feeds two GET_ROWS) does not take it for the file's.
    void * in_hole = base + 4096;
    e->data = in_hole;
    st = b.bind(e);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(e->data, in_hole);

    // Control: an unbound weight in the mapping, not at its offset, is refused.
    ggml_tensor * n = weight(g.c, *norm, base + norm->file_offset + 32);
    st = b.bind(n);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("does not match the validated index"), std::string::npos)
        << st.message();
    // ... and at its offset it binds.
    n->data = base + norm->file_offset;
    st = b.bind(n);
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(n->data, b.dense_copy("output_norm.weight"));
    ::munmap(map, idx.file_size);
}
