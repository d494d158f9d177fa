package host

import (
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// TransferStats counts one direction of state transfers.
type TransferStats struct {
	Count   uint64        // transfers completed
	Failed  uint64        // transfers that failed
	Bytes   uint64        // payload bytes of completed transfers
	Seconds float64       // time spent in completed transfers
	Last    time.Duration // duration of the last completed transfer
}

// RequestKey identifies a request counter: the op and the reply's status.
// Aborted requests (connection closed mid-reply) count with Aborted set.
type RequestKey struct {
	Op      transport.Op
	Status  transport.Status
	Aborted bool
}

// RequestStats counts requests of one key.
type RequestStats struct {
	Count   uint64
	Seconds float64
}

// Stats holds the host's counters, ready for /metrics.
type Stats struct {
	mu       sync.Mutex
	get, put TransferStats
	requests map[RequestKey]RequestStats
}

func newStats() *Stats { return &Stats{requests: map[RequestKey]RequestStats{}} }

func (s *Stats) request(op transport.Op, st transport.Status, aborted bool, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := RequestKey{Op: op, Status: st, Aborted: aborted}
	r := s.requests[k]
	r.Count++
	r.Seconds += d.Seconds()
	s.requests[k] = r
}

// Requests returns a copy of the request counters.
func (s *Stats) Requests() map[RequestKey]RequestStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[RequestKey]RequestStats, len(s.requests))
	for k, v := range s.requests {
		out[k] = v
	}
	return out
}

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
