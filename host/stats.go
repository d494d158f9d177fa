package host

import (
	"maps"
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
	// BackendWait is the part of Seconds the host spent waiting on the
	// backend (shm.TransferTrace): near Seconds, the backend set the pace;
	// near 0, the socket (or the client) did.
	BackendWait float64
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
	paths    map[PathKey]*TransferStats // the same by path (shm.TransferTrace.Path)
	requests map[RequestKey]RequestStats
	restarts uint64
	conns    ConnStats
	// evictions and reusedTokens count slot sharing (CountSlotEviction,
	// CountPromptReuse).
	evictions    map[SlotHolder]uint64
	reusedTokens uint64
	// kvEvictions and kvEvictedCells count idle sequences evicted to make
	// room in a shared KV cache (CountKVEviction).
	kvEvictions, kvEvictedCells uint64
	// draftTokens and draftAccepted count speculative decoding's drafts
	// (CountDrafts).
	draftTokens, draftAccepted uint64
	phases                     map[string]TokenStats
	observer                   StatsObserver
}

// StatsObserver sees every transfer and every prefill or decode as it is
// counted; /metrics uses it to fill histograms, which running totals cannot.
// Calls are made outside Stats' lock, from the goroutine of the request.
type StatsObserver interface {
	// Transfer is one STATE_GET (put false) or STATE_PUT that went by path
	// (shm.TransferTrace.Path); err is nil when it completed, and bytes
	// counts what moved either way.
	Transfer(put bool, path string, bytes int64, d time.Duration, err error)
	// Tokens is one prefill or decode of n tokens that took d.
	Tokens(phase string, n int, d time.Duration)
}

// Token phases, for Stats.Tokens and the metrics' "phase" label.
const (
	PhasePrefill = "prefill"
	PhaseDecode  = "decode"
)

// TokenStats counts the tokens of one phase and the time spent on them.
type TokenStats struct {
	Tokens  uint64
	Seconds float64
}

func newStats() *Stats {
	return &Stats{requests: map[RequestKey]RequestStats{}, phases: map[string]TokenStats{}}
}

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

func (s *Stats) transfer(put bool, path string, bytes int64, d, backendWait time.Duration, err error) {
	s.mu.Lock()
	for _, t := range []*TransferStats{s.direction(put), s.pathStats(put, path)} {
		if err != nil {
			t.Failed++
			continue
		}
		t.Count++
		t.Bytes += uint64(bytes)
		t.Seconds += d.Seconds()
		t.BackendWait += backendWait.Seconds()
		t.Last = d
	}
	o := s.observer
	s.mu.Unlock()
	if o != nil {
		o.Transfer(put, path, bytes, d, err)
	}
}

func (s *Stats) direction(put bool) *TransferStats {
	if put {
		return &s.put
	}
	return &s.get
}

// pathStats is the counters of one direction and path; s.mu is held.
func (s *Stats) pathStats(put bool, path string) *TransferStats {
	k := PathKey{Put: put, Path: path}
	if s.paths == nil {
		s.paths = map[PathKey]*TransferStats{}
	}
	t := s.paths[k]
	if t == nil {
		t = &TransferStats{}
		s.paths[k] = t
	}
	return t
}

// PathKey names one direction of transfers by one path.
type PathKey struct {
	Put  bool
	Path string
}

// TransfersByPath returns the counters of each direction and path used.
func (s *Stats) TransfersByPath() map[PathKey]TransferStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[PathKey]TransferStats, len(s.paths))
	for k, t := range s.paths {
		out[k] = *t
	}
	return out
}

// direction names a transfer's direction in logs and metrics.
func direction(put bool) string {
	if put {
		return "put"
	}
	return "get"
}

// Transfers returns the STATE_GET and STATE_PUT counters.
func (s *Stats) Transfers() (get, put TransferStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get, s.put
}

// SetObserver installs o (nil removes it); it sees events from now on.
func (s *Stats) SetObserver(o StatsObserver) {
	s.mu.Lock()
	s.observer = o
	s.mu.Unlock()
}

