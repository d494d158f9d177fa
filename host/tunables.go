package host

import (
	"sync"

	"github.com/hydra-engine/hydra-engine/iface"
)

// State chunk size bounds and default (protocol §5).
const (
	MinStateChunkSize     = 64 << 10
	MaxStateChunkSize     = 64 << 20
	DefaultStateChunkSize = 2 << 20
)

// ClampStateChunkSize maps a requested state_chunk_size to the one applied.
func ClampStateChunkSize(n uint64) uint64 {
	return min(max(n, MinStateChunkSize), MaxStateChunkSize)
}

// Tunables are the engine-wide settings CONFIGURE and SET_EXPERT_MODE change.
// The host owns them, so they survive backend restarts and model reloads.
type Tunables struct {
	mu             sync.RWMutex
	stateChunkSize uint64
	expertMode     string
	sampler        iface.SamplerParams
	nPredict       int // default n_predict for DECODE requests that give none; -1 = until EOS/context
}

// NewTunables returns the defaults: 2 MiB chunks, solo, greedy sampling (the
// penalties look back DefaultRepeatLastN tokens once one is set).
func NewTunables() *Tunables {
	return &Tunables{stateChunkSize: DefaultStateChunkSize, expertMode: "solo", nPredict: -1,
		sampler: iface.SamplerParams{RepeatLastN: DefaultRepeatLastN}}
}

// StateChunkSize is the chunk size the next state transfer uses.
func (t *Tunables) StateChunkSize() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return int(t.stateChunkSize)
}

// SetStateChunkSize clamps and applies n, returning the value applied.
func (t *Tunables) SetStateChunkSize(n uint64) uint64 {
	applied := ClampStateChunkSize(n)
	t.mu.Lock()
	t.stateChunkSize = applied
	t.mu.Unlock()
	return applied
}

// Sampler returns the default sampler parameters.
func (t *Tunables) Sampler() iface.SamplerParams {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sampler
}

// NPredict returns the default n_predict.
func (t *Tunables) NPredict() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.nPredict
}

// ExpertMode returns the last mode the backend reported active.
func (t *Tunables) ExpertMode() string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.expertMode
}

func (t *Tunables) setExpertMode(m string) {
	t.mu.Lock()
	t.expertMode = m
	t.mu.Unlock()
}
