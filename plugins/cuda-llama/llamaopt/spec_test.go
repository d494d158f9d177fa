package llamaopt

import (
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestSpecOptions(t *testing.T) {
	o, err := Parse(map[string]string{OptDraftModel: "d.gguf", OptDraftMax: "8", OptDraftPMin: "0.5"})
	if err != nil || !slices.Equal(o.SpecTypes, []string{"draft-simple"}) || o.SpecBounds.NMax != 8 || o.DraftPMin != 0.5 {
		t.Fatalf("%+v, %v", o.SpecOptions, err)
	}
	if o, err = Parse(nil); err != nil || o.SpecTypes != nil || o.SpecBounds.NMax != 3 {
		t.Fatalf("defaults: %+v, %v", o.SpecOptions, err)
	}
	if o, err = Parse(map[string]string{OptSpecType: "ngram-mod, ngram-simple"}); err != nil ||
		!slices.Equal(o.SpecTypes, []string{"ngram-mod", "ngram-simple"}) {
		t.Fatalf("n-gram types: %+v, %v", o.SpecOptions, err)
	}
	if o, err = Parse(map[string]string{OptSpecType: "draft-mtp,ngram-mod"}); err != nil || !o.MTP() {
		t.Fatalf("draft-mtp: %+v, %v", o.SpecOptions, err)
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
		if _, err := Parse(bad); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%v: %v, want a bad request", bad, err)
		}
	}
}

func TestDraftRuleOption(t *testing.T) {
	for _, tc := range []struct{ v, want string }{{"", DraftRuleMeasured}, {"measured", DraftRuleMeasured}, {"always", DraftRuleAlways}} {
		opts := map[string]string{OptDraftModel: "d.gguf"}
		if tc.v != "" {
			opts[OptDraftRule] = tc.v
		}
		o, err := Parse(opts)
		if err != nil || o.DraftRule() != tc.want || o.DraftAlways != (tc.want == DraftRuleAlways) {
			t.Errorf("%q: %q, %v", tc.v, o.DraftRule(), err)
		}
	}
	if _, err := Parse(map[string]string{OptDraftModel: "d.gguf", OptDraftRule: "often"}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("draft_rule=often: %v", err)
	}
}
