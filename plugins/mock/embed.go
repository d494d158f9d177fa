package mock

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The mock's embeddings, for the HTTP side's /embeddings, /rerank and
// /infill tests without a model. Every token of a sequence has a hidden
// vector of EmbdDim values in [-1, 1) drawn from the running hash of the
// sequence up to it (so, as in a causal model, a token's vector depends on
// what came before it and nothing after); pooling is llama.cpp's over those
// vectors: none all of them, mean their mean, cls the first, last the
// last, rank one score in (0, 1) drawn from the whole sequence's hash (a
// reranker's softmaxed relevance). Pooled vectors are normalised as
// llama.cpp's common_embd_normalize does. Nothing is evaluated in a slot:
// embeddings leave every slot's sequence as it was.

// EmbdDim is the width of the mock's embeddings.
const EmbdDim = 32

// The mock's special tokens for prompts built of token ids: EOS, and for
// fill-in-the-middle the ASCII control bytes DLE, DC1 … NAK, which text
// rarely holds (the byte tokenizer turns those bytes into these tokens, as
// llama.cpp does a special token's text with parse_special). It adds
// nothing around a text: there is no BOS.
const (
	FIMPre = 0x10
	FIMSuf = 0x11
	FIMMid = 0x12
	FIMPad = 0x13
	FIMRep = 0x14
	FIMSep = 0x15
)

// specialTokens is BackendInfo.Special.
func specialTokens() *iface.SpecialTokens {
	return &iface.SpecialTokens{BOS: iface.NoToken, EOS: EOS, SEP: iface.NoToken,
		FIMPre: FIMPre, FIMSuf: FIMSuf, FIMMid: FIMMid, FIMPad: FIMPad, FIMRep: FIMRep, FIMSep: FIMSep}
}

// NBatch is the logical batch the mock reports, llama-server's default
// n_batch (infill's budget).
const NBatch = 2048

// Options of the embeddings, as the llama plugin names them.
const (
	// OptEmbeddings serves Embed (llama-server's --embeddings).
	OptEmbeddings = "embeddings"
	// OptPooling is the pooling (none, mean, cls, last, rank); unset, the
	// mock's "model" says mean. rank also serves /rerank (--reranking).
	OptPooling = "pooling"
	// OptEmbdNormalize is the normalisation when a request names none
	// (llama-server's --embd-normalize, default 2: euclidean).
	OptEmbdNormalize = "embd_normalize"
)

// defaultPooling is the pooling the mock's "model" has.
const defaultPooling = iface.PoolingMean

// embedOptions are the parsed embedding options.
type embedOptions struct {
	embeddings bool
	pooling    string // "": the model's
	normalize  int
}

// parseEmbedOption sets k if it is an embedding option, reporting whether
// it was one.
func (o *embedOptions) parse(k, v string) (bool, error) {
	v = strings.TrimSpace(v)
	switch k {
	case OptEmbeddings:
		b, err := iface.ParseBoolOption(k, v)
		if err != nil {
			return true, err
		}
		o.embeddings = b
	case OptPooling:
		switch v {
		case iface.PoolingNone, iface.PoolingMean, iface.PoolingCLS, iface.PoolingLast, iface.PoolingRank:
			o.pooling = v
		default:
			return true, fmt.Errorf("%w: option %s=%q: want none, mean, cls, last or rank", iface.ErrBadRequest, k, v)
		}
	case OptEmbdNormalize:
		n, err := iface.ParseIntOption(k, v, -1, 1<<16)
		if err != nil {
			return true, err
		}
		o.normalize = n
	default:
		return false, nil
	}
	return true, nil
}

// describe fills in what the options make of info: the pooling and the
// capabilities of an engine that serves embeddings.
func (o embedOptions) describe(info *iface.BackendInfo) {
	if !o.embeddings {
		return
	}
	info.Pooling = o.pooling
	if info.Pooling == "" {
		info.Pooling = defaultPooling
	}
	info.Capabilities = append(info.Capabilities, iface.CapEmbed)
	if o.pooling == iface.PoolingRank { // asked for, as llama-server's /rerank requires
		info.Capabilities = append(info.Capabilities, iface.CapRerank)
	}
}

