//go:build llama && cgo

// A slot's sampler: llama.cpp's samplers narrow and reshape the candidates;
// the draw takes its uniform number from the Go side, a function of the seed
// and the position, so that a seeded decode is the same whether it ran in one
// DECODE or several, batched or alone, before or after a save and restore.

#include "sampling.h"

#include "reasoning-budget.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

struct hydra_sampler {
    int32_t n_vocab = 0;
    bool greedy = true;
    llama_sampler * chain = nullptr;  // NULL: nothing changes the raw logits
    // grammar (hydra_sampler_set_grammar) masks the candidates before the
    // chain and sees only the tokens accepted after it was set.
    llama_sampler * grammar = nullptr;
    // rbudget (hydra_sampler_set_reasoning_budget) masks the candidates
    // before the grammar; gate_grammar holds a lazy grammar off while it
    // counts or forces, as common_sampler's grammar_should_apply.
    llama_sampler * rbudget = nullptr;
    bool gate_grammar = false;
    std::vector<llama_token_data> cur;
};

namespace {

void add(llama_sampler *& chain, llama_sampler * s) {
    if (chain == nullptr) {
        chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    }
    llama_sampler_chain_add(chain, s);
}

// biases are the request's, then -inf on every end-of-generation token.
std::vector<llama_logit_bias> biases(const llama_vocab * vocab, const hydra_sampler_params * p, int32_t n_vocab) {
    std::vector<llama_logit_bias> out(p->bias, p->bias + p->n_bias);
    if (p->ignore_eos) {
        for (llama_token t = 0; t < n_vocab; t++) {
            if (llama_vocab_is_eog(vocab, t)) {
                out.push_back({t, -INFINITY});
            }
        }
    }
    return out;
}

// grammar_applies is whether the grammar masks the next token and takes
// the one accepted: always, unless it is gated and the reasoning budget is
// inside a reasoning block (common_sampler's grammar_should_apply).
bool grammar_applies(const hydra_sampler * s) {
    if (s->grammar == nullptr) {
        return false;
    }
    if (s->rbudget == nullptr || !s->gate_grammar) {
        return true;
    }
    const auto st = common_reasoning_budget_get_state(s->rbudget);
    return st == REASONING_BUDGET_IDLE || st == REASONING_BUDGET_DONE;
}

// grammar_accept advances the grammar; a token it refuses (every candidate
// was masked) drops it, so that no exception crosses into Go.
void grammar_accept(hydra_sampler * s, llama_token tok) {
    try {
        llama_sampler_accept(s->grammar, tok);
    } catch (...) {
        llama_sampler_free(s->grammar);
        s->grammar = nullptr;
    }
}

// argmax is the first candidate with the largest logit.
size_t argmax(const llama_token_data * d, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++) {
        if (d[i].logit > d[best].logit) {
            best = i;
        }
    }
    return best;
}

size_t draw(const llama_token_data * d, size_t n, double u) {
    float m = d[argmax(d, n)].logit;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += std::exp((double) (d[i].logit - m));
    }
    const double target = u * sum;
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += std::exp((double) (d[i].logit - m));
        if (acc > target) {
            return i;
        }
    }
    return argmax(d, n);  // rounding left u·sum just past the total
}

// log_norm is log Σ exp(logits - max) and the max, over the raw logits.
std::pair<double, float> log_norm(const float * logits, int32_t n) {
    float m = logits[0];
    for (int32_t i = 1; i < n; i++) {
        m = std::max(m, logits[i]);
    }
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        sum += std::exp((double) (logits[i] - m));
    }
    return {std::log(sum), m};
}

// raw_argmax is the first index of the largest of n logits: the greedy
// pick, every step of every greedy slot, so the maximum is found four lanes
// at a time (SSE2 is in every x86-64), then its first occurrence.
llama_token raw_argmax(const float * x, int32_t n) {
    float m = -INFINITY;
    int32_t i = 0;
#if defined(__SSE2__)
    __m128 a = _mm_set1_ps(-INFINITY), b = a;
    for (; i + 8 <= n; i += 8) {
        a = _mm_max_ps(a, _mm_loadu_ps(x + i));
        b = _mm_max_ps(b, _mm_loadu_ps(x + i + 4));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(a, b));
    m = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
#endif
    for (; i < n; i++) {
        m = std::max(m, x[i]);
    }
    for (int32_t j = 0; j < n; j++) {
        if (x[j] == m) {
            return j;
        }
    }
    return 0;  // no logit compares equal to the maximum: all NaN
}

// top_n stores the n most likely tokens, most likely first (ties: lower id).
int32_t top_n(const float * logits, int32_t n_vocab, int32_t n, llama_token * ids) {
    n = std::min(n, n_vocab);
    std::vector<llama_token> heap;  // the n best so far, worst at the front
    heap.reserve(n + 1);
    auto worse = [logits](llama_token a, llama_token b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    for (llama_token t = 0; t < n_vocab; t++) {
        if ((int32_t) heap.size() < n) {
            heap.push_back(t);
            std::push_heap(heap.begin(), heap.end(), worse);
        } else if (worse(t, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), worse);
            heap.back() = t;
            std::push_heap(heap.begin(), heap.end(), worse);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), worse);
    std::copy(heap.begin(), heap.end(), ids);
    return (int32_t) heap.size();
}

}  // namespace

