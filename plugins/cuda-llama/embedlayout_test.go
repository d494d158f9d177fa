package cudallama

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// TestEmbedLayout: last pooling over a KV cache splits inputs across
// batches up to a slot's cells (or embd_ctx); every other pooling takes an
// input in one physical batch, as llama-server does.
func TestEmbedLayout(t *testing.T) {
	for _, c := range []struct {
		name              string
		pooling           int
		memory            bool
		slotCtx, ub, embd int
		want              embedLayout
		fits, refused     int
		refusal           string
	}{
		{"mean", llamaopt.PoolingMean, true, 4096, 512, 0, embedLayout{cells: 512, batch: 512, seqs: embedSeqs}, 512, 513, "more than the physical batch of 512"},
		{"rank", llamaopt.PoolingRank, true, 4096, 512, 9999, embedLayout{cells: 512, batch: 512, seqs: embedSeqs}, 512, 513, "n_ubatch"},
		{"small slot", llamaopt.PoolingCLS, true, 256, 512, 0, embedLayout{cells: 256, batch: 256, seqs: embedSeqs}, 256, 257, "physical batch of 256"},
		{"last", llamaopt.PoolingLast, true, 4096, 512, 0, embedLayout{split: true, cells: 4096, batch: 512, seqs: embedSeqs}, 4095, 4096, "holds 4096"},
		{"last, embd_ctx", llamaopt.PoolingLast, true, 4096, 512, 1024, embedLayout{split: true, cells: 1024, batch: 512, seqs: embedSeqs}, 1023, 1024, "embd_ctx"},
		{"last without a cache", llamaopt.PoolingLast, false, 4096, 512, 0, embedLayout{cells: 512, batch: 512, seqs: embedSeqs}, 512, 513, "n_ubatch"},
	} {
		l := newEmbedLayout(c.pooling, c.memory, c.slotCtx, c.ub, c.embd)
		if !reflect.DeepEqual(l, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, l, c.want)
		}
		if err := l.check(0, c.fits); err != nil {
			t.Errorf("%s: %d tokens refused: %v", c.name, c.fits, err)
		}
		if err := l.check(3, c.refused); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), c.refusal) ||
			!strings.Contains(err.Error(), "input[3]") {
			t.Errorf("%s: %d tokens: %v, want %q", c.name, c.refused, err, c.refusal)
		}
		if err := l.check(1, 0); err == nil || !strings.Contains(err.Error(), "input[1] is empty") {
			t.Errorf("%s: empty input: %v", c.name, err)
		}
	}
}

// TestEmbedGroups: passes of consecutive inputs within the cells and the
// sequence count, none empty.
func TestEmbedGroups(t *testing.T) {
	l := embedLayout{cells: 10, batch: 10, seqs: 3}
	for _, c := range []struct {
		lens []int
		want [][2]int
	}{
		{nil, nil},
		{[]int{10}, [][2]int{{0, 1}}},
		{[]int{4, 6, 1}, [][2]int{{0, 2}, {2, 3}}},
		{[]int{1, 1, 1, 1, 1, 1, 1}, [][2]int{{0, 3}, {3, 6}, {6, 7}}},
		{[]int{9, 2, 9, 1}, [][2]int{{0, 1}, {1, 2}, {2, 4}}},
	} {
		if got := l.groups(c.lens); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%v: %v, want %v", c.lens, got, c.want)
		}
	}
}
