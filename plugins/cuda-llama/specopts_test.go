package cudallama

import (
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestSpecOptions(t *testing.T) {
	o, err := parseOptions(map[string]string{OptDraftModel: "d.gguf", OptDraftMax: "8", OptDraftPMin: "0.5"})
	if err != nil || !slices.Equal(o.specTypes, []string{"draft-simple"}) || o.specRule.nMax != 8 || o.draftPMin != 0.5 {
		t.Fatalf("%+v, %v", o.specOptions, err)
	}
	if o, err = parseOptions(nil); err != nil || o.specTypes != nil || o.specRule.nMax != 3 {
		t.Fatalf("defaults: %+v, %v", o.specOptions, err)
	}
	if o, err = parseOptions(map[string]string{OptSpecType: "ngram-mod, ngram-simple"}); err != nil ||
		!slices.Equal(o.specTypes, []string{"ngram-mod", "ngram-simple"}) {
		t.Fatalf("n-gram types: %+v, %v", o.specOptions, err)
	}
	for _, bad := range []map[string]string{
		{OptDraftMin: "4", OptDraftMax: "2"},
		{OptDraftPMin: "1.5"},
		{OptSpecType: "draft-eagle3"},
		{OptSpecType: "draft-simple"},
		{OptDraftModel: "d.gguf", OptSpecType: "ngram-mod"},
		{OptDraftBatchMax: "1"},
	} {
		if _, err := parseOptions(bad); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%v: %v, want a bad request", bad, err)
		}
	}
}
