package main

import (
	"errors"
	"strings"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// lsSpecParams are llama-server's speculative-decoding parameters at the
// pinned llama.cpp (the --spec-* names; --draft-max and --draft-min were
// removed there and are refused here too, as unknown), each a llama plugin
// option.
func lsSpecParams() []lsParam {
	return []lsParam{
		{names: []string{"--spec-draft-model", "-md", "--model-draft"}, hint: "FNAME", doc: "the draft model: draft_model", apply: func(ls *lsArgs, v string) error {
			abs, err := readableFile(v)
			ls.setOpt("--spec-draft-model", llamaopt.OptDraftModel, abs)
			return err
		}},
		{names: []string{"--spec-type"}, hint: "TYPE[,TYPE…]", doc: "draft-simple, draft-mtp, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod: spec_type", apply: func(ls *lsArgs, v string) error {
			if prev := ls.opts[llamaopt.OptSpecType]; prev != "" {
				v = prev + "," + v // repeated, as llama-server appends
			}
			ls.setOpt("--spec-type", llamaopt.OptSpecType, strings.ReplaceAll(v, " ", ""))
			return nil
		}},
		{names: []string{"--spec-draft-n-max"}, hint: "N", doc: "most tokens a slot drafts a step: draft_max", apply: intOpt("--spec-draft-n-max", llamaopt.OptDraftMax, 1)},
		{names: []string{"--spec-draft-n-min"}, hint: "N", doc: "a shorter draft is dropped: draft_min", apply: intOpt("--spec-draft-n-min", llamaopt.OptDraftMin, 0)},
		{names: []string{"--spec-draft-rule"}, hint: "measured|always", doc: "measured: draft only where this device's measured step times and the slots' acceptance say drafts bring more tokens a second (default); always: each slot's most every step, as llama-server (not llama-server's): draft_rule",
			apply: func(ls *lsArgs, v string) error {
				ls.setOpt("--spec-draft-rule", llamaopt.OptDraftRule, v)
				if v != llamaopt.DraftRuleMeasured && v != llamaopt.DraftRuleAlways {
					return errors.New("measured or always")
				}
				return nil
			}},
		{names: []string{"--spec-draft-p-min", "--draft-p-min"}, hint: "P", doc: "the draft stops at a token the draft model gives less: draft_p_min", apply: floatOpt("--spec-draft-p-min", llamaopt.OptDraftPMin)},
		{names: []string{"--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"}, hint: "N|all", doc: "the draft model's layers on the GPU: draft_n_gpu_layers", apply: func(ls *lsArgs, v string) error {
			switch v {
			case "auto":
				ls.setOpt("--spec-draft-ngl", llamaopt.OptDraftNGPULayers, v)
				return errors.New("auto (fitting the model to free memory) is not done here: give a layer count or all")
			case "all":
				v = "-1"
			}
			ls.setOpt("--spec-draft-ngl", llamaopt.OptDraftNGPULayers, v)
			_, err := integer(v, -1)
			return err
		}},
		{names: []string{"--spec-ngram-simple-size-n"}, hint: "N", doc: "ngram-simple's n-gram looked up: spec_ngram_simple_size_n", apply: intOpt("--spec-ngram-simple-size-n", llamaopt.OptSpecNgramSimpleSizeN, 1)},
		{names: []string{"--spec-ngram-simple-size-m"}, hint: "N", doc: "ngram-simple's m-gram drafted: spec_ngram_simple_size_m", apply: intOpt("--spec-ngram-simple-size-m", llamaopt.OptSpecNgramSimpleSizeM, 1)},
		{names: []string{"--spec-ngram-map-k-size-n"}, hint: "N", doc: "ngram-map-k's (and -k4v's) n-gram: spec_ngram_map_k_size_n", apply: intOpt("--spec-ngram-map-k-size-n", llamaopt.OptSpecNgramMapSizeN, 1)},
		{names: []string{"--spec-ngram-map-k-size-m"}, hint: "N", doc: "ngram-map-k's (and -k4v's) m-gram: spec_ngram_map_k_size_m", apply: intOpt("--spec-ngram-map-k-size-m", llamaopt.OptSpecNgramMapSizeM, 1)},
	}
}
