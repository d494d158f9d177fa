//go:build llama && cgo

// Speculative decoding's drafting through llama.cpp's common library: its
// draft-simple implementation drafts for every slot in one batch of the
// draft context, its draft-mtp one with the target's MTP block from the
// target's hidden states, its n-gram ones look the slots' own tokens up;
// the scheduler verifies the drafts in its own step.

#include "spec.h"

#include "common.h"
#include "speculative.h"
#include "llama-ext.h" // llama_get_embeddings_nextn: the MTP hook's staging API

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

static llama_context * new_draft_context(llama_model * dft, const hydra_spec_params * p, bool mtp);

struct hydra_spec {
    llama_context * tgt = nullptr;
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
    if (p->mtp != 0) {
        ctx = new_draft_context(const_cast<llama_model *>(llama_get_model(tgt)), p, true);
        if (ctx == nullptr) {
            snprintf(err, err_len, "llama.cpp could not create the MTP context over the model's multi-token-prediction block");
            return nullptr;
        }
    } else if (dft != nullptr) {
        ctx = new_draft_context(dft, p, false);
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
    s->tgt = tgt;
    s->ctx = ctx;
    s->spec = spec;
    s->n_batch = (int32_t) p->n_batch;
    s->batch = llama_batch_init(s->n_batch, 0, 1);
    s->result.resize(p->n_seq);
    s->prompt.resize(p->n_seq);
    return s;
}

static llama_context * new_draft_context(llama_model * dft, const hydra_spec_params * p, bool mtp) {
    auto cp = llama_context_default_params();
    if (mtp) {
        cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    }
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

// ubatch_rows is the batch index of each row of the target's hidden states
// (h_nextn) after a hybrid or recurrent model's llama_decode, at this tree:
// its memory splits the batch into ubatches of equal runs of every
// sequence (llama_batch_allocr::split_equal, not sequential: the cache is
// unified) and stores each ubatch's rows in turn, and the first read of
// the outputs swaps rows as it puts the outputs back in the batch's order
// (the selection sort of llama_context::decode, output_reorder), rows that
// hold every token's hidden state and not the outputs'. llama.cpp's MTP
// process hook reads them in the batch's order, which they are in only
// when every sequence's run is as long (TestSpecMTP compares drafts alone
// and batched, so a tree that changes this shows).
static std::vector<int32_t> ubatch_rows(const llama_batch & b, uint32_t n_ubatch) {
    const int32_t n = b.n_tokens;
    std::vector<std::vector<int32_t>> runs;  // per sequence, by first appearance: its batch indices
    std::vector<llama_seq_id> ids;
    for (int32_t i = 0; i < n; i++) {
        const llama_seq_id id = b.seq_id[i][0];
        size_t k = std::find(ids.begin(), ids.end(), id) - ids.begin();
        if (k == ids.size()) {
            ids.push_back(id);
            runs.emplace_back();
        }
        runs[k].push_back(i);
    }
    std::vector<size_t> next(runs.size(), 0);
    std::vector<int32_t> rows, outs;
    while ((int32_t) rows.size() < n) {
        std::vector<size_t> cur;  // the sequences with tokens left, at most n_ubatch + 1 of them
        for (size_t k = 0; k < runs.size() && cur.size() <= n_ubatch; k++) {
            if (next[k] < runs[k].size()) {
                cur.push_back(k);
            }
        }
        std::vector<std::vector<int32_t>> part(cur.size());
        for (;;) {
            bool all = true;
            for (size_t k : cur) {
                all = all && next[k] < runs[k].size();
            }
            if (!all) {
                break;
            }
            for (size_t c = 0; c < cur.size(); c++) {
                part[c].push_back(runs[cur[c]][next[cur[c]]++]);
            }
            if ((part[0].size() + 1) * cur.size() > n_ubatch) {
                break;
            }
        }
        for (const auto & p : part) {
            for (int32_t i : p) {
                rows.push_back(i);
                if (b.logits == nullptr || b.logits[i]) {
                    outs.push_back(i);
                }
            }
        }
    }
    // The outputs' selection sort swaps rows i and j_min of every output
    // array, the hidden states' included.
    for (size_t i = 0; i + 1 < outs.size(); i++) {
        size_t j_min = i;
        for (size_t j = i + 1; j < outs.size(); j++) {
            if (outs[j] < outs[j_min]) {
                j_min = j;
            }
        }
        if (j_min != i) {
            std::swap(outs[i], outs[j_min]);
            std::swap(rows[i], rows[j_min]);
        }
    }
    return rows;
}

int hydra_spec_process(hydra_spec * s, const llama_batch * b) {
    if (s->ctx == nullptr || b->n_tokens <= 0) {
        return 0;
    }
    const llama_model * m = llama_get_model(s->tgt);
    if (llama_model_is_hybrid(m) || llama_model_is_recurrent(m)) {
        // Put the hidden states in the batch's order (ubatch_rows).
        const auto rows = ubatch_rows(*b, llama_n_ubatch(s->tgt));
        const int32_t n_embd = llama_model_n_embd_out(m);
        float * h = llama_get_embeddings_nextn(s->tgt);
        if (h == nullptr) {
            return -1;
        }
        std::vector<float> sorted((size_t) b->n_tokens * n_embd);
        for (size_t r = 0; r < rows.size(); r++) {
            std::copy(h + r * n_embd, h + (r + 1) * n_embd, sorted.begin() + (size_t) rows[r] * n_embd);
        }
        std::copy(sorted.begin(), sorted.end(), h);
    }
    auto * mem = llama_get_memory(s->ctx);
    llama_seq_id last = -1;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        // A sequence's tokens are one run of the batch (the scheduler's
        // entries), so its first row is the one after another sequence's.
        if (b->seq_id[i][0] != last) {
            last = b->seq_id[i][0];
            llama_memory_seq_rm(mem, last, b->pos[i], -1);
        }
    }
    return common_speculative_process(s->spec, *b) ? 0 : -1;
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
