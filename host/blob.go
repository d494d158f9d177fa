package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// The blob extras (docs/protocol.md, "State blob"): the integrity trailer
// ends every blob this engine sends unless the client opts out; the layout,
// which a reference engine would read as state, only where the client opts
// in.

// blobOptions are a client's choice of extras: STATE_GET's payload, keys of
// PREFILL's JSON. The coordinator sends neither key.
type blobOptions struct {
	Layout     bool  `json:"blob_layout"`     // write the layout and source (flags bit1)
	Trailer    *bool `json:"blob_trailer"`    // false: no integrity trailer (flags bit2)
	Checkpoint *bool `json:"blob_checkpoint"` // false: leave the slot's context checkpoint out (flags bit0)
}

// parseBlobOptions reads the extras' keys of a JSON object; anything else
// (an empty payload, a non-JSON one) asks for the defaults.
func parseBlobOptions(p []byte) (blobOptions, error) {
	var o blobOptions
	if !isJSONObject(p) {
		return o, nil
	}
	if err := json.Unmarshal(p, &o); err != nil {
		return o, fmt.Errorf("blob options: %w", err)
	}
	return o, nil
}

// parseBlobOptionsStrict reads a JSON object of the extras' keys and
// nothing else, for ops of ours, which ignore nothing a client sends.
func parseBlobOptionsStrict(p []byte) (blobOptions, error) {
	var o blobOptions
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil || !isJSONObject(p) {
		return o, fmt.Errorf("blob options must be a JSON object of blob_layout, blob_trailer and blob_checkpoint: %v", err)
	}
	return o, nil
}

// StateSource is where a slot's state came from, as the blob that restored
// it names it (its layout extra's "source").
type StateSource struct {
	ModelAlias     string `json:"model_alias"`
	ModelHash      string `json:"model_hash"`
	ModelPath      string `json:"model_path"`
	Engine         string `json:"engine"`
	EngineVersion  string `json:"engine_version"`
	Backend        string `json:"backend"`
	BackendVersion string `json:"backend_version"`
}

// addTo adds the source's fields to m, prefixed source_ (model_alias →
// source_model_alias), where src is known.
func (src *StateSource) addTo(m *transport.Meta) *transport.Meta {
	if src == nil {
		return m
	}
	return m.Add("source_model_alias", src.ModelAlias).Add("source_model_hash", src.ModelHash).
		Add("source_model_path", src.ModelPath).Add("source_engine", src.Engine).
		Add("source_engine_version", src.EngineVersion).Add("source_backend", src.Backend).
		Add("source_backend_version", src.BackendVersion)
}

// blobLayout is the layout extra: the backend's StateLayout (null when it
// names none) and the source.
type blobLayout struct {
	Layout json.RawMessage `json:"layout"`
	Source *StateSource    `json:"source"`
}

// blobExtras are the extras of a blob of info's backend that o asks for.
func (s *Server) blobExtras(o blobOptions, info iface.BackendInfo) (transport.BlobExtras, error) {
	x := transport.BlobExtras{Trailer: o.Trailer == nil || *o.Trailer}
	if !o.Layout {
		return x, nil
	}
	bl := blobLayout{Layout: json.RawMessage("null"), Source: &StateSource{
		ModelAlias: info.Model.Alias, ModelHash: info.Model.Hash, ModelPath: info.Model.Path,
		Engine: "hydra-engine", EngineVersion: s.cfg.Version, Backend: info.Name, BackendVersion: info.Version,
	}}
	if info.StateLayout != "" {
		bl.Layout = json.RawMessage(info.StateLayout)
	}
	var err error
	if x.Layout, err = json.Marshal(bl); err != nil {
		return x, fmt.Errorf("the backend's state layout is not JSON: %w", err)
	}
	if len(x.Layout) > transport.MaxBlobLayout {
		return x, fmt.Errorf("the backend's state layout takes %d bytes, a blob holds %d", len(x.Layout), transport.MaxBlobLayout)
	}
	return x, nil
}

// withCheckpoint puts slot's newest context checkpoint into the extras x,
// as the reference engine writes it, unless the client opted out. A backend
// that cannot give it (an older plugin, a failure) or one larger than a blob
// carries leaves it out with a warning: the sequence still moves, without
// its rollback point.
func (s *Server) withCheckpoint(ctx context.Context, b iface.Backend, slot int, o blobOptions, x *transport.BlobExtras) {
	if o.Checkpoint != nil && !*o.Checkpoint {
		return
	}
	c, err := b.SlotCheckpoint(ctx, slot)
	log := tracing.Logger(ctx, s.log)
	switch {
	case errors.Is(err, iface.ErrNotImplemented):
		return
	case err != nil:
		log.Warn("the slot's context checkpoint is left out of its blob", "slot", slot, "error", err)
		return
	case c == nil:
		return
	case int64(len(c.Target))+int64(len(c.Draft)) > transport.MaxBlobCheckpoint:
		log.Warn("the slot's context checkpoint is larger than a blob carries: left out", "slot", slot,
			"bytes", len(c.Target)+len(c.Draft), "max", transport.MaxBlobCheckpoint)
		return
	}
	x.Checkpoint = &transport.BlobCheckpoint{PosMin: c.PosMin, PosMax: c.PosMax, NTokens: c.NTokens, Target: c.Target, Draft: c.Draft}
}

