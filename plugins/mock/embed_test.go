package mock

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func euclid(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// TestEmbedPoolings: each pooling over the hidden vectors, normalised to
// euclidean norm 1 unless asked otherwise, pooling none as it is; a batch
// gives each input what it gets alone; the slots keep their sequences.
func TestEmbedPoolings(t *testing.T) {
	ctx := context.Background()
	in := [][]int32{Tokenize("hello world"), Tokenize("x"), Tokenize("hello")}
	for _, pooling := range []string{"", iface.PoolingNone, iface.PoolingMean, iface.PoolingCLS, iface.PoolingLast, iface.PoolingRank} {
		opts := map[string]string{OptEmbeddings: "true"}
		if pooling != "" {
			opts[OptPooling] = pooling
		}
		b := newLoaded(t, 2, opts)
		info, _ := b.Info(ctx)
		want := pooling
		if want == "" {
			want = iface.PoolingMean
		}
		if info.Pooling != want || !slices.Contains(info.Capabilities, iface.CapEmbed) ||
			slices.Contains(info.Capabilities, iface.CapRerank) != (pooling == iface.PoolingRank) {
			t.Errorf("pooling %q: info says %q %v", pooling, info.Pooling, info.Capabilities)
		}
		prefillTokens(t, b, 1, Tokenize("kept"))
		batch, err := b.Embed(ctx, iface.EmbedRequest{Inputs: in})
		if err != nil {
			t.Fatalf("pooling %q: %v", pooling, err)
		}
		for i, e := range batch {
			alone, err := b.Embed(ctx, iface.EmbedRequest{Inputs: in[i : i+1]})
			if err != nil || !reflect.DeepEqual(alone[0], e) {
				t.Errorf("pooling %q input %d: alone %v %v, batched %v", pooling, i, alone, err, e)
			}
			if e.NTokens != len(in[i]) {
				t.Errorf("pooling %q input %d: %d tokens, want %d", pooling, i, e.NTokens, len(in[i]))
			}
			switch want {
			case iface.PoolingNone:
				if len(e.Vectors) != len(in[i]) || len(e.Vectors[0]) != EmbdDim {
					t.Errorf("pooling none input %d: %d vectors of %d", i, len(e.Vectors), len(e.Vectors[0]))
				}
			case iface.PoolingRank:
				if len(e.Vectors) != 1 || len(e.Vectors[0]) != 1 {
					t.Errorf("rank input %d: %v", i, e.Vectors)
				}
			default:
				if len(e.Vectors) != 1 || len(e.Vectors[0]) != EmbdDim || math.Abs(euclid(e.Vectors[0])-1) > 1e-6 {
					t.Errorf("pooling %s input %d: %d vectors, norm %v", want, i, len(e.Vectors), euclid(e.Vectors[0]))
				}
			}
		}
		if si := slotInfo(t, b, 1); string(tokensText(si.Tokens)) != "kept" {
			t.Errorf("pooling %q: slot 1 holds %q after embedding", pooling, tokensText(si.Tokens))
		}
		if si := slotInfo(t, b, 0); si.NPast != 0 {
			t.Errorf("pooling %q: slot 0 holds %d tokens after embedding", pooling, si.NPast)
		}
	}
}

func tokensText(toks []int32) []byte {
	b := make([]byte, len(toks))
	for i, t := range toks {
		b[i] = byte(t)
	}
	return b
}

// TestEmbedCausal: with mean pooling an input's embedding depends on every
// token, with cls only on the first, and the first token's vector is the
// same whatever follows it (each vector depends on what came before).
func TestEmbedCausal(t *testing.T) {
	ctx := context.Background()
	for pooling, sameForPrefix := range map[string]bool{iface.PoolingMean: false, iface.PoolingCLS: true, iface.PoolingLast: false} {
		b := newLoaded(t, 1, map[string]string{OptEmbeddings: "1", OptPooling: pooling})
		got, err := b.Embed(ctx, iface.EmbedRequest{Inputs: [][]int32{Tokenize("ab"), Tokenize("ac")}})
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(got[0], got[1]) != sameForPrefix {
			t.Errorf("pooling %s: \"ab\" and \"ac\" alike %v, want %v", pooling, !sameForPrefix, sameForPrefix)
		}
	}
	b := newLoaded(t, 1, map[string]string{OptEmbeddings: "1", OptPooling: iface.PoolingNone})
	got, err := b.Embed(ctx, iface.EmbedRequest{Inputs: [][]int32{Tokenize("ab"), Tokenize("ac")}})
	if err != nil || !reflect.DeepEqual(got[0].Vectors[0], got[1].Vectors[0]) || reflect.DeepEqual(got[0].Vectors[1], got[1].Vectors[1]) {
		t.Errorf("pooling none: %v %v", got, err)
	}
}

// TestNormalize holds Normalize to llama.cpp's rules on vectors whose norms
// are known.
func TestNormalize(t *testing.T) {
	v := []float32{3, -4}
	for _, c := range []struct {
		norm int
		want []float32
	}{
		{-1, []float32{3, -4}},
		{0, []float32{3 * 32760 / 4.0, -32760}},
		{1, []float32{3 / 7.0, -4 / 7.0}},
		{2, []float32{0.6, -0.8}},
		{3, []float32{float32(3 / math.Cbrt(91)), float32(-4 / math.Cbrt(91))}},
	} {
		got := Normalize(v, c.norm)
		for i := range got {
			if math.Abs(float64(got[i]-c.want[i])) > 1e-3*math.Max(1, math.Abs(float64(c.want[i]))) {
				t.Errorf("norm %d: %v, want %v", c.norm, got, c.want)
				break
			}
		}
	}
	if got := Normalize([]float32{0, 0}, 2); !reflect.DeepEqual(got, []float32{0, 0}) {
		t.Errorf("zero vector: %v", got)
	}
}

// TestEmbedNormalizeOption: the option is the default, a request's value
// wins over it.
func TestEmbedNormalizeOption(t *testing.T) {
	ctx := context.Background()
	b := newLoaded(t, 1, map[string]string{OptEmbeddings: "true", OptEmbdNormalize: "-1"})
	raw, _ := b.Embed(ctx, iface.EmbedRequest{Inputs: [][]int32{Tokenize("abc")}})
	two := 2
	unit, _ := b.Embed(ctx, iface.EmbedRequest{Inputs: [][]int32{Tokenize("abc")}, Normalize: &two})
	if n := euclid(raw[0].Vectors[0]); math.Abs(n-1) < 1e-3 {
		t.Errorf("embd_normalize=-1 gave a unit vector")
	}
	if !reflect.DeepEqual(Normalize(raw[0].Vectors[0], 2), unit[0].Vectors[0]) {
		t.Errorf("normalize 2 over the option: %v, want the raw vector normalised", unit[0].Vectors[0])
	}
}

// TestEmbedRefusals: no embeddings without the option; bad inputs named.
func TestEmbedRefusals(t *testing.T) {
	ctx := context.Background()
	if _, err := newLoaded(t, 1, nil).Embed(ctx, iface.EmbedRequest{Inputs: [][]int32{{1}}}); !errors.Is(err, iface.ErrNotImplemented) {
		t.Errorf("without embeddings: %v", err)
	}
	b := newLoaded(t, 1, map[string]string{OptEmbeddings: "true", OptNCtx: "8"})
	for _, c := range []struct {
		in   [][]int32
		want string
	}{
		{[][]int32{{1}, {}}, "input[1] is empty"},
		{[][]int32{{1, NVocab}}, "input[0]: token 257"},
		{[][]int32{make([]int32, 9)}, "input[0] has 9 tokens"},
	} {
		_, err := b.Embed(ctx, iface.EmbedRequest{Inputs: c.in})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.in, err, c.want)
		}
	}
	for k, v := range map[string]string{OptEmbeddings: "maybe", OptPooling: "max", OptEmbdNormalize: "two"} {
		if _, err := New(nil).Load(ctx, iface.LoadRequest{Options: map[string]string{k: v}}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), k) {
			t.Errorf("option %s=%s: %v", k, v, err)
		}
	}
}
