package httpapi

import "github.com/prometheus/client_golang/prometheus"

// Combined mode between two engines of one host on /metrics: an engine
// that lends its weights has the heads series, a head the peer's.
type combinedDescs struct {
	heads, connected, lends, bound *prometheus.Desc
}

func newCombinedDescs() combinedDescs {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("hydra_engine_combined_"+name, help, nil, nil)
	}
	return combinedDescs{
		heads:     d("heads", "Combined heads following the weights this engine lends (--lend-weights)."),
		connected: d("peer_connected", "1 while this head's link to its peer engine (--combined-peer) is up."),
		lends:     d("peer_lends", "1 while the peer engine lends weights this head can bind."),
		bound:     d("bound_weights", "Weights this head computes with from the peer engine's (0: solo)."),
	}
}

func (c combinedDescs) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.heads, c.connected, c.lends, c.bound}
}

func (m *metrics) collectCombined(ch chan<- prometheus.Metric) {
	st := m.s.Combined()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	one := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	if st.Lending {
		gauge(m.combined.heads, float64(st.Heads))
	}
	if st.Following {
		gauge(m.combined.connected, one(st.Connected))
		gauge(m.combined.lends, one(st.PeerLends))
		gauge(m.combined.bound, float64(st.Bound))
	}
}
