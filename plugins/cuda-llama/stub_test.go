//go:build !llama || !cgo

package cudallama

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Without llama.cpp the backend must say so, not pretend to work.
func TestStubRefusesToLoad(t *testing.T) {
	b := New(nil)
	_, err := b.Load(context.Background(), iface.LoadRequest{Model: "x.gguf", NSlots: 1})
	if !errors.Is(err, ErrNotLinked) || !errors.Is(err, iface.ErrNotImplemented) || !strings.Contains(err.Error(), "-tags llama") {
		t.Fatalf("Load = %v", err)
	}
	if _, err := b.Slot(context.Background(), 0); !errors.Is(err, ErrNotLinked) {
		t.Fatalf("Slot = %v", err)
	}
	if Linked {
		t.Fatal("Linked is true in a build without llama.cpp")
	}
}
