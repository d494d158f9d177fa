package main

import (
	"errors"
	"slices"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// llama-server's embedding, reranking and infill parameters: the llama
// plugin's embedding options (embeddings run in a context of its own,
// plugins/cuda-llama/embed.go) and the HTTP side's spm_infill.
func lsEmbeddingParams() []lsParam {
	return []lsParam{
		{names: []string{"--embeddings", "--embedding"}, kind: lsSwitch, doc: "serve /embedding, /embeddings and /v1/embeddings: embeddings",
			apply: opt("--embeddings", llamaopt.OptEmbeddings)},
		{names: []string{"--reranking", "--rerank"}, kind: lsSwitch, doc: "serve /rerank (and /reranking, /v1/rerank, /v1/reranking): embeddings with pooling rank",
			apply: func(ls *lsArgs, v string) error {
				if v == "true" { // as llama-server, which sets both; a false switch is one not given
					ls.setOpt("--reranking", llamaopt.OptEmbeddings, "true")
					ls.setOpt("--reranking", llamaopt.OptPooling, "rank")
				}
				return nil
			}},
		{names: []string{"--pooling"}, hint: "{none,mean,cls,last,rank}", doc: "the embeddings' pooling (default: the model's): pooling",
			apply: func(ls *lsArgs, v string) error {
				ls.setOpt("--pooling", llamaopt.OptPooling, v)
				if !slices.Contains([]string{"none", "mean", "cls", "last", "rank"}, v) {
					return errors.New("want none, mean, cls, last or rank")
				}
				return nil
			}},
		{names: []string{"--embd-normalize"}, hint: "N", doc: "pooled embeddings' normalisation (-1 none, 0 max absolute, 1 taxicab, 2 euclidean, >2 p-norm): embd_normalize",
			apply: intOpt("--embd-normalize", llamaopt.OptEmbdNormalize, -1)},
		{names: []string{"--spm-infill"}, kind: lsSwitch, doc: "/infill puts the suffix before the prefix: spm_infill",
			apply: func(ls *lsArgs, v string) error {
				ls.set("--spm-infill", "spm_infill", v == "true")
				return nil
			}},
	}
}
