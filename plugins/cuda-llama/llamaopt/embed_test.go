package llamaopt

import (
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestEmbedOptions(t *testing.T) {
	o, err := Parse(nil)
	if err != nil || o.Embeddings || o.Pooling != PoolingUnspecified || o.Normalize != 2 || o.EmbdCtx != 0 {
		t.Fatalf("defaults: %+v %v", o.EmbedOptions, err)
	}
	o, err = Parse(map[string]string{OptEmbeddings: "on", OptPooling: "Rank", OptEmbdNormalize: "-1", OptEmbdCtx: "512"})
	if err != nil || !o.Embeddings || o.Pooling != PoolingRank || o.Normalize != -1 || o.EmbdCtx != 512 {
		t.Fatalf("set: %+v %v", o.EmbedOptions, err)
	}
	for k, v := range map[string]string{OptEmbeddings: "maybe", OptPooling: "max", OptEmbdNormalize: "-2", OptEmbdCtx: "0"} {
		if _, err := Parse(map[string]string{k: v}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	for p, name := range poolingNames {
		if o, err := Parse(map[string]string{OptPooling: name}); err != nil || o.Pooling != p || PoolingName(p) != name {
			t.Errorf("pooling %s: %d %v", name, o.Pooling, err)
		}
	}
}
