package host

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestCountMessages(t *testing.T) {
	for _, c := range []struct {
		body string
		stop int
		n    int
		ok   bool
	}{
		{`{"messages":[]}`, 10, 0, true},
		{`{"messages":[{"role":"user","content":"a"}]}`, 10, 1, true},
		{` { "model" : "m", "x": {"messages":[1,2,3]}, "messages" : [ {"content":"a,]\\\"}"} , {"content":[1,{"a":"]"}]} ] }`, 10, 2, true},
		{`{"messages":[1,2,3,4,5,6]}`, 3, 3, true},
		{`{"a":"\"messages\"","messages":[true,null,-1.5e3]}`, 10, 3, true},
		{`{"messages":"no"}`, 10, 0, false},
		{`["messages"]`, 10, 0, false},
		{`{"messages":[1,2`, 10, 0, false},
		{`{"model":"m"}`, 10, 0, false},
		{`{"model":`, 10, 0, false},
	} {
		n, ok := countMessages([]byte(c.body), c.stop)
		if n != c.n || ok != c.ok {
			t.Errorf("%s (stop %d): %d, %v; want %d, %v", c.body, c.stop, n, ok, c.n, c.ok)
		}
	}
}

// TestCheckMessageCountJSON: 10^5 messages are refused from a scan that
// stops past the slot's size, before any decoding.
func TestCheckMessageCountJSON(t *testing.T) {
	info := iface.BackendInfo{NCtx: 4096, NCtxSlot: 4096}
	var sb strings.Builder
	sb.WriteString(`{"messages":[`)
	for i := range 100000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"hi"}`)
	}
	sb.WriteString(`]}`)
	start := time.Now()
	err := CheckMessageCountJSON([]byte(sb.String()), info)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "4097 messages cannot fit") {
		t.Fatalf("%v", err)
	}
	t.Logf("refused after a scan of %v", took)
	if err := CheckMessageCountJSON([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), info); err != nil {
		t.Fatal(err)
	}
}

// FuzzCountMessages: wherever the scan answers, it agrees with the decoder.
func FuzzCountMessages(f *testing.F) {
	for _, s := range []string{`{"messages":[]}`, `{"a":1,"messages":[{"c":"x"},2]}`, `{"messages":[1,2,3]}`, `{"m":"\\u0041","messages":[[]]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := countMessages([]byte(s), 1<<30)
		if !ok {
			return
		}
		var body struct {
			Messages []json.RawMessage `json:"messages"`
		}
		if json.Unmarshal([]byte(s), &body) == nil && len(body.Messages) != n {
			t.Fatalf("%q: scanned %d messages, decoded %d", s, n, len(body.Messages))
		}
	})
}
