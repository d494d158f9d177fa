package httpapi

import (
	"math"
	"strconv"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/prometheus/client_golang/prometheus"
)

// The backend's context checkpoints on /metrics, read from BackendInfo's
// Checkpoints at scrape time; a backend that takes none has none of these
// series.
type checkpointDescs struct {
	held, bytes, budget, perSlot                             *prometheus.Desc
	taken, restored, dropped, tokensSaved, overBudget, slots *prometheus.Desc
}

func newCheckpointDescs() checkpointDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("hydra_engine_checkpoints_"+name, help, labels, nil)
	}
	return checkpointDescs{
		held:        d("held", "Context checkpoints held in host memory by all slots (the part of a hybrid's, recurrent or sliding-window model's memory that cannot be cut back)."),
		bytes:       d("bytes", "Host memory those checkpoints hold."),
		budget:      d("budget_bytes", "The checkpoints' budget (checkpoint_ram); +Inf for no limit in bytes."),
		perSlot:     d("per_slot", "Checkpoints a slot keeps at most (ctx_checkpoints)."),
		taken:       d("taken_total", "Checkpoints saved while prompts were evaluated."),
		restored:    d("restored_total", "Checkpoints restored for a prompt that parted from its slot's sequence."),
		dropped:     d("dropped_total", "Checkpoints given up to the count per slot, the spacing or the budget."),
		tokensSaved: d("prompt_tokens_saved_total", "Prompt tokens the restores spared evaluating."),
		overBudget:  d("over_budget_total", "Checkpoints not kept: larger than the whole budget."),
		slots:       d("slot_held", "Checkpoints one slot holds.", "slot"),
	}
}

func (c checkpointDescs) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.held, c.bytes, c.budget, c.perSlot, c.taken, c.restored, c.dropped, c.tokensSaved, c.overBudget, c.slots}
}

// collectCheckpoints writes the checkpoints' series from the backend's
// figures p (nil: none).
func (m *metrics) collectCheckpoints(ch chan<- prometheus.Metric, p *iface.CheckpointStats) {
	if p == nil {
		return
	}
	d := m.ckpt
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	counter := func(desc *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v))
	}
	budget := float64(p.BudgetBytes)
	if p.BudgetBytes < 0 {
		budget = math.Inf(1)
	}
	gauge(d.held, float64(p.Held))
	gauge(d.bytes, float64(p.Bytes))
	gauge(d.budget, budget)
	gauge(d.perSlot, float64(p.MaxPerSlot))
	counter(d.taken, p.Taken)
	counter(d.restored, p.Restored)
	counter(d.dropped, p.Dropped)
	counter(d.tokensSaved, p.TokensSaved)
	counter(d.overBudget, p.OverBudget)
	for i, s := range p.Slots {
		gauge(d.slots, float64(s.Held), strconv.Itoa(i))
	}
}
