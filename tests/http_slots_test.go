package tests

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/transport"
)

// HTTP completions and Hydra RPC sequences sharing one engine's slots
// (issue 26 item 5).

// TestHTTPNeverEvictsRPCSequences: two slots hold sequences a coordinator
// restored over RPC; four streamed completions at once share the two other
// slots, waiting their turn instead of being refused, and the restored
// sequences come out byte for byte as they went in.
func TestHTTPNeverEvictsRPCSequences(t *testing.T) {
	e, base := startHTTPEngine(t, "--backend-opt", "op_delay_ms=20")
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "3", chat("a sequence to restore"))
	_, blob := getState(t, c, "3")
	mustOK(t, c, transport.OpStatePut, "0", blob)
	mustOK(t, c, transport.OpStatePut, "1", blob)
	_, want0 := getState(t, c, "0")
	_, want1 := getState(t, c, "1")
	if code, b, _ := httpDo(t, "POST", base+"/slots/3?action=erase", ""); code != 200 {
		t.Fatalf("erase slot 3: %d %s", code, b)
	}

	var wg sync.WaitGroup
	slots := make([]int, 4)
	for i := range slots {
		wg.Go(func() {
			var r chatResponse
			httpJSON(t, "POST", base+"/v1/chat/completions",
				fmt.Sprintf(`{"messages":[{"role":"user","content":"stream %d"}],"max_tokens":12}`, i), 200, &r)
			slots[i] = r.IDSlot
		})
	}
	wg.Wait()
	for i, s := range slots {
		if s != 2 && s != 3 {
			t.Errorf("completion %d ran on slot %d, which holds an RPC sequence", i, s)
		}
	}
	for slot, want := range map[string][]byte{"0": want0, "1": want1} {
		if _, got := getState(t, c, slot); !bytes.Equal(got, want) {
			t.Errorf("slot %s's restored state changed under the completions", slot)
		}
	}
	m := metricsOf(t, base)
	if m[`hydra_engine_slot_evictions_total{holder="rpc"}`] != 0 {
		t.Errorf("RPC sequences evicted: %v", m[`hydra_engine_slot_evictions_total{holder="rpc"}`])
	}
}

// TestHTTPReusesSharedPrompt: a completion whose prompt starts like the
// sequence an earlier one left goes to that slot and evaluates only the
// rest; an unrelated one goes to an empty slot.
func TestHTTPReusesSharedPrompt(t *testing.T) {
	_, base := startHTTPEngine(t)
	long := `{"role":"system","content":"a long system prompt that every conversation of this client shares, word for word"}`
	var first, second, other chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[`+long+`,{"role":"user","content":"one"}],"max_tokens":3}`, 200, &first)
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"unrelated"}],"max_tokens":3}`, 200, &other)
	before := metricsOf(t, base)[`hydra_engine_prompt_tokens_reused_total`]
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[`+long+`,{"role":"user","content":"two"}],"max_tokens":3}`, 200, &second)
	if second.IDSlot != first.IDSlot || other.IDSlot == first.IDSlot {
		t.Errorf("slots: first %d, unrelated %d, sharing the first's prompt %d", first.IDSlot, other.IDSlot, second.IDSlot)
	}
	if reused := metricsOf(t, base)[`hydra_engine_prompt_tokens_reused_total`] - before; reused < 90 {
		t.Errorf("the second completion reused %v prompt tokens, want the shared system prompt's", reused)
	}
}
