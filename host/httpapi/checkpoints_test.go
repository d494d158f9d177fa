package httpapi

import (
	"context"
	"encoding/json"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// infoBackend is a backend whose Info is its own with edit applied: the
// figures a backend keeps itself (checkpoints, the speculative rule), as
// the llama plugin reports them.
type infoBackend struct {
	iface.Backend
	edit func(*iface.BackendInfo)
}

func (b *infoBackend) Info(ctx context.Context) (iface.BackendInfo, error) {
	info, err := b.Backend.Info(ctx)
	b.edit(&info)
	return info, err
}

// TestCheckpointsSeen: a backend's context checkpoints show on /metrics
// (held, bytes, budget, totals, per slot) and in /slots; a backend taking
// none has neither.
func TestCheckpointsSeen(t *testing.T) {
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	st := &iface.CheckpointStats{MaxPerSlot: 32, MinStep: 8192, BudgetBytes: -1, Held: 3, Bytes: 3 << 20, Taken: 9, Restored: 4,
		Dropped: 6, TokensSaved: 70000, OverBudget: 1, Slots: []iface.SlotCheckpoints{{Held: 2, Bytes: 2 << 20}, {Held: 1, Bytes: 1 << 20}}}
	_, h := serve(t, &infoBackend{Backend: m, edit: func(i *iface.BackendInfo) { i.Checkpoints = st }}, info, nil)
	text := scrape(t, h)
	for series, want := range map[string]float64{
		"hydra_engine_checkpoints_held":                      3,
		"hydra_engine_checkpoints_bytes":                     3 << 20,
		"hydra_engine_checkpoints_per_slot":                  32,
		"hydra_engine_checkpoints_taken_total":               9,
		"hydra_engine_checkpoints_restored_total":            4,
		"hydra_engine_checkpoints_dropped_total":             6,
		"hydra_engine_checkpoints_prompt_tokens_saved_total": 70000,
		"hydra_engine_checkpoints_over_budget_total":         1,
		`hydra_engine_checkpoints_slot_held{slot="0"}`:       2,
		`hydra_engine_checkpoints_slot_held{slot="1"}`:       1,
	} {
		if got := metricValue(t, text, series); got != want {
			t.Errorf("%s = %v, want %v\n%s", series, got, want, grep(text, "checkpoints"))
		}
	}
	if got := metricValue(t, text, "hydra_engine_checkpoints_budget_bytes"); !math.IsInf(got, 1) {
		t.Errorf("budget %v, want +Inf (no limit in bytes)", got)
	}
	var slots []slotStatus
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/slots", nil))
	if err := json.Unmarshal(rec.Body.Bytes(), &slots); err != nil || len(slots) != 2 {
		t.Fatalf("/slots: %v %s", err, rec.Body)
	}
	if c := slots[0].Checkpoints; c == nil || c.N != 2 || c.Bytes != 2<<20 {
		t.Errorf("/slots[0].checkpoints = %+v", c)
	}

	_, plain := serve(t, m, info, nil)
	if text := scrape(t, plain); grep(text, "hydra_engine_checkpoints") != "" {
		t.Errorf("a backend without checkpoints has their series:\n%s", grep(text, "hydra_engine_checkpoints"))
	}
	rec = httptest.NewRecorder()
	plain.ServeHTTP(rec, httptest.NewRequest("GET", "/slots", nil))
	var none []slotStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &none); err != nil || len(none) != 2 || none[0].Checkpoints != nil {
		t.Errorf("/slots without checkpoints: %v %s", err, rec.Body)
	}
}
