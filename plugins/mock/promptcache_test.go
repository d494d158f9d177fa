package mock

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func httpPrefill(t testing.TB, b *Backend, slot int, toks []int32, save bool) iface.PrefillResult {
	t.Helper()
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: slot, Tokens: toks, PromptCache: true, SaveSequence: save})
	if err != nil {
		t.Fatalf("Prefill slot %d: %v", slot, err)
	}
	return res
}

func cacheStats(t testing.TB, b *Backend) iface.PromptCacheStats {
	t.Helper()
	info, err := b.Info(context.Background())
	if err != nil || info.PromptCache == nil {
		t.Fatalf("Info: %v, prompt cache %v", err, info.PromptCache)
	}
	return *info.PromptCache
}

func byteSeq(n int, lead byte) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32('a' + (int(lead)+i*7)%26)
	}
	toks[0] = int32(lead)
	return toks
}

// TestPromptCache: the mock keeps the llama plugin's prompt cache over its
// fake state: a conversation pushed out of its slot comes back from the
// cache (its state checked as STATE_PUT checks one) and goes on as it would
// have in its slot; RPC prompts and slots are left alone; the budget holds.
func TestPromptCache(t *testing.T) {
	b := newLoaded(t, 1, map[string]string{OptCacheRAM: "1", OptKVBytesPerToken: "1024"})
	conv := byteSeq(300, 'A')
	httpPrefill(t, b, 0, conv, false)
	reply, _ := decode(t, b, 0, 5, iface.SamplerParams{})
	conv = append(conv, ids(reply)...)
	httpPrefill(t, b, 0, byteSeq(200, 'B'), true) // conv leaves the slot
	st := cacheStats(t, b)
	if st.Saves != 1 || st.Entries != 1 || st.Tokens != int64(len(conv)) || st.SaveBytes != uint64(StateSize(1024, len(conv))) {
		t.Fatalf("after another prompt took the slot: %+v", st)
	}
	next := append(slices.Clone(conv), byteSeq(10, 'q')...)
	res := httpPrefill(t, b, 0, next, true)
	if res.Reused != len(conv) {
		t.Fatalf("the conversation's next prompt reused %d of %d", res.Reused, len(conv))
	}
	got, _ := decode(t, b, 0, 20, iface.SamplerParams{})
	fresh := newLoaded(t, 1, nil)
	prefillTokens(t, fresh, 0, next)
	if want, _ := decode(t, fresh, 0, 20, iface.SamplerParams{}); !slices.Equal(ids(got), ids(want)) {
		t.Fatalf("after the cache %v, fresh %v", ids(got), ids(want))
	}
	if st = cacheStats(t, b); st.Hits != 1 || st.Restores != 1 || st.RestoreBytes != uint64(StateSize(1024, len(conv))) || st.Entries != 1 {
		t.Fatalf("after the conversation came back: %+v", st)
	}

	// An RPC prompt neither saves the slot's sequence nor looks; an HTTP
	// prompt on the coordinator's sequence saves and replaces nothing.
	before := cacheStats(t, b)
	prefillTokens(t, b, 0, byteSeq(100, 'C'))
	if st := cacheStats(t, b); st != before {
		t.Fatalf("an RPC prompt went through the cache: %+v, were %+v", st, before)
	}
	if r := httpPrefill(t, b, 0, append(byteSeq(200, 'B'), 1), false); r.Reused != 0 || cacheStats(t, b).Restores != before.Restores ||
		cacheStats(t, b).Saves != before.Saves {
		t.Fatalf("an HTTP prompt on an RPC sequence: reused %d, %+v", r.Reused, cacheStats(t, b))
	}

	// Many conversations through a 1 MiB cache: never over it.
	for k := range 30 {
		httpPrefill(t, b, 0, byteSeq(100+50*(k%7), byte('D'+k%9)), true)
		if st := cacheStats(t, b); st.Bytes > st.BudgetBytes {
			t.Fatalf("round %d: %d bytes held, budget %d", k, st.Bytes, st.BudgetBytes)
		}
	}
	if st := cacheStats(t, b); st.Evictions == 0 || st.RestoreFailures+st.SaveFailures != 0 {
		t.Fatalf("%+v", st)
	}
	if info, _ := fresh.Info(context.Background()); info.PromptCache != nil {
		t.Fatal("a mock without cache_ram reports a cache")
	}
	for _, v := range []string{"-2", "x"} {
		if _, err := New(nil).Load(context.Background(), iface.LoadRequest{Options: map[string]string{OptCacheRAM: v}}); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("cache_ram=%s: %v", v, err)
		}
	}
}