// Embed returns each input's embedding, pooled as the options say; inputs
// longer than a slot's n_ctx are refused, as the llama plugin refuses
// those its context cannot hold.
func (b *Backend) Embed(ctx context.Context, req iface.EmbedRequest) ([]iface.Embedding, error) {
	e, err := b.engine()
	if err != nil {
		return nil, err
	}
	if e.info.Pooling == "" {
		return nil, fmt.Errorf("%w: the mock serves no embeddings without the option %s=true", iface.ErrNotImplemented, OptEmbeddings)
	}
	norm := e.embed.normalize
	if req.Normalize != nil {
		norm = *req.Normalize
	}
	out := make([]iface.Embedding, len(req.Inputs))
	for i, in := range req.Inputs {
		if err := checkInput(i, in, e.nCtx); err != nil {
			return nil, err
		}
		out[i] = iface.Embedding{Vectors: embed(in, e.info.Pooling, norm), NTokens: len(in)}
	}
	return out, sleep(ctx, e.opDelay)
}

func checkInput(i int, in []int32, nCtx int) error {
	if len(in) == 0 {
		return fmt.Errorf("%w: input[%d] is empty", iface.ErrBadRequest, i)
	}
	if len(in) > nCtx {
		return fmt.Errorf("%w: input[%d] has %d tokens, more than a sequence's n_ctx of %d", iface.ErrBadRequest, i, len(in), nCtx)
	}
	for j, t := range in {
		if t < 0 || t >= NVocab {
			return fmt.Errorf("%w: input[%d]: token %d at position %d is outside the vocabulary [0, %d)", iface.ErrBadRequest, i, t, j, NVocab)
		}
	}
	return nil
}

// embed is the embedding of one sequence.
func embed(tokens []int32, pooling string, norm int) [][]float32 {
	hidden := make([][]float32, len(tokens))
	h := uint64(hashSeed)
	for i, t := range tokens {
		h = step(h, t)
		hidden[i] = hiddenVector(h)
	}
	var pooled []float32
	switch pooling {
	case iface.PoolingNone:
		return hidden
	case iface.PoolingCLS:
		pooled = hidden[0]
	case iface.PoolingLast:
		pooled = hidden[len(hidden)-1]
	case iface.PoolingRank:
		pooled = []float32{float32(unit(mix64(h ^ kvSalt)))}
	default: // mean
		pooled = make([]float32, EmbdDim)
		for _, v := range hidden {
			for j, x := range v {
				pooled[j] += x
			}
		}
		for j := range pooled {
			pooled[j] /= float32(len(hidden))
		}
	}
	return [][]float32{Normalize(pooled, norm)}
}

// hiddenVector is the vector of the token that brought the running hash to
// h.
func hiddenVector(h uint64) []float32 {
	v := make([]float32, EmbdDim)
	for j := range v {
		v[j] = float32(2*unit(mix64(h+uint64(j+1)*golden)) - 1)
	}
	return v
}

// unit maps a hash to [0, 1).
func unit(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// Normalize is llama.cpp's common_embd_normalize, in Go for the mock: the
// vector times the inverse of its norm (-1 none, 0 the largest absolute
// value over 32760, 1 taxicab, 2 euclidean, p > 2 the p-norm), summed in
// float64 and applied in float32 as there; a zero norm gives zeros.
func Normalize(in []float32, norm int) []float32 {
	sum := 0.0
	switch {
	case norm == -1:
		sum = 1
	case norm == 0:
		for _, x := range in {
			sum = max(sum, math.Abs(float64(x)))
		}
		sum /= 32760
	case norm == 2:
		for _, x := range in {
			sum += float64(x * x)
		}
		sum = math.Sqrt(sum)
	default: // 1, p > 2 and anything below -1, as llama.cpp's default case
		for _, x := range in {
			sum += math.Pow(math.Abs(float64(x)), float64(norm))
		}
		sum = math.Pow(sum, 1/float64(norm))
	}
	var scale float32 // a float, as llama.cpp's
	if sum > 0 {
		scale = float32(1 / sum)
	}
	out := make([]float32, len(in))
	for i, x := range in {
		out[i] = x * scale
	}
	return out
}

// tokenizeText answers a Tokenize with options for a text, which the front
// end's prompts of token ids (infill, rerank) are built from: a token per
// byte, nothing added (there is no BOS), special tokens or not alike (the
// FIM tokens are bytes). Its tokens are bytes of no real tokenizer and its
// template a stand-in, so /detokenize and /apply-template are not answered.
func tokenizeText(req iface.PrefillRequest) (iface.Prompt, error) {
	if len(req.Messages) > 0 || len(req.Tokens) > 0 {
		return iface.Prompt{}, fmt.Errorf("%w: the mock backend has no tokenizer or chat template to answer /detokenize or /apply-template", iface.ErrNotImplemented)
	}
	p := iface.Prompt{Tokens: Tokenize(req.Text)}
	if req.Tokenize.WithPieces {
		for _, t := range p.Tokens {
			p.Pieces = append(p.Pieces, piece(t))
		}
	}
	return p, nil
}