// putCheckpoint hands a slot just restored the checkpoint its blob carried
// and says what became of it for the reply: "kept", or why not. A
// checkpoint the backend refuses (it does not fit the sequence or the
// model's memory) fails the STATE_PUT, as any bad blob does.
func putCheckpoint(ctx context.Context, b iface.Backend, slot int, c *transport.BlobCheckpoint) (string, error) {
	kept, why, err := b.PutCheckpoint(ctx, slot, iface.Checkpoint{PosMin: c.PosMin, PosMax: c.PosMax, NTokens: c.NTokens,
		Target: c.Target, Draft: c.Draft})
	switch {
	case errors.Is(err, iface.ErrNotImplemented):
		return "not kept: the backend takes no checkpoints", nil
	case err != nil:
		return "", fmt.Errorf("the blob's context checkpoint: %w", err)
	case kept && why != "":
		return "kept; " + why, nil
	case kept:
		return "kept", nil
	}
	return "not kept: " + why, nil
}

// ErrLayout: a blob's state has another layout than the backend's.
var ErrLayout = errors.New("state layout differs")

// checkLayout compares a blob's layout extra with the backend's layout (here)
// and returns the source it names. Every key whose value differs is named,
// with both values. A backend that names no layout, or a blob whose layout
// is null, is not compared.
func checkLayout(extra []byte, here string) (*StateSource, error) {
	var bl blobLayout
	if err := json.Unmarshal(extra, &bl); err != nil {
		return nil, fmt.Errorf("%w: its layout is not a JSON object with layout and source: %v", transport.ErrMalformedBlob, err)
	}
	if here == "" || len(bl.Layout) == 0 || string(bl.Layout) == "null" {
		return bl.Source, nil
	}
	var mine, theirs map[string]json.RawMessage
	if err := json.Unmarshal([]byte(here), &mine); err != nil {
		return nil, fmt.Errorf("the backend's state layout is not a JSON object: %w", err)
	}
	if err := json.Unmarshal(bl.Layout, &theirs); err != nil {
		return nil, fmt.Errorf("%w: its state layout is not a JSON object: %v", transport.ErrMalformedBlob, err)
	}
	keys := make([]string, 0, len(mine)+len(theirs))
	for k := range mine {
		keys = append(keys, k)
	}
	for k := range theirs {
		if _, ok := mine[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var diffs []string
	for _, k := range keys {
		a, b := layoutValue(mine[k]), layoutValue(theirs[k])
		if a != b {
			diffs = append(diffs, fmt.Sprintf("%s %s here, %s in the blob", k, a, b))
		}
	}
	if diffs != nil {
		return nil, fmt.Errorf("%w: %s", ErrLayout, strings.Join(diffs, "; "))
	}
	return bl.Source, nil
}

// layoutValue is a layout value as compared and shown: a string as it is,
// anything else as canonical JSON (object keys sorted, numbers alike however
// written), "absent" for a key one side lacks.
func layoutValue(raw json.RawMessage) string {
	if raw == nil {
		return "absent"
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(b)
}

// maxSumCatchUp is the most state the host reads itself to complete a
// restore's sum after the backend stopped reading early (as much as it
// would drain after a reply).
const maxSumCatchUp = maxDrain

// checkTrailer ends a restore whose blob announced an integrity trailer:
// sum holds what the data plane summed of the state (the wrapper's head
// bytes before it), src is the payload, left at the trailer once the state
// is read. berr is the backend's result. The trailer's verdict comes first:
// a backend that refused changed bytes is told of as an integrity failure,
// with its own words after. A sum that cannot be completed (bytes that went
// unsummed, a backend that stopped far short) leaves the backend's error, or
// fails a restore that claims success without the check.
func checkTrailer(src io.Reader, sum *shm.SumReader, head int64, berr error) error {
	if !sum.Lost && sum.N < sum.Limit && sum.Limit-sum.N <= maxSumCatchUp {
		if _, err := io.Copy(io.Discard, sum); err != nil {
			return errors.Join(berr, fmt.Errorf("reading the state after the backend: %w", err))
		}
	}
	if sum.Lost || sum.N != sum.Limit {
		if berr != nil {
			return berr
		}
		return fmt.Errorf("%w: %d of the state's %d bytes went unchecked", transport.ErrIntegrity, sum.Limit-sum.N, sum.Limit)
	}
	var t [transport.TrailerSize]byte
	if _, err := io.ReadFull(src, t[:]); err != nil {
		return errors.Join(berr, fmt.Errorf("reading the integrity trailer: %w", err))
	}
	if err := transport.CheckTrailer(t[:], sum.CRC, uint64(head+sum.N)); err != nil {
		if berr != nil {
			return fmt.Errorf("%w (the backend, given those bytes: %v)", err, berr)
		}
		return err
	}
	return berr
}

// blobWriter writes a blob to its writer, counting the bytes and, for an
// integrity trailer, summing them.
type blobWriter struct {
	countingWriter
	sum *sumWriter
}

func newBlobWriter(w io.Writer, trailer bool) *blobWriter {
	bw := &blobWriter{countingWriter: countingWriter{w: w}}
	if trailer {
		bw.sum = &sumWriter{w: w}
		bw.countingWriter.w = bw.sum
	}
	return bw
}

// writeTrailer writes the integrity trailer of every byte before it; none
// without one.
func (bw *blobWriter) writeTrailer() error {
	if bw.sum == nil {
		return nil
	}
	var t [transport.TrailerSize]byte
	_, err := bw.Write(transport.AppendTrailer(t[:0], bw.sum.crc, uint64(bw.sum.n)))
	return err
}

// sumWriter passes writes through and sums what went out, for the trailer.
type sumWriter struct {
	w   io.Writer
	crc uint32
	n   int64
}

func (s *sumWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.crc = crc32.Update(s.crc, transport.Castagnoli, p[:n])
	s.n += int64(n)
	return n, err
}
