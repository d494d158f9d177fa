package iface

import (
	"errors"
	"fmt"
	"regexp"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// Combined mode across two engine processes on one host: the peer engine
// lends the weights it holds (LendWeights), the head binds the ones its
// pattern names to them (BindPeer) instead of holding its own copies there.

// WeightRegistry is what a peer lends: its weights and where their bytes
// are, under a generation that changes whenever any of them changes.
type WeightRegistry struct {
	// Generation names this registry's state: a new value after a process
	// start, a load or a quantisation swap. A head bound to an older one
	// re-binds or falls back to solo.
	Generation string `json:"generation"`
	// Arch is the model's architecture (general.architecture).
	Arch    string       `json:"arch"`
	Weights []LentWeight `json:"weights"`
}

// LentWeight is one weight of a peer and where its bytes are.
type LentWeight struct {
	Name  string  `json:"name"`
	Type  string  `json:"type"`  // ggml's name of its type ("q4_0", "f16")
	Shape []int64 `json:"shape"` // ggml's ne, innermost first, 1 to 4 of them
	Bytes int64   `json:"bytes"`
	// Device is the ggml device holding the bytes ("CPU": host memory).
	Device string `json:"device"`
	// File and Offset: the bytes are the file's from Offset on, mapped
	// read-only (a host-memory weight llama.cpp uses in place, mmap).
	File   string `json:"file,omitempty"`
	Offset int64  `json:"offset,omitempty"`
}

// Limits of a registry a head accepts from a peer.
const (
	MaxLentWeights   = 1 << 16
	maxLentName      = 256
	maxLentPath      = 4096
	maxLentGeneraton = 256
)

var lentType = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// Check says what is wrong with a registry a peer sent, nil when nothing is:
// it crossed a socket from another process, so every field is bounded.
func (r *WeightRegistry) Check() error {
	switch {
	case r.Generation == "" || len(r.Generation) > maxLentGeneraton:
		return fmt.Errorf("generation: want 1 to %d bytes", maxLentGeneraton)
	case len(r.Arch) > maxLentName:
		return fmt.Errorf("arch: at most %d bytes", maxLentName)
	case len(r.Weights) > MaxLentWeights:
		return fmt.Errorf("%d weights: at most %d", len(r.Weights), MaxLentWeights)
	}
	seen := make(map[string]bool, len(r.Weights))
	for i, w := range r.Weights {
		if err := w.check(); err != nil {
			return fmt.Errorf("weight %d (%.64q): %w", i, w.Name, err)
		}
		if seen[w.Name] {
			return fmt.Errorf("weight %q listed twice", w.Name)
		}
		seen[w.Name] = true
	}
	return nil
}

func (w LentWeight) check() error {
	switch {
	case w.Name == "" || len(w.Name) > maxLentName:
		return fmt.Errorf("name: want 1 to %d bytes", maxLentName)
	case !lentType.MatchString(w.Type):
		return errors.New("type: want a ggml type name")
	case len(w.Shape) < 1 || len(w.Shape) > 4:
		return errors.New("shape: want 1 to 4 dimensions")
	case w.Bytes <= 0:
		return errors.New("bytes: want > 0")
	case w.Device == "" || len(w.Device) > maxLentName:
		return fmt.Errorf("device: want 1 to %d bytes", maxLentName)
	case len(w.File) > maxLentPath:
		return fmt.Errorf("file: at most %d bytes", maxLentPath)
	case w.Offset < 0 || (w.File == "" && w.Offset != 0):
		return errors.New("offset: want ≥ 0, and 0 without a file")
	}
	for _, n := range w.Shape {
		if n < 1 || n > 1<<40 {
			return errors.New("shape: want dimensions of 1 to 2^40")
		}
	}
	return nil
}

// ExpertModeResult is what a switch of expert mode left active, and why it
// is not what was asked for when it is not.
type ExpertModeResult struct {
	Mode   string // "solo" or "combined"
	Reason string // why the mode asked for was not made; "" when it was
	Bound  int    // weights bound to the peer's
}

func registryToPB(r WeightRegistry) *backendv1.WeightRegistry {
	out := &backendv1.WeightRegistry{Generation: r.Generation, Arch: r.Arch, Weights: make([]*backendv1.LentWeight, len(r.Weights))}
	for i, w := range r.Weights {
		out.Weights[i] = &backendv1.LentWeight{Name: w.Name, Type: w.Type, Shape: w.Shape, Bytes: w.Bytes,
			Device: w.Device, File: w.File, Offset: w.Offset}
	}
	return out
}

func registryFromPB(r *backendv1.WeightRegistry) WeightRegistry {
	out := WeightRegistry{Generation: r.GetGeneration(), Arch: r.GetArch(), Weights: make([]LentWeight, len(r.GetWeights()))}
	for i, w := range r.GetWeights() {
		out.Weights[i] = LentWeight{Name: w.GetName(), Type: w.GetType(), Shape: w.GetShape(), Bytes: w.GetBytes(),
			Device: w.GetDevice(), File: w.GetFile(), Offset: w.GetOffset()}
	}
	return out
}
