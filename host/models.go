package host

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// ModelSwitcher makes another model resident on request: a PREFILL or
// completion that names an alias it knows, and that is not the resident
// model's, switches the engine to it first (llama-server's router mode).
type ModelSwitcher interface {
	// Models are the aliases it can switch to.
	Models() []string
	// Switch makes alias the resident model: the backend is replaced (SetBackend),
	// every slot empty.
	Switch(ctx context.Context, alias string) error
}

// models holds the switcher and serialises switches.
type models struct {
	mu sync.Mutex
	sw ModelSwitcher
}

// SetModelSwitcher installs the switcher the requests naming a model use.
func (s *Server) SetModelSwitcher(m ModelSwitcher) {
	s.models.mu.Lock()
	s.models.sw = m
	s.models.mu.Unlock()
}

// ModelAliases are the models a request may name: the resident one first.
func (s *Server) ModelAliases() []string {
	_, info := s.Backend()
	out := []string{info.Model.Alias}
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	if s.models.sw != nil {
		for _, a := range s.models.sw.Models() {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// SwitchModel makes alias resident when it names a model the switcher has
// and it is not resident already; true when it switched. Switching empties
// every slot, so it needs every slot idle: BUSY otherwise. An alias nobody
// knows is left to the backend (which stays, reporting model_fallback).
func (s *Server) SwitchModel(ctx context.Context, alias string) (bool, error) {
	if alias == "" {
		return false, nil
	}
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	_, info := s.Backend()
	if s.models.sw == nil || alias == info.Model.Alias || !slices.Contains(s.models.sw.Models(), alias) {
		return false, nil
	}
	if !s.slots.suspendIfIdle() {
		return false, fmt.Errorf("%w: switching to model %q empties every slot, and some are busy", iface.ErrBusy, alias)
	}
	tracing.Logger(ctx, s.log).Info("switching models: every slot is emptied", "from", info.Model.Alias, "to", alias)
	if err := s.models.sw.Switch(ctx, alias); err != nil {
		return false, err
	}
	return true, nil
}
