// C interface of spec.cpp: speculative decoding's draft model through
// llama.cpp's common library (common/speculative.h, its draft-simple
// implementation), one draft context whose sequence i is slot i.
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
};

// hydra_spec_new makes the draft context of dft (a loaded model, owned by
// the caller) beside the target context tgt and llama.cpp's speculative
// state over it; NULL with a message in err when llama.cpp refuses (e.g.
// the vocabularies differ).
hydra_spec * hydra_spec_new(struct llama_model * dft, struct llama_context * tgt, const struct hydra_spec_params * p,
                            char * err, size_t err_len);
void hydra_spec_free(hydra_spec * s);

// hydra_spec_seq_rm removes sequence seq's draft cells from position p0 on
// (p0 = 0: all of them).
void hydra_spec_seq_rm(hydra_spec * s, int32_t seq, int32_t p0);

// hydra_spec_eval evaluates n tokens (toks at pos in seqs) in the draft
// context, no logits, in batches of n_batch; 0 when all were, else
// llama_decode's code.
int hydra_spec_eval(hydra_spec * s, const llama_token * toks, const llama_pos * pos, const llama_seq_id * seqs, int32_t n);

// hydra_spec_draft drafts for n sequences at once: sequence seqs[i], whose
// draft context holds positions [0, n_past[i]), continues after id_last[i]
// (evaluated at n_past[i] first) with at most n_max[i] tokens, written to
// out[i*stride ...] with their count in n_out[i].
void hydra_spec_draft(hydra_spec * s, int32_t n, const llama_seq_id * seqs, const llama_pos * n_past,
                      const llama_token * id_last, const int32_t * n_max, llama_token * out, int32_t stride,
                      int32_t * n_out);

#ifdef __cplusplus
}
#endif
