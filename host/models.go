package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// Unload stops the resident model: the backend is replaced by a
	// stand-in that answers that no model is loaded, every slot empty,
	// until a Switch loads one.
	Unload(ctx context.Context) error
}

// models holds the switcher and serialises switches.
type models struct {
	mu       sync.Mutex
	sw       ModelSwitcher
	unloaded string // the alias UnloadModel unloaded while none is loaded since, "" otherwise
}

// Errors of LoadModel and UnloadModel, in llama-server's router's words:
// front ends answer them as it does (404 and 400).
var (
	ErrModelNotFound   = errors.New("model is not found")
	ErrModelRunning    = errors.New("model is already running")
	ErrModelNotRunning = errors.New("model is not running")
	// ErrNoRouter: the engine has no models to load or unload (llama-server
	// outside router mode has no such endpoints).
	ErrNoRouter = errors.New("the engine is not in router mode: it has no models to load or unload (llama-server mode's --models-preset lists them)")
)

// SetModelSwitcher installs the switcher the requests naming a model use.
func (s *Server) SetModelSwitcher(m ModelSwitcher) {
	s.models.mu.Lock()
	s.models.sw = m
	s.models.mu.Unlock()
}

// ModelAliases are the models a request may name: the resident one first,
// when one is (loaded).
func (s *Server) ModelAliases() (aliases []string, loaded bool) {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	var out []string
	resident, loaded := s.resident()
	if loaded {
		out = append(out, resident)
	}
	if s.models.sw != nil {
		for _, a := range s.models.sw.Models() {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, loaded
}

// RouterMode reports whether the engine serves several models (presets):
// a request then names one of them.
func (s *Server) RouterMode() bool {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	return s.models.sw != nil
}

// ResidentModel is the alias of the model loaded; ok is false while
// UnloadModel left none.
func (s *Server) ResidentModel() (alias string, ok bool) {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	return s.resident()
}

// resident is ResidentModel with s.models.mu held.
func (s *Server) resident() (string, bool) {
	if s.models.unloaded != "" {
		return "", false
	}
	_, info := s.Backend()
	return info.Model.Alias, true
}

// SwitchModel makes alias resident when it names a model the switcher has
// and it is not resident already; true when it switched. Switching empties
// every slot, so it needs every slot idle: BUSY otherwise. An alias nobody
// knows is left to the backend (which stays, reporting model_fallback);
// while no model is loaded (UnloadModel), a request naming none of the
// switcher's models is refused, saying which it can name.
func (s *Server) SwitchModel(ctx context.Context, alias string) (bool, error) {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	known := s.models.sw != nil && slices.Contains(s.models.sw.Models(), alias)
	if s.models.unloaded != "" && !known {
		return false, fmt.Errorf("%w: no model is loaded (POST /models/unload unloaded %s): name one of %s in the request's model field, "+
			"or POST /models/load one", iface.ErrBadRequest, s.models.unloaded, strings.Join(s.models.sw.Models(), ", "))
	}
	if resident, ok := s.resident(); !known || (ok && alias == resident) {
		return false, nil
	}
	return true, s.switchTo(ctx, alias)
}

// switchTo switches to alias with s.models.mu held, once every slot is idle.
func (s *Server) switchTo(ctx context.Context, alias string) error {
	if !s.slots.suspendIfIdle() {
		return fmt.Errorf("%w: switching to model %q empties every slot, and some are busy", iface.ErrBusy, alias)
	}
	from, loaded := s.resident()
	if !loaded {
		from = "(none loaded)"
	}
	tracing.Logger(ctx, s.log).Info("switching models: every slot is emptied", "from", from, "to", alias)
	if err := s.models.sw.Switch(ctx, alias); err != nil {
		return err
	}
	s.models.unloaded = ""
	return nil
}

// LoadModel makes alias the resident model, as llama-server's router's
// POST /models/load does: ErrModelNotFound for a model the engine cannot
// load, ErrModelRunning for the resident one, BUSY while a slot is at
// work (loading replaces the model every slot holds).
func (s *Server) LoadModel(ctx context.Context, alias string) error {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	switch {
	case s.models.sw == nil:
		return ErrNoRouter
	case !slices.Contains(s.models.sw.Models(), alias):
		return fmt.Errorf("%w: %q (the models: %s)", ErrModelNotFound, alias, strings.Join(s.models.sw.Models(), ", "))
	}
	if resident, ok := s.resident(); ok && alias == resident {
		return fmt.Errorf("%w: %q", ErrModelRunning, alias)
	}
	return s.switchTo(ctx, alias)
}

// UnloadModel stops the resident model when alias names it, as
// llama-server's router's POST /models/unload does: ErrModelNotFound for a
// model the engine does not have, ErrModelNotRunning for one not loaded,
// BUSY while a slot is at work. The engine then holds no model until a
// load or a request naming one.
func (s *Server) UnloadModel(ctx context.Context, alias string) error {
	s.models.mu.Lock()
	defer s.models.mu.Unlock()
	resident, loaded := s.resident()
	switch {
	case s.models.sw == nil:
		return ErrNoRouter
	case !slices.Contains(s.models.sw.Models(), alias):
		return fmt.Errorf("%w: %q (the models: %s)", ErrModelNotFound, alias, strings.Join(s.models.sw.Models(), ", "))
	case !loaded:
		return fmt.Errorf("%w: %q (no model is loaded)", ErrModelNotRunning, alias)
	case alias != resident:
		return fmt.Errorf("%w: %q (loaded: %s)", ErrModelNotRunning, alias, resident)
	}
	if !s.slots.suspendIfIdle() {
		return fmt.Errorf("%w: unloading model %q empties every slot, and some are busy", iface.ErrBusy, alias)
	}
	if err := s.models.sw.Unload(ctx); err != nil {
		return err
	}
	s.models.unloaded = alias
	s.log.Info("model unloaded: every slot is emptied; none is loaded until a load or a request naming one", "model", alias)
	return nil
}
