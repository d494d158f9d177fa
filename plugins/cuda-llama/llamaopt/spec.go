package llamaopt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
)

// Options of speculative decoding, named after llama-server's flags at the
// pinned commit (--spec-draft-model, --spec-draft-n-max, -n-min, -p-min,
// --spec-draft-ngl); without draft_model there is none.
const (
	OptDraftModel      = "draft_model"        // GGUF of the draft model, same vocabulary as the target
	OptDraftMax        = "draft_max"          // most tokens a slot drafts a step (llama-server's default 3)
	OptDraftMin        = "draft_min"          // a shorter draft is not verified (default 0)
	OptDraftPMin       = "draft_p_min"        // the draft stops at a token the draft model gives less (default 0)
	OptDraftNGPULayers = "draft_n_gpu_layers" // the draft model's layers on the GPU; -1 all (default)
	// OptSpecType is llama-server's --spec-type: a comma-separated list of
	// draft-simple (the draft model's; the default with draft_model),
	// draft-mtp (the model's own multi-token-prediction block: a qwen35moe
	// that carries one), ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod (the n-gram
	// lookups of a slot's own tokens, llama.cpp's defaults), the first that
	// drafts for a slot serving it that step.
	OptSpecType = "spec_type"
	// The n-gram sizes, as llama-server's --spec-ngram-simple-size-n/-m and
	// --spec-ngram-map-k-size-n/-m (these for ngram-map-k4v too): the
	// n-gram looked up and the m-gram after it drafted; unset, llama.cpp's
	// defaults (12 and 48).
	OptSpecNgramSimpleSizeN = "spec_ngram_simple_size_n"
	OptSpecNgramSimpleSizeM = "spec_ngram_simple_size_m"
	OptSpecNgramMapSizeN    = "spec_ngram_map_k_size_n"
	OptSpecNgramMapSizeM    = "spec_ngram_map_k_size_m"
	// OptDraftBatchMax is the most tokens one step's decoders verify in all
	// (ours, no llama-server flag): the drafts and each decoder's pending
	// token.
	OptDraftBatchMax = "draft_batch_max"
	// OptDraftRule is how a step's drafts are chosen (ours, no llama-server
	// flag): "measured" (the default) drafts only where, by the step times
	// measured on this device and each slot's acceptance, a step with
	// drafts brings more tokens a second than one without, and probes now
	// and then where it does not; "always" drafts each slot's most every
	// step, as llama-server does, each slot's share of draft_batch_max.
	OptDraftRule = "draft_rule"
)

// Draft rules (OptDraftRule).
const (
	DraftRuleMeasured = "measured"
	DraftRuleAlways   = "always"
)

// SpecOptions are the parsed speculative-decoding options.
type SpecOptions struct {
	NgramSimple, NgramMap [2]int   // size n, size m; 0: llama.cpp's
	SpecTypes             []string // none: no speculative decoding
	DraftModel            string
	DraftNGPU             int
	DraftPMin             float32
	SpecBounds            specrule.Bounds
	DraftAlways           bool // draft_rule=always
}

func defaultSpecOptions() SpecOptions {
	return SpecOptions{DraftNGPU: -1, SpecBounds: specrule.Bounds{NMax: 3, BatchMax: 32}}
}

// specOptions are the options of this file, in the table.
var specOptions = []option{
	{key: OptDraftModel, def: "none", doc: "speculative decoding with this draft GGUF (the same vocabulary)",
		parse: nonEmptyField(func(o *Options) *string { return &o.DraftModel })},
	{key: OptDraftMax, def: "3", doc: "the most tokens a slot drafts a step (llama-server's --spec-draft-n-max)",
		parse: intField(func(o *Options) *int { return &o.SpecBounds.NMax }, 1, 256)},
	{key: OptDraftMin, def: "0", doc: "a shorter draft is not verified (llama-server's --spec-draft-n-min)",
		parse: intField(func(o *Options) *int { return &o.SpecBounds.NMin }, 0, 256)},
	{key: OptDraftBatchMax, def: "32", doc: "the most tokens one step's decoders verify in all, drafts and pending tokens",
		parse: intField(func(o *Options) *int { return &o.SpecBounds.BatchMax }, 2, 1<<16)},
	{key: OptDraftNGPULayers, def: "-1", doc: "the draft model's layers on the GPU; -1: all",
		parse: intField(func(o *Options) *int { return &o.DraftNGPU }, -1, 1<<16)},
	{key: OptSpecType, def: "draft-simple with draft_model, else none", doc: "llama-server's --spec-type: draft-simple, draft-mtp, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, comma-separated",
		parse: parseSpecType},
	{key: OptSpecNgramSimpleSizeN, def: "llama.cpp's (12)", doc: "ngram-simple: the n-gram looked up",
		parse: intField(func(o *Options) *int { return &o.NgramSimple[0] }, 1, 1024)},
	{key: OptSpecNgramSimpleSizeM, def: "llama.cpp's (48)", doc: "ngram-simple: the tokens drafted after it",
		parse: intField(func(o *Options) *int { return &o.NgramSimple[1] }, 1, 1024)},
	{key: OptSpecNgramMapSizeN, def: "llama.cpp's (12)", doc: "ngram-map-k and ngram-map-k4v: the n-gram looked up",
		parse: intField(func(o *Options) *int { return &o.NgramMap[0] }, 1, 1024)},
	{key: OptSpecNgramMapSizeM, def: "llama.cpp's (48)", doc: "ngram-map-k and ngram-map-k4v: the tokens drafted after it",
		parse: intField(func(o *Options) *int { return &o.NgramMap[1] }, 1, 1024)},
	{key: OptDraftPMin, def: "0", doc: "the draft stops at a token the draft model gives less (llama-server's --spec-draft-p-min)",
		parse: parseDraftPMin},
	{key: OptDraftRule, def: "measured", doc: "measured: draft only where the step times measured here and the acceptance say it pays; always: every step, as llama-server",
		parse: parseDraftRule},
}

