package host

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// TestDecodeWithPrompt: a DECODE carrying a prompt replies the same whether
// the backend takes the prompt in its Decode (one call) or not (a Prefill
// first), and counts the prompt's tokens either way.
func TestDecodeWithPrompt(t *testing.T) {
	run := func(promptDecode bool) (map[string]any, []byte, uint64) {
		m := mock.New(nil)
		info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 1})
		if err != nil {
			t.Fatal(err)
		}
		info.PromptDecode = promptDecode
		s := NewServer(m, info, nil, Config{})
		t.Cleanup(s.Close)
		st, metaBytes, frames := handleKey(t, s.handleDecode, "0",
			[]byte(`{"n_predict":5,"messages":[{"role":"user","content":"Hello, Hydra"}]}`))
		if st != transport.StatusOK {
			t.Fatalf("DECODE: %v %s", st, metaBytes)
		}
		var meta map[string]any
		if err := json.Unmarshal(metaBytes, &meta); err != nil {
			t.Fatal(err)
		}
		prefill, _ := s.stats.Tokens()
		return meta, frames, prefill.Tokens
	}
	oneMeta, oneFrames, onePrompt := run(true)
	twoMeta, twoFrames, twoPrompt := run(false)
	if !bytes.Equal(oneFrames, twoFrames) || len(oneFrames) != 5*9 {
		t.Errorf("frames: one call %x, two calls %x", oneFrames, twoFrames)
	}
	for _, k := range []string{"tokens_generated", "n_past", "stop_reason", "text"} {
		if oneMeta[k] != twoMeta[k] {
			t.Errorf("%s: one call %v, two calls %v", k, oneMeta[k], twoMeta[k])
		}
	}
	if onePrompt == 0 || onePrompt != twoPrompt {
		t.Errorf("prompt tokens counted: one call %d, two calls %d", onePrompt, twoPrompt)
	}
}
