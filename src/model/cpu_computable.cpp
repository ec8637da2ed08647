// cpu_computable.cpp — check_cpu_computable (gguf_index.h): a validated index against the
// ggml CPU backend this process loaded. The backend is a module loaded at run time, so its
// CPU type traits are found through dladdr/dlopen(RTLD_NOLOAD) of the loaded module.
#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "moestream/gguf_index.h"

namespace moestream {

namespace {

using CpuTraitsFn = const ggml_type_traits_cpu * (*)(ggml_type);

// ggml_get_type_traits_cpu of the CPU backend this process loaded. The backend is a module
// loaded at run time (one variant per CPU): find the loaded file through one of its functions
// and look the symbol up there; a CPU backend linked in statically is found directly.
CpuTraitsFn cpu_traits_fn(ggml_backend_reg_t reg) {
    void * any = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")
                     : nullptr;
    Dl_info info;
    if (any && ::dladdr(any, &info) && info.dli_fname) {
        if (void * h = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
            auto fn = reinterpret_cast<CpuTraitsFn>(::dlsym(h, "ggml_get_type_traits_cpu"));
            ::dlclose(h);  // NOLOAD took a reference; the backend stays loaded
            if (fn) return fn;
        }
    }
    return reinterpret_cast<CpuTraitsFn>(::dlsym(RTLD_DEFAULT, "ggml_get_type_traits_cpu"));
}

enum class Role { kRows, kMatMul, kMatMulId, kElementwise };

const char * role_op(Role r) {
    switch (r) {
        case Role::kRows: return "GET_ROWS (token embedding)";
        case Role::kMatMul: return "MUL_MAT";
        case Role::kMatMulId: return "MUL_MAT_ID (experts)";
        case Role::kElementwise: return "MUL/ADD with f32 activations (norm, bias)";
    }
    return "?";
}

// Asks the device about a small probe node of the op the role feeds.
bool device_supports(ggml_backend_dev_t dev, Role role, ggml_type t) {
    const size_t mem = 16 * ggml_tensor_overhead() + 4096;
    ggml_init_params ip{mem, nullptr, true};
    ggml_context * c = ggml_init(ip);
    if (!c) return false;
    const int64_t k = std::max<int64_t>(256, ggml_blck_size(t));
    ggml_tensor * node = nullptr;
    switch (role) {
        case Role::kRows:
            node = ggml_get_rows(c, ggml_new_tensor_2d(c, t, k, 2),
                                 ggml_new_tensor_1d(c, GGML_TYPE_I32, 1));
            break;
        case Role::kMatMul:
            node = ggml_mul_mat(c, ggml_new_tensor_2d(c, t, k, 2),
                                ggml_new_tensor_2d(c, GGML_TYPE_F32, k, 1));
            break;
        case Role::kMatMulId:
            node = ggml_mul_mat_id(c, ggml_new_tensor_3d(c, t, k, 2, 2),
                                   ggml_new_tensor_3d(c, GGML_TYPE_F32, k, 1, 1),
                                   ggml_new_tensor_2d(c, GGML_TYPE_I32, 1, 1));
            break;
        case Role::kElementwise:
            node = ggml_mul(c, ggml_new_tensor_2d(c, GGML_TYPE_F32, k, 2),
                            ggml_new_tensor_1d(c, t, k));
            break;
    }
    const bool ok = node && ggml_backend_dev_supports_op(dev, node);
    ggml_free(c);
    return ok;
}

// What the CPU kernels themselves can do with the type (supports_op of ggml 0.27's CPU
// backend answers yes for every type, so the kernels' presence decides). Empty: computable.
std::string kernel_missing(CpuTraitsFn traits, Role role, ggml_type t) {
    switch (role) {
        case Role::kRows:
            if (t == GGML_TYPE_F32 || ggml_get_type_traits(t)->to_float) return "";
            return "no conversion to f32";
        case Role::kMatMul:
        case Role::kMatMulId: {
            const ggml_type_traits_cpu * tr = traits(t);
            if (!tr || !tr->vec_dot) return "no dot-product kernel";
            const ggml_type_traits_cpu * in = traits(tr->vec_dot_type);
            if (!in || !in->from_float) return "no conversion of the activations";
            return "";
        }
        case Role::kElementwise:
            // The CPU's binary ops take an f32 activation with an f32 operand only.
            return t == GGML_TYPE_F32 ? "" : "element-wise ops need f32";
    }
    return "unknown role";
}

}  // namespace

Status check_cpu_computable(const ModelIndex & m) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) return Status::Runtime("no ggml CPU backend is loaded");
    CpuTraitsFn traits = cpu_traits_fn(ggml_backend_dev_backend_reg(dev));
    if (!traits)
        return Status::Runtime("cannot find ggml_get_type_traits_cpu in the loaded CPU backend");
    const size_t need_align = ggml_backend_buft_get_alignment(ggml_backend_dev_buffer_type(dev));
    if (m.alignment < need_align) {
        auto it = m.kv_offsets.find("general.alignment");
        return Status::BadModel(m.path + ": general.alignment " + std::to_string(m.alignment) +
                                " is below the CPU buffer alignment " +
                                std::to_string(need_align) + " at byte offset " +
                                std::to_string(it == m.kv_offsets.end() ? 0 : it->second));
    }
    const bool tied = m.find_tensor("output.weight") == nullptr;
    for (const TensorInfo & t : m.tensors) {
        if (t.unused) continue;  // llama.cpp does not compute it
        std::vector<Role> roles;
        if (t.name == "token_embd.weight") {
            roles.push_back(Role::kRows);
            if (tied) roles.push_back(Role::kMatMul);  // also the output projection
        } else if (t.n_dims == 1) {
            roles.push_back(Role::kElementwise);
        } else {
            roles.push_back(m.is_expert_tensor(t.name) ? Role::kMatMulId : Role::kMatMul);
        }
        const auto gt = static_cast<ggml_type>(t.type);
        for (Role r : roles) {
            std::string why = device_supports(dev, r, gt) ? kernel_missing(traits, r, gt)
                                                           : "the device's supports_op says no";
            if (!why.empty())
                return Status::BadModel(m.path + ": tensor '" + t.name + "' has type " +
                                        ggml_type_name(gt) + ", which the CPU backend cannot compute in " +
                                        role_op(r) + " (" + why + ") at byte offset " +
                                        std::to_string(t.info_offset));
        }
    }
    return Status::Ok();
}

}  // namespace moestream