// PluginRestart counts one relaunch of the backend plugin.
func (s *Stats) PluginRestart() {
	s.mu.Lock()
	s.restarts++
	s.mu.Unlock()
}

// PluginRestarts returns how often the backend plugin was relaunched.
func (s *Stats) PluginRestarts() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts
}

// CountTokens counts a prefill or decode of n tokens that took d, for a
// front end (HTTP completions) that runs them outside the Hydra RPC ops.
func (s *Stats) CountTokens(phase string, n int, d time.Duration) { s.tokens(phase, n, d) }

// tokens counts a prefill or decode of n tokens that took d. Empty ones
// (n_predict 0, an immediate EOS) say nothing about speed and are skipped.
func (s *Stats) tokens(phase string, n int, d time.Duration) {
	if n <= 0 || d <= 0 {
		return
	}
	s.mu.Lock()
	t := s.phases[phase]
	t.Tokens += uint64(n)
	t.Seconds += d.Seconds()
	s.phases[phase] = t
	o := s.observer
	s.mu.Unlock()
	if o != nil {
		o.Tokens(phase, n, d)
	}
}

// Tokens returns the prefill and decode token counters.
func (s *Stats) Tokens() (prefill, decode TokenStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phases[PhasePrefill], s.phases[PhaseDecode]
}

// CountSlotEviction counts a front end's completion taking a slot that held
// a sequence of holder's (HTTP: an earlier completion's, when no free slot
// was empty or shared its prompt; RPC: only a completion naming the slot).
func (s *Stats) CountSlotEviction(holder SlotHolder) {
	s.mu.Lock()
	if s.evictions == nil {
		s.evictions = map[SlotHolder]uint64{}
	}
	s.evictions[holder]++
	s.mu.Unlock()
}

// CountKVEviction counts an idle HTTP sequence of cells cells evicted to make
// room for another in the KV cache the slots share (Evict).
func (s *Stats) CountKVEviction(cells int) {
	s.mu.Lock()
	s.kvEvictions++
	s.kvEvictedCells += uint64(cells)
	s.mu.Unlock()
}

// KVEvictions returns how many sequences, and of how many cells, Evict
// evicted.
func (s *Stats) KVEvictions() (sequences, cells uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kvEvictions, s.kvEvictedCells
}

// SlotEvictions returns the evictions by the holder of the sequence dropped.
func (s *Stats) SlotEvictions() map[SlotHolder]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.evictions)
}

// CountPromptReuse counts prompt tokens a prefill kept from the slot's
// previous sequence instead of evaluating them.
func (s *Stats) CountPromptReuse(tokens int) {
	s.mu.Lock()
	s.reusedTokens += uint64(tokens)
	s.mu.Unlock()
}

// CountDrafts counts a decode's draft tokens verified and accepted
// (speculative decoding).
func (s *Stats) CountDrafts(verified, accepted int) {
	s.mu.Lock()
	s.draftTokens += uint64(max(verified, 0))
	s.draftAccepted += uint64(max(accepted, 0))
	s.mu.Unlock()
}

// Drafts returns the draft tokens verified and accepted so far.
func (s *Stats) Drafts() (verified, accepted uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draftTokens, s.draftAccepted
}

// PromptTokensReused returns the prompt tokens kept so far.
func (s *Stats) PromptTokensReused() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reusedTokens
}

// ConnStats counts the Hydra RPC connections over all listeners.
type ConnStats struct {
	Open         int64  // connections being served now
	Refused      uint64 // connections beyond their listener's limit
	AcceptErrors uint64 // failed accepts (out of descriptors, aborted), each retried
}

func (s *Stats) connOpened(delta int64) {
	s.mu.Lock()
	s.conns.Open += delta
	s.mu.Unlock()
}

func (s *Stats) connRefused() {
	s.mu.Lock()
	s.conns.Refused++
	s.mu.Unlock()
}

func (s *Stats) acceptError() {
	s.mu.Lock()
	s.conns.AcceptErrors++
	s.mu.Unlock()
}

// Connections returns the connection counters.
func (s *Stats) Connections() ConnStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}
