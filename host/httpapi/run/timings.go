package run

import "time"

// Timings are llama-server's, which the coordinator reads: CacheN counts the
// prompt's tokens kept from the slot's sequence, PromptN those evaluated.
type Timings struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
	// Speculative decoding's draft tokens verified and accepted, as
	// llama-server reports them: only where there were drafts.
	DraftN         int `json:"draft_n,omitempty"`
	DraftNAccepted int `json:"draft_n_accepted,omitempty"`
}

// NewTimings are the timings of a prompt of nPrompt tokens of which reused
// were kept and the rest evaluated in prompt, and nPred tokens generated in
// pred.
func NewTimings(nPrompt, reused int, prompt time.Duration, nPred int, pred time.Duration) *Timings {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	per := func(n int, d time.Duration) (perToken, perSecond float64) {
		if n > 0 && d > 0 {
			return ms(d) / float64(n), float64(n) / d.Seconds()
		}
		return 0, 0
	}
	evaluated := max(nPrompt-reused, 0)
	t := &Timings{CacheN: nPrompt - evaluated, PromptN: evaluated, PromptMS: ms(prompt), PredictedN: nPred, PredictedMS: ms(pred)}
	t.PromptPerTokenMS, t.PromptPerSecond = per(evaluated, prompt)
	t.PredictedPerTokenMS, t.PredictedPerSecond = per(nPred, pred)
	return t
}