extern "C" {

hydra_sampler * hydra_sampler_new(const llama_vocab * vocab, const hydra_sampler_params * p) {
    auto * s = new (std::nothrow) hydra_sampler;
    if (s == nullptr) {
        return nullptr;
    }
    try {
        s->n_vocab = llama_vocab_n_tokens(vocab);
        s->greedy = !(p->temp > 0);
        const auto b = biases(vocab, p, s->n_vocab);
        if (!b.empty()) {
            add(s->chain, llama_sampler_init_logit_bias(s->n_vocab, (int32_t) b.size(), b.data()));
        }
        if (p->repeat_last_n > 0) {
            add(s->chain, llama_sampler_init_penalties(s->n_vocab, p->repeat_last_n, p->repeat_penalty > 0 ? p->repeat_penalty : 1.0f,
                                                       p->frequency_penalty, p->presence_penalty));
        }
        if (!s->greedy) {
            if (p->top_k > 0) {
                add(s->chain, llama_sampler_init_top_k(p->top_k));
            }
            if (p->top_p > 0 && p->top_p < 1) {
                add(s->chain, llama_sampler_init_top_p(p->top_p, 1));
            }
            if (p->min_p > 0) {
                add(s->chain, llama_sampler_init_min_p(p->min_p, 1));
            }
            add(s->chain, llama_sampler_init_temp(p->temp));
        }
        if (s->chain != nullptr) {
            s->cur.resize(s->n_vocab);
        }
    } catch (...) {
        hydra_sampler_free(s);
        return nullptr;
    }
    return s;
}

void hydra_sampler_free(hydra_sampler * s) {
    if (s == nullptr) {
        return;
    }
    if (s->chain != nullptr) {
        llama_sampler_free(s->chain);
    }
    if (s->grammar != nullptr) {
        llama_sampler_free(s->grammar);
    }
    if (s->rbudget != nullptr) {
        llama_sampler_free(s->rbudget);
    }
    delete s;
}

void hydra_sampler_set_grammar(hydra_sampler * s, llama_sampler * grammar) {
    if (s->grammar != nullptr) {
        llama_sampler_free(s->grammar);
    }
    s->grammar = grammar;
    s->cur.resize(s->n_vocab);
}

void hydra_sampler_set_reasoning_budget(hydra_sampler * s, llama_sampler * rb, int gate_grammar) {
    if (s->rbudget != nullptr) {
        llama_sampler_free(s->rbudget);
    }
    s->rbudget = rb;
    s->gate_grammar = gate_grammar != 0;
    s->cur.resize(s->n_vocab);
}

void hydra_sampler_accept(hydra_sampler * s, llama_token tok) {
    // Whether the grammar takes tok is decided before the budget sees it,
    // as common_sampler_accept does: the token that ends the reasoning is
    // the grammar's only through the end sequence replayed below.
    const bool to_grammar = grammar_applies(s);
    if (s->rbudget != nullptr) {
        llama_sampler_accept(s->rbudget, tok);
        if (s->grammar != nullptr && !to_grammar && common_reasoning_budget_get_state(s->rbudget) == REASONING_BUDGET_DONE) {
            if (const llama_tokens * end = common_reasoning_budget_get_end_match(s->rbudget)) {
                for (const llama_token t : *end) {
                    if (s->grammar != nullptr) {
                        grammar_accept(s, t);
                    }
                }
            }
        }
    }
    if (s->chain != nullptr) {
        llama_sampler_accept(s->chain, tok);
    }
    if (to_grammar && s->grammar != nullptr) {
        grammar_accept(s, tok);
    }
}

llama_token hydra_sample(hydra_sampler * s, const float * logits, double u, float * logprob,
                         int32_t n_top, llama_token * top_ids, float * top_lp, int32_t * n_top_out) {
    llama_token tok;
    if (s->chain == nullptr && s->grammar == nullptr && s->rbudget == nullptr) {
        tok = raw_argmax(logits, s->n_vocab);  // plain greedy: no candidate array to fill
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            s->cur[i] = {i, logits[i], 0.0f};
        }
        llama_token_data_array arr = {s->cur.data(), (size_t) s->n_vocab, -1, false};
        if (s->rbudget != nullptr) {
            llama_sampler_apply(s->rbudget, &arr);
        }
        if (grammar_applies(s)) {
            llama_sampler_apply(s->grammar, &arr);
        }
        if (s->chain != nullptr) {
            llama_sampler_apply(s->chain, &arr);
        }
        const size_t k = s->greedy ? argmax(arr.data, arr.size) : draw(arr.data, arr.size, u);
        tok = arr.data[k].id;
    }
    if (logprob != nullptr || n_top > 0) {
        const auto [ln, m] = log_norm(logits, s->n_vocab);
        if (logprob != nullptr) {
            *logprob = (float) ((double) (logits[tok] - m) - ln);
        }
        if (n_top > 0) {
            const int32_t n = top_n(logits, s->n_vocab, n_top, top_ids);
            for (int32_t i = 0; i < n; i++) {
                top_lp[i] = (float) ((double) (logits[top_ids[i]] - m) - ln);
            }
            *n_top_out = n;
        }
    }
    return tok;
}

}  // extern "C"