// DraftRule is draft_rule's value.
func (o *SpecOptions) DraftRule() string {
	if o.DraftAlways {
		return DraftRuleAlways
	}
	return DraftRuleMeasured
}

// parseDraftRule reads draft_rule.
func parseDraftRule(o *Options, key, v string) error {
	switch v {
	case DraftRuleMeasured, DraftRuleAlways:
		o.DraftAlways = v == DraftRuleAlways
		return nil
	}
	return fmt.Errorf("%w: %s=%q: %s or %s", iface.ErrBadRequest, key, v, DraftRuleMeasured, DraftRuleAlways)
}

// parseSpecType reads spec_type's comma-separated names, each once.
func parseSpecType(o *Options, key, v string) error {
	o.SpecTypes = nil
	for t := range strings.SplitSeq(v, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(specTypeNames, t) {
			return fmt.Errorf("%w: %s=%q: %q is not one of %s", iface.ErrBadRequest, key, v, t, strings.Join(specTypeNames, ", "))
		}
		if !slices.Contains(o.SpecTypes, t) {
			o.SpecTypes = append(o.SpecTypes, t)
		}
	}
	return nil
}

// parseDraftPMin reads draft_p_min, a probability.
func parseDraftPMin(o *Options, key, v string) error {
	p, err := strconv.ParseFloat(v, 32)
	if err != nil || p < 0 || p > 1 {
		return fmt.Errorf("%w: %s=%q: a probability in [0, 1]", iface.ErrBadRequest, key, v)
	}
	o.DraftPMin = float32(p)
	return nil
}

// specTypeNames are the spec_type names the plugin runs: llama.cpp's,
// less those that need a model of their own kind (eagle3, dflash, dspark)
// or lookup files (ngram-cache).
var specTypeNames = []string{"draft-simple", SpecMTP, "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}

// SpecMTP is spec_type's draft-mtp.
const SpecMTP = "draft-mtp"

// checkSpec resolves spec_type's default (draft-simple with a draft_model)
// and refuses options that contradict each other.
func (o *SpecOptions) checkSpec() error {
	if o.SpecBounds.NMin > o.SpecBounds.NMax {
		return fmt.Errorf("%w: %s=%d above %s=%d", iface.ErrBadRequest, OptDraftMin, o.SpecBounds.NMin, OptDraftMax, o.SpecBounds.NMax)
	}
	simple := slices.Contains(o.SpecTypes, "draft-simple")
	switch {
	case o.DraftModel != "" && o.SpecTypes == nil:
		o.SpecTypes = []string{"draft-simple"}
	case o.DraftModel != "" && !simple:
		return fmt.Errorf("%w: %s is set but %s=%s leaves out draft-simple, which uses it", iface.ErrBadRequest,
			OptDraftModel, OptSpecType, strings.Join(o.SpecTypes, ","))
	case o.DraftModel == "" && simple:
		return fmt.Errorf("%w: %s=draft-simple needs %s", iface.ErrBadRequest, OptSpecType, OptDraftModel)
	case simple && o.MTP():
		// llama.cpp's draft-simple and draft-mtp each take the one draft context.
		return fmt.Errorf("%w: %s=draft-mtp drafts with the model's own MTP block and takes no %s; leave out draft-simple and %s",
			iface.ErrBadRequest, OptSpecType, OptDraftModel, OptDraftModel)
	}
	return nil
}

// MTP says whether the model's MTP block drafts (draft-MTP).
func (o *SpecOptions) MTP() bool { return slices.Contains(o.SpecTypes, SpecMTP) }
