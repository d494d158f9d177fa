// C interface of sampling.cpp: a slot's sampler chain over llama.cpp's
// samplers, and the token draw. Plain C, so cgo can call it.
#pragma once

#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hydra_sampler hydra_sampler;

struct hydra_sampler_params {
    float temp;  // <= 0: greedy
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t repeat_last_n;  // > 0 when a penalty applies
    float presence_penalty;
    float frequency_penalty;
    int ignore_eos;
    const llama_logit_bias * bias;  // copied
    int32_t n_bias;
};

// hydra_sampler_new builds the chain for p over vocab (n_vocab tokens):
// logit biases (and -inf on end-of-generation tokens with ignore_eos), the
// penalties, then, unless greedy, top-k, top-p, min-p and the temperature.
// NULL when out of memory.
hydra_sampler * hydra_sampler_new(const struct llama_vocab * vocab, const struct hydra_sampler_params * p);
void hydra_sampler_free(hydra_sampler * s);

// hydra_sampler_set_grammar gives s the grammar sampler g (owned from now
// on): it masks the candidates first, and advances on each token accepted.
void hydra_sampler_set_grammar(hydra_sampler * s, struct llama_sampler * g);

// hydra_sampler_set_reasoning_budget gives s llama.cpp's reasoning-budget
// sampler rb (hydra_reasoning_budget_new, owned from now on), as
// common_sampler holds it: rb masks the candidates first, before the grammar,
// and sees only the tokens accepted after it was set. With gate_grammar (the
// grammar is lazy) the grammar neither masks nor advances while rb counts or
// forces, and takes the end sequence that closed the reasoning, which may be
// its trigger.
void hydra_sampler_set_reasoning_budget(hydra_sampler * s, struct llama_sampler * rb, int gate_grammar);

// hydra_sampler_accept adds tok to the penalties' history (and the grammar,
// and the reasoning budget).
void hydra_sampler_accept(hydra_sampler * s, llama_token tok);

// hydra_sample picks a token from logits (n_vocab of them): the arg-max of
// the chain's candidates when greedy, else a draw from their softmax with
// the uniform u in [0, 1), walking the candidates in the chain's order.
// With logprob != NULL it stores the token's log-probability under the raw
// logits; with n_top > 0 the n_top most likely tokens (raw logits, most
// likely first) and their log-probabilities go to top_ids / top_lp, and the
// count stored is returned in *n_top_out.
llama_token hydra_sample(hydra_sampler * s, const float * logits, double u, float * logprob,
                         int32_t n_top, llama_token * top_ids, float * top_lp, int32_t * n_top_out);

#ifdef __cplusplus
}
#endif
