package cudallama

import (
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestSpecOptions(t *testing.T) {
	o, err := parseOptions(map[string]string{OptDraftModel: "d.gguf", OptDraftMax: "8", OptDraftPMin: "0.5"})
	if err != nil || !slices.Equal(o.specTypes, []string{"draft-simple"}) || o.specBounds.NMax != 8 || o.draftPMin != 0.5 {
		t.Fatalf("%+v, %v", o.specOptions, err)
	}
	if o, err = parseOptions(nil); err != nil || o.specTypes != nil || o.specBounds.NMax != 3 {
		t.Fatalf("defaults: %+v, %v", o.specOptions, err)
	}
	if o, err = parseOptions(map[string]string{OptSpecType: "ngram-mod, ngram-simple"}); err != nil ||
		!slices.Equal(o.specTypes, []string{"ngram-mod", "ngram-simple"}) {
		t.Fatalf("n-gram types: %+v, %v", o.specOptions, err)
	}
	if o, err = parseOptions(map[string]string{OptSpecType: "draft-mtp,ngram-mod"}); err != nil || !o.mtp() {
		t.Fatalf("draft-mtp: %+v, %v", o.specOptions, err)
	}
	for _, bad := range []map[string]string{
		{OptDraftMin: "4", OptDraftMax: "2"},
		{OptDraftPMin: "1.5"},
		{OptSpecType: "draft-eagle3"},
		{OptSpecType: "draft-simple"},
		{OptDraftModel: "d.gguf", OptSpecType: "ngram-mod"},
		{OptDraftModel: "d.gguf", OptSpecType: "draft-mtp"},
		{OptDraftModel: "d.gguf", OptSpecType: "draft-simple,draft-mtp"},
		{OptDraftBatchMax: "1"},
	} {
		if _, err := parseOptions(bad); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%v: %v, want a bad request", bad, err)
		}
	}
}

func TestRequestBounds(t *testing.T) {
	sp := iface.NoSpeculativeOverride
	if m, n, off := requestBounds(&sp); m != 0 || n != 0 || off {
		t.Errorf("no override: %d %d %v", m, n, off)
	}
	sp.NMax, sp.NMin = 5, 2
	if m, n, off := requestBounds(&sp); m != 5 || n != 2 || off {
		t.Errorf("5, 2: %d %d %v", m, n, off)
	}
	sp.NMax = 0
	if _, _, off := requestBounds(&sp); !off {
		t.Error("n_max 0 leaves drafting on")
	}
	if m, n, off := requestBounds(nil); m != 0 || n != 0 || off {
		t.Errorf("nil: %d %d %v", m, n, off)
	}
}

func TestDraftRuleOption(t *testing.T) {
	for _, tc := range []struct{ v, want string }{{"", DraftRuleMeasured}, {"measured", DraftRuleMeasured}, {"always", DraftRuleAlways}} {
		opts := map[string]string{OptDraftModel: "d.gguf"}
		if tc.v != "" {
			opts[OptDraftRule] = tc.v
		}
		o, err := parseOptions(opts)
		if err != nil || o.draftRule() != tc.want || o.draftAlways != (tc.want == DraftRuleAlways) {
			t.Errorf("%q: %q, %v", tc.v, o.draftRule(), err)
		}
	}
	if _, err := parseOptions(map[string]string{OptDraftModel: "d.gguf", OptDraftRule: "often"}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("draft_rule=often: %v", err)
	}
}
