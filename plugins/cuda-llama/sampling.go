package cudallama

import "github.com/hydra-engine/hydra-engine/iface"

// Sampling is split in two: llama.cpp's samplers narrow the candidates and
// apply the temperature (sampling.cpp); the final draw takes a uniform number
// derived from the seed and the position, so that a seeded decode is a
// function of (seed, sequence): the same whether it ran in one DECODE or
// several, before or after a save and restore.

// penaltyWindow is the repeat_last_n the penalties get: 0 when none
// applies, seqCtx for -1 (the whole sequence), and never more than seqCtx,
// since llama_sampler_init_penalties allocates a ring of that many tokens
// and no sequence holds more.
func penaltyWindow(p iface.SamplerParams, seqCtx int) int {
	if !p.Penalized() {
		return 0
	}
	if p.RepeatLastN < 0 || int64(p.RepeatLastN) > int64(seqCtx) {
		return max(seqCtx, 0)
	}
	return int(p.RepeatLastN)
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
