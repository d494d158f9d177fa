//go:build llama && cgo

// Speculative decoding's drafting through llama.cpp's common library: its
// draft-simple implementation drafts for every slot in one batch of the
// draft context, its n-gram ones look the slots' own tokens up; the
// scheduler verifies the drafts in its own step.

#include "spec.h"

#include "common.h"
#include "speculative.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

static llama_context * new_draft_context(llama_model * dft, const hydra_spec_params * p);

struct hydra_spec {
    llama_context * ctx = nullptr;
    common_speculative * spec = nullptr;
    llama_batch batch{};
    int32_t n_batch = 0;
    // per sequence: the llama_tokens each draft call fills, and the tokens
    // so far the library's parameters point at (the n-gram types read them)
    std::vector<llama_tokens> result, prompt;
};

hydra_spec * hydra_spec_new(llama_model * dft, llama_context * tgt, const hydra_spec_params * p, char * err,
                            size_t err_len) {
    common_params_speculative sp;
    sp.types = common_speculative_types_from_names(string_split<std::string>(p->types, ','));
    sp.draft.n_max = p->n_max;
    sp.draft.n_min = p->n_min;
    sp.draft.p_min = p->p_min;
    sp.draft.ctx_tgt = tgt;
    if (p->ngram_simple_n > 0) {
        sp.ngram_simple.size_n = p->ngram_simple_n;
    }
    if (p->ngram_simple_m > 0) {
        sp.ngram_simple.size_m = p->ngram_simple_m;
    }
    for (auto * m : { &sp.ngram_map_k, &sp.ngram_map_k4v }) {
        if (p->ngram_map_n > 0) {
            m->size_n = p->ngram_map_n;
        }
        if (p->ngram_map_m > 0) {
            m->size_m = p->ngram_map_m;
        }
    }
    llama_context * ctx = nullptr;
    if (dft != nullptr) {
        ctx = new_draft_context(dft, p);
        if (ctx == nullptr) {
            snprintf(err, err_len, "llama.cpp could not create the draft model's context");
            return nullptr;
        }
    }
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
        if (ctx != nullptr) {
            llama_free(ctx);
        }
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

static llama_context * new_draft_context(llama_model * dft, const hydra_spec_params * p) {
    auto cp = llama_context_default_params();
    cp.n_ctx = p->n_ctx;
    cp.n_batch = p->n_batch;
    cp.n_ubatch = p->n_batch < 512 ? p->n_batch : 512;
    cp.n_seq_max = p->n_seq;
    cp.n_threads = p->n_threads;
    cp.n_threads_batch = p->n_threads;
    cp.kv_unified = true;
    cp.no_perf = true;
    return llama_init_from_model(dft, cp);
}

void hydra_spec_free(hydra_spec * s) {
    if (s == nullptr) {
        return;
    }
    common_speculative_free(s->spec);
    llama_batch_free(s->batch);
    if (s->ctx != nullptr) {
        llama_free(s->ctx);
    }
    delete s;
}

void hydra_spec_begin(hydra_spec * s, int32_t seq, const llama_token * prompt, int32_t n) {
    common_speculative_begin(s->spec, seq, llama_tokens(prompt, prompt + n));
}

void hydra_spec_accept(hydra_spec * s, int32_t seq, int32_t n_accepted) {
    common_speculative_accept(s->spec, seq, (uint16_t) n_accepted);
}

int32_t hydra_spec_pos_max(hydra_spec * s, int32_t seq) {
    if (s->ctx == nullptr) {
        return -1;
    }
    return llama_memory_seq_pos_max(llama_get_memory(s->ctx), seq);
}

void hydra_spec_seq_rm(hydra_spec * s, int32_t seq, int32_t p0) {
    if (s->ctx == nullptr) {
        return;
    }
    llama_memory_seq_rm(llama_get_memory(s->ctx), seq, p0, -1);
}

llama_context * hydra_spec_ctx(hydra_spec * s) {
    return s->ctx;
}

int hydra_spec_eval(hydra_spec * s, const llama_token * toks, const llama_pos * pos, const llama_seq_id * seqs, int32_t n) {
    if (s->ctx == nullptr) {
        return 0;
    }
    for (int32_t off = 0; off < n; off += s->n_batch) {
        common_batch_clear(s->batch);
        for (int32_t i = off; i < n && i < off + s->n_batch; i++) {
            common_batch_add(s->batch, toks[i], pos[i], { seqs[i] }, false);
        }
        if (int r = llama_decode(s->ctx, s->batch); r != 0) {
            return r;
        }
    }
    // Done here rather than inside the first draft step, so that the
    // speculative rule times the catch-up apart from the drafting.
    llama_synchronize(s->ctx);
    return 0;
}

void hydra_spec_draft(hydra_spec * s, int32_t n, const llama_seq_id * seqs, const llama_pos * n_past,
                      const llama_token * id_last, const int32_t * n_max, const llama_token * hist,
                      const int32_t * hist_off, llama_token * out, int32_t stride, int32_t * n_out) {
    for (int32_t i = 0; i < n; i++) {
        auto & r = s->result[seqs[i]];
        r.clear();
        auto & h = s->prompt[seqs[i]];
        h.clear();
        if (hist != nullptr) {
            h.assign(hist + hist_off[i], hist + hist_off[i + 1]);
        }
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
