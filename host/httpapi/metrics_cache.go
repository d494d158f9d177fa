package httpapi

import (
	"context"
	"math"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/prometheus/client_golang/prometheus"
)

// The backend's host-memory prompt cache (cache_ram) on /metrics: its
// figures live in the plugin, which a scrape asks for them (BackendInfo's
// PromptCache); a backend without a cache has none of these series.

// promptCacheAsk bounds a scrape's question to the backend: a plugin that
// hangs must not hang /metrics, which then leaves the cache's series out.
const promptCacheAsk = 2 * time.Second

type promptCacheDescs struct {
	bytes, budget, entries, tokens, hits, misses                *prometheus.Desc
	saves, savedBytes, saveSeconds                              *prometheus.Desc
	restores, restoredBytes, restoreSeconds, evictions, skipped *prometheus.Desc
	failures                                                    *prometheus.Desc
}

func newPromptCacheDescs() promptCacheDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("hydra_engine_prompt_cache_"+name, help, labels, nil)
	}
	return promptCacheDescs{
		bytes:          d("bytes", "Bytes the backend's host-memory prompt cache holds: its entries' state memory and tokens, memory kept for the next saves, saves and restores under way."),
		budget:         d("budget_bytes", "The prompt cache's budget (cache_ram); +Inf for no limit in bytes (its tokens are then bounded by n_ctx)."),
		entries:        d("entries", "Sequences the prompt cache holds."),
		tokens:         d("tokens", "Tokens of the sequences the prompt cache holds."),
		hits:           d("hits_total", "HTTP prompts started from a cached sequence, restored into their slot."),
		misses:         d("misses_total", "HTTP prompts the prompt cache was asked for (an empty slot, or one whose sequence they drop) that no cached sequence served better than the slot."),
		saves:          d("saves_total", "Sequences of HTTP completions saved into the prompt cache as they left their slot for another prompt."),
		savedBytes:     d("saved_bytes_total", "State bytes of those saves."),
		saveSeconds:    d("save_seconds_total", "Time those saves took; saved_bytes rate ÷ this rate is their speed."),
		restores:       d("restores_total", "Cached sequences restored into a slot."),
		restoredBytes:  d("restored_bytes_total", "State bytes of those restores."),
		restoreSeconds: d("restore_seconds_total", "Time those restores took; restored_bytes rate ÷ this rate is their speed."),
		evictions:      d("evictions_total", "Entries dropped, least recently used first, to stay within the budget (or n_ctx's tokens)."),
		skipped:        d("skipped_total", "Sequences not saved: held by an entry already, or larger than the budget."),
		failures:       d("failures_total", "Saves and restores that failed (a restore's prompt is then evaluated in full).", "op"),
	}
}

func (c promptCacheDescs) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.bytes, c.budget, c.entries, c.tokens, c.hits, c.misses, c.saves, c.savedBytes, c.saveSeconds,
		c.restores, c.restoredBytes, c.restoreSeconds, c.evictions, c.skipped, c.failures}
}

// collectBackend asks the backend for the figures it keeps itself: its
// prompt cache's, its context checkpoints' and its speculative rule's.
func (m *metrics) collectBackend(ch chan<- prometheus.Metric) {
	b, _ := m.s.Backend()
	if b == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), promptCacheAsk)
	defer cancel()
	info, err := b.Info(ctx)
	if err != nil {
		return
	}
	m.collectPromptCache(ch, info.PromptCache)
	m.collectCheckpoints(ch, info.Checkpoints)
	m.collectSpec(ch, info.Speculative)
}

// collectPromptCache writes the prompt cache's series from the backend's
// figures p (nil: it keeps none).
func (m *metrics) collectPromptCache(ch chan<- prometheus.Metric, p *iface.PromptCacheStats) {
	if p == nil {
		return
	}
	d := m.cache
	gauge := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v)
	}
	counter := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}
	budget := float64(p.BudgetBytes)
	if p.BudgetBytes < 0 {
		budget = math.Inf(1)
	}
	gauge(d.bytes, float64(p.Bytes))
	gauge(d.budget, budget)
	gauge(d.entries, float64(p.Entries))
	gauge(d.tokens, float64(p.Tokens))
	counter(d.hits, float64(p.Hits))
	counter(d.misses, float64(p.Misses))
	counter(d.saves, float64(p.Saves))
	counter(d.savedBytes, float64(p.SaveBytes))
	counter(d.saveSeconds, p.SaveSeconds)
	counter(d.restores, float64(p.Restores))
	counter(d.restoredBytes, float64(p.RestoreBytes))
	counter(d.restoreSeconds, p.RestoreSeconds)
	counter(d.evictions, float64(p.Evictions))
	counter(d.skipped, float64(p.Skipped))
	counter(d.failures, float64(p.SaveFailures), "save")
	counter(d.failures, float64(p.RestoreFailures), "restore")
}
