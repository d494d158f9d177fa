package host

import (
	"sync"
	"time"
)

// TransferStats counts one direction of state transfers.
type TransferStats struct {
	Count   uint64        // transfers completed
	Failed  uint64        // transfers that failed
	Bytes   uint64        // payload bytes of completed transfers
	Seconds float64       // time spent in completed transfers
	Last    time.Duration // duration of the last completed transfer
}

// Stats holds the host's counters, ready for /metrics.
type Stats struct {
	mu       sync.Mutex
	get, put TransferStats
}

func newStats() *Stats { return &Stats{} }

func (s *Stats) transfer(put bool, bytes int64, d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.get
	if put {
		t = &s.put
	}
	if err != nil {
		t.Failed++
		return
	}
	t.Count++
	t.Bytes += uint64(bytes)
	t.Seconds += d.Seconds()
	t.Last = d
}

// Transfers returns the STATE_GET and STATE_PUT counters.
func (s *Stats) Transfers() (get, put TransferStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get, s.put
}
