//go:build llama && cgo

// Speculative decoding's drafting through llama.cpp's common library: its
// draft-simple implementation drafts for every slot in one batch of the
// draft context; the scheduler verifies the drafts in its own step.

#include "spec.h"

#include "common.h"
#include "speculative.h"

#include <cstdio>
#include <vector>

struct hydra_spec {
    llama_context * ctx = nullptr;
    common_speculative * spec = nullptr;
    llama_batch batch{};
    int32_t n_batch = 0;
    // per sequence: the llama_tokens each draft call fills, and the prompt
    // the library's parameters point at (draft-simple reads neither)
    std::vector<llama_tokens> result, prompt;
};

hydra_spec * hydra_spec_new(llama_model * dft, llama_context * tgt, const hydra_spec_params * p, char * err,
                            size_t err_len) {
    auto cp = llama_context_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_batch = p->n_batch;
    cp.n_ubatch = p->n_batch < 512 ? p->n_batch : 512;
    cp.n_seq_max = p->n_seq;
    cp.n_threads = p->n_threads;
    cp.n_threads_batch = p->n_threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(dft, cp);
    if (ctx == nullptr) {
        snprintf(err, err_len, "llama.cpp could not create the draft model's context");
        return nullptr;
    }
    common_params_speculative sp;
    sp.types = { COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE };
    sp.draft.n_max = p->n_max;
    sp.draft.n_min = p->n_min;
    sp.draft.p_min = p->p_min;
    sp.draft.ctx_tgt = tgt;
    sp.draft.ctx_dft = ctx;
    common_speculative * spec = nullptr;
    try {
        spec = common_speculative_init(sp, p->n_seq);
    } catch (const std::exception & e) {
        snprintf(err, err_len, "%s", e.what());
    }
    if (spec == nullptr) {
        if (err[0] == 0) {
            snprintf(err, err_len, "llama.cpp could not set up speculative decoding");
        }
        llama_free(ctx);
        return nullptr;
    }
    auto * s = new hydra_spec;
    s->ctx = ctx;
    s->spec = spec;
    s->n_batch = (int32_t) p->n_batch;
    s->batch = llama_batch_init(s->n_batch, 0, 1);
    s->result.resize(p->n_seq);
    s->prompt.resize(p->n_seq);
    return s;
}

void hydra_spec_free(hydra_spec * s) {
    if (s == nullptr) {
        return;
    }
    common_speculative_free(s->spec);
    llama_batch_free(s->batch);
    llama_free(s->ctx);
    delete s;
}

void hydra_spec_seq_rm(hydra_spec * s, int32_t seq, int32_t p0) {
    llama_memory_seq_rm(llama_get_memory(s->ctx), seq, p0, -1);
}

int hydra_spec_eval(hydra_spec * s, const llama_token * toks, const llama_pos * pos, const llama_seq_id * seqs, int32_t n) {
    for (int32_t off = 0; off < n; off += s->n_batch) {
        common_batch_clear(s->batch);
        for (int32_t i = off; i < n && i < off + s->n_batch; i++) {
            common_batch_add(s->batch, toks[i], pos[i], { seqs[i] }, false);
        }
        if (int r = llama_decode(s->ctx, s->batch); r != 0) {
            return r;
        }
    }
    return 0;
}

void hydra_spec_draft(hydra_spec * s, int32_t n, const llama_seq_id * seqs, const llama_pos * n_past,
                      const llama_token * id_last, const int32_t * n_max, llama_token * out, int32_t stride,
                      int32_t * n_out) {
    for (int32_t i = 0; i < n; i++) {
        auto & r = s->result[seqs[i]];
        r.clear();
        common_speculative_get_draft_params(s->spec, seqs[i]) = {
            /* .drafting = */ true,
            /* .n_max    = */ n_max[i],
            /* .n_past   = */ n_past[i],
            /* .id_last  = */ id_last[i],
            /* .prompt   = */ &s->prompt[seqs[i]],
            /* .result   = */ &r,
        };
    }
    common_speculative_draft(s->spec);
    for (int32_t i = 0; i < n; i++) {
        const auto & r = s->result[seqs[i]];
        int32_t k = 0;
        for (; k < (int32_t) r.size() && k < stride; k++) {
            out[i * stride + k] = r[k];
        }
        n_out[i] = k;
    }
}
