//go:build !llama || !cgo

package cudallama

import (
	"context"
	"fmt"
	"io"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Linked reports whether llama.cpp is compiled in (build tag "llama", cgo).
const Linked = false

// llamaCommit stands for the llama.cpp commit linked in, of which there is
// none; a CUDA build's version stamp never names it.
const llamaCommit = "none"

// Backend, built without llama.cpp, refuses to load; the plugin binary still
// runs, so the engine reports why instead of failing to start a plugin.
type Backend struct{ log hclog.Logger }

var _ iface.Backend = (*Backend)(nil)

// New returns a backend whose Load fails with ErrNotLinked.
func New(logger hclog.Logger) *Backend { return &Backend{log: logger} }

func (b *Backend) Load(context.Context, iface.LoadRequest) (iface.BackendInfo, error) {
	return iface.BackendInfo{}, fmt.Errorf("%w: %w", iface.ErrNotImplemented, ErrNotLinked)
}

func (b *Backend) Info(context.Context) (iface.BackendInfo, error) {
	return iface.BackendInfo{}, b.err()
}

func (b *Backend) Slot(context.Context, int) (iface.SlotInfo, error) {
	return iface.SlotInfo{}, b.err()
}

func (b *Backend) ClearSlot(context.Context, int) error { return b.err() }

func (b *Backend) Prefill(context.Context, iface.PrefillRequest) (iface.PrefillResult, error) {
	return iface.PrefillResult{}, b.err()
}

func (b *Backend) Tokenize(context.Context, iface.PrefillRequest) (iface.Prompt, error) {
	return iface.Prompt{}, b.err()
}

func (b *Backend) Decode(context.Context, iface.DecodeRequest, func(iface.Token) error) (iface.DecodeResult, error) {
	return iface.DecodeResult{}, b.err()
}

func (b *Backend) StateGet(context.Context, int, int, io.Writer) (int64, error) { return 0, b.err() }

func (b *Backend) LendWeights(context.Context) (iface.WeightRegistry, error) {
	return iface.WeightRegistry{}, b.err()
}

func (b *Backend) BindPeer(context.Context, iface.WeightRegistry) (iface.ExpertModeResult, error) {
	return iface.ExpertModeResult{}, b.err()
}

func (b *Backend) StatePut(_ context.Context, _ int, _ []int32, r io.Reader, _ int64) (int64, error) {
	_, _ = io.Copy(io.Discard, r) // the contract: StatePut reads r to its end
	return 0, b.err()
}

func (b *Backend) SetExpertMode(context.Context, string) (string, error) { return "", b.err() }

func (b *Backend) SwapQuant(context.Context, string, string) (iface.SwapResult, error) {
	return iface.SwapResult{}, b.err()
}

func (b *Backend) Embed(context.Context, iface.EmbedRequest) ([]iface.Embedding, error) {
	return nil, b.err()
}

func (b *Backend) err() error { return fmt.Errorf("%w: %w", iface.ErrNotImplemented, ErrNotLinked) }

func (b *Backend) SlotCheckpoint(context.Context, int) (*iface.Checkpoint, error) {
	return nil, b.err()
}

func (b *Backend) PutCheckpoint(context.Context, int, iface.Checkpoint) (bool, string, error) {
	return false, "", b.err()
}
