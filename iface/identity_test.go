package iface

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestFileIdentity(t *testing.T) {
	p := filepath.Join(t.TempDir(), "My-Model.Q4.gguf")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := FileIdentity(context.Background(), p, "")
	if err != nil || id.Alias != "My-Model.Q4" || id.Path != p ||
		id.Hash != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("%+v, %v", id, err)
	}
	if id, _ := FileIdentity(context.Background(), p, "alias"); id.Alias != "alias" {
		t.Fatalf("alias option: %+v", id)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := FileIdentity(ctx, p, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
