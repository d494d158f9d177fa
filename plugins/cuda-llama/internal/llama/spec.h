// C interface of spec.cpp: speculative decoding's drafting through
// llama.cpp's common library (common/speculative.h): its draft-simple
// implementation over a draft model's context, whose sequence i is slot i,
// its draft-mtp over the target's own multi-token-prediction block, and its
// n-gram lookups over each slot's own tokens.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hydra_spec hydra_spec;

struct hydra_spec_params {
    uint32_t n_ctx;    // the draft context's cells, shared by its sequences
    uint32_t n_batch;  // tokens one catch-up llama_decode takes
    uint32_t n_seq;    // the slots
    int32_t n_threads;
    int32_t n_max;     // draft_max: no draft is longer
    int32_t n_min;     // draft_min: a shorter draft is dropped
    float p_min;       // draft_p_min: the draft stops at a less likely token
    const char * types;  // llama-server's --spec-type: comma-separated names
    // --spec-ngram-simple-size-n/-m and --spec-ngram-map-k-size-n/-m (the
    // k4v map's too); 0: llama.cpp's default
    uint16_t ngram_simple_n, ngram_simple_m, ngram_map_n, ngram_map_m;
    // draft-mtp: the draft context is an MTP context over the target's
    // model (loaded with load_mtp), fed by hydra_spec_process
    int32_t mtp;
};

// hydra_spec_new makes llama.cpp's speculative state of p->types beside the
// target context tgt, with the draft context of dft (a loaded model, owned
// by the caller; NULL: n-gram types only, or p->mtp); NULL with a message in
// err when llama.cpp refuses (e.g. the vocabularies differ).
hydra_spec * hydra_spec_new(struct llama_model * dft, struct llama_context * tgt, const struct hydra_spec_params * p,
                            char * err, size_t err_len);
void hydra_spec_free(hydra_spec * s);

// hydra_spec_begin starts sequence seq's generation after prompt (the
// n-gram maps index it).
void hydra_spec_begin(hydra_spec * s, int32_t seq, const llama_token * prompt, int32_t n);

// hydra_spec_accept tells the implementation that drafted seq's last draft
// how many of its tokens the target accepted.
void hydra_spec_accept(hydra_spec * s, int32_t seq, int32_t n_accepted);

// hydra_spec_pos_max is the last position of seq the draft context holds;
// -1 when none or without a draft context.
int32_t hydra_spec_pos_max(hydra_spec * s, int32_t seq);

// hydra_spec_seq_rm removes sequence seq's draft cells from position p0 on
// (p0 = 0: all of them).
void hydra_spec_seq_rm(hydra_spec * s, int32_t seq, int32_t p0);

// hydra_spec_ctx is the draft model's context; NULL without a draft model.
struct llama_context * hydra_spec_ctx(hydra_spec * s);

// hydra_spec_eval evaluates n tokens (toks at pos in seqs) in the draft
// context, no logits, in batches of n_batch; 0 when all were, else
// llama_decode's code.
int hydra_spec_eval(hydra_spec * s, const llama_token * toks, const llama_pos * pos, const llama_seq_id * seqs, int32_t n);

// hydra_spec_process hands a batch the target context just evaluated to the
// MTP context (draft-mtp): each sequence's cells from the batch's first
// position of it on are removed, then the batch's tokens are evaluated with
// the target's hidden states of the positions before them, so that the MTP
// context holds what the target does. 0 when done (or nothing to do), else
// -1.
int hydra_spec_process(hydra_spec * s, const struct llama_batch * b);

// hydra_spec_draft drafts for n sequences at once: sequence seqs[i], whose
// draft context holds positions [0, n_past[i]), continues after id_last[i]
// (evaluated at n_past[i] first) with at most n_max[i] tokens, written to
// out[i*stride ...] with their count in n_out[i]. With hist (n-gram types)
// sequence i's tokens so far are hist[hist_off[i] .. hist_off[i+1]).
void hydra_spec_draft(hydra_spec * s, int32_t n, const llama_seq_id * seqs, const llama_pos * n_past,
                      const llama_token * id_last, const int32_t * n_max, const llama_token * hist,
                      const int32_t * hist_off, llama_token * out, int32_t stride, int32_t * n_out);

#ifdef __cplusplus
}
#endif
