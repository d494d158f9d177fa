package llamaopt

import (
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Options of the embeddings (Embed; llama-server's --embeddings,
// --reranking, --pooling, --embd-normalize).
const (
	// OptEmbeddings: true serves Embed, in a llama.cpp context of its own
	// beside the slots' (embed.go), so that embeddings never take or touch a
	// slot's KV cells.
	OptEmbeddings = "embeddings"
	// OptPooling is how a sequence's embeddings are pooled: none, mean, cls,
	// last or rank (a classifier head's scores, for /rerank); unset, as the
	// model's GGUF says (none where it says nothing).
	OptPooling = "pooling"
	// OptEmbdNormalize is the normalisation of pooled embeddings when a
	// request names none: -1 none, 0 max absolute (int16), 1 taxicab, 2
	// euclidean (the default), p > 2 p-norm, as llama-server's.
	OptEmbdNormalize = "embd_normalize"
	// OptEmbdCtx is the KV cells of the embedding context where inputs may
	// span several batches (last pooling): the longest input, all inputs
	// of a batch of them together; default: a slot's cells, llama-server's
	// limit. Other poolings take an input in one physical batch (n_ubatch),
	// as llama-server does, and the context holds n_ubatch cells.
	OptEmbdCtx = "embd_ctx"
)

// EmbedOptions are the parsed embedding options; the zero value serves
// none.
type EmbedOptions struct {
	Embeddings bool
	Pooling    int // llama_pooling_type; PoolingUnspecified: the model's
	Normalize  int
	EmbdCtx    int // 0: a slot's cells
}

// llama_pooling_type's values.
const (
	PoolingUnspecified = -1
	PoolingNone        = 0
	PoolingMean        = 1
	PoolingCLS         = 2
	PoolingLast        = 3
	PoolingRank        = 4
)

var poolingNames = map[int]string{PoolingNone: iface.PoolingNone, PoolingMean: iface.PoolingMean, PoolingCLS: iface.PoolingCLS,
	PoolingLast: iface.PoolingLast, PoolingRank: iface.PoolingRank}

// PoolingName is BackendInfo.Pooling of llama_pooling_type p.
func PoolingName(p int) string { return poolingNames[p] }

func defaultEmbedOptions() EmbedOptions {
	return EmbedOptions{Pooling: PoolingUnspecified, Normalize: 2}
}

// embedOptions are the options of this file, in the table.
var embedOptions = []option{
	{key: OptEmbeddings, def: "false", doc: "serve embeddings, in a llama.cpp context of its own beside the slots' (llama-server's --embeddings)",
		parse: boolField(func(o *Options) *bool { return &o.Embeddings })},
	{key: OptPooling, def: "the model's", doc: "embedding pooling: none, mean, cls, last or rank (rank serves /rerank)",
		parse: func(o *Options, key, v string) error {
			for p, name := range poolingNames {
				if strings.EqualFold(v, name) {
					o.Pooling = p
					return nil
				}
			}
			return fmt.Errorf("%w: option %s=%q: want none, mean, cls, last or rank", iface.ErrBadRequest, key, v)
		}},
	{key: OptEmbdNormalize, def: "2", doc: "normalisation of pooled embeddings: -1 none, 0 max absolute, 1 taxicab, 2 euclidean, p > 2 p-norm",
		parse: intField(func(o *Options) *int { return &o.Normalize }, -1, 1<<16)},
	{key: OptEmbdCtx, def: "a slot's cells", doc: "KV cells of the embedding context where an input may span several batches (last pooling)",
		parse: intField(func(o *Options) *int { return &o.EmbdCtx }, 1, maxNCtx)},
}
