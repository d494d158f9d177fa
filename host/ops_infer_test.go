package host

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
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
		payload := []byte(`{"n_predict":5,"messages":[{"role":"user","content":"Hello, Hydra"}]}`)
		var out bytes.Buffer
		rp := &replier{w: bufio.NewWriter(&out)}
		req := &request{key: "0", payload: &io.LimitedReader{R: bytes.NewReader(payload), N: int64(len(payload))}}
		if err := s.handleDecode(req, rp); err != nil {
			t.Fatal(err)
		}
		rp.w.Flush()
		hdr, err := transport.ParseResponseHeader(out.Bytes())
		if err != nil || hdr.Status != transport.StatusOK {
			t.Fatalf("DECODE: %v %v %s", hdr.Status, err, out.Bytes())
		}
		body := out.Bytes()[transport.ResponseHeaderSize:]
		var meta map[string]any
		if err := json.Unmarshal(body[:hdr.MetaLen], &meta); err != nil {
			t.Fatal(err)
		}
		prefill, _ := s.stats.Tokens()
		return meta, body[hdr.MetaLen:], prefill.Tokens
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
