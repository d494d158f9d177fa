package cudallama

import (
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Sampling is split in two: llama.cpp's samplers narrow the candidates
// (top-k, top-p) and apply the temperature (sampler_llama.go); the final draw
// is ours, with a uniform number derived from the seed and the position, so
// that a seeded decode is a function of (seed, sequence): the same whether it
// ran in one DECODE or several, before or after a save and restore.

// greedy reports whether p selects the arg-max.
func greedy(p iface.SamplerParams) bool {
	return !(p.Temperature > 0) // also NaN
}

// argmax is the index of the largest logit (the first of equals).
func argmax(logits []float32) int {
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	return best
}

// logprob is log softmax(logits)[i], of the raw logits (before temperature),
// as OpenAI-style logprobs report it.
func logprob(logits []float32, i int) float32 {
	m := logits[argmax(logits)]
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - m))
	}
	return float32(float64(logits[i]-m) - math.Log(sum))
}

// mix64 is the splitmix64 finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// uniform is the draw for the token at position pos: in [0, 1).
func uniform(seed uint64, pos int) float64 {
	return float64(mix64(mix64(seed+0x9E3779B97F4A7C15)^uint64(pos))>>11) / (1 << 53)
}

// pick draws from softmax(logits) with the uniform u, returning an index.
func pick(logits []float32, u float64) int {
	if len(logits) == 0 {
		return -1
	}
	m := logits[argmax(logits)]
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - m))
	}
	target := u * sum
	var acc float64
	for i, l := range logits {
		acc += math.Exp(float64(l - m))
		if acc > target {
			return i
		}
	}
	return argmax(logits) // rounding left u·sum just past the total
}
