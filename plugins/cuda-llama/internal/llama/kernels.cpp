//go:build llama && cgo

// ggml's CPU backend picks kernels by batch size (flash attention tiles 64
// or more queries, with Q in f32; fewer go row by row, with Q rounded to the
// K type), so a token's results depend on the batch it was computed in. Its
// reference kernels do not; the scheduler's backends are reached through
// llama_context (llama-context.h, an internal struct: the llama.cpp tree is
// pinned in mk/llama-pin.mk).

#include "kernels.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama-context.h"

int hydra_cpu_reference_kernels(struct llama_context * ctx) {
    ggml_backend_sched_t sched = ctx->get_sched();
    int n = 0;
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_t be = ggml_backend_sched_get_backend(sched, i);
        if (ggml_backend_dev_type(ggml_backend_get_device(be)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            ggml_backend_cpu_set_use_ref(be, true);
            n++;
        }
    }
    return n;
}
