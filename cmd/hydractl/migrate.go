package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// slotMeta is the part of a STATE_META reply migrate and bench check.
type slotMeta struct {
	NPast          int64  `json:"n_past"`
	StateSize      int64  `json:"state_size"`
	IsProcessing   bool   `json:"is_processing"`
	IsTransferring bool   `json:"is_transferring"`
	ModelAlias     string `json:"model_alias"`
	ModelHash      string `json:"model_hash"`
}

// emptySlotError refuses to migrate an empty slot: its state would only
// empty the destination slot.
func emptySlotError(slot int, stateSize int64) error {
	return fmt.Errorf("source slot %d is empty (n_past 0, %d state bytes): nothing to migrate, and the destination is left as it is; prefill the slot first", slot, stateSize)
}

// stateMeta asks for a slot's STATE_META.
func stateMeta(ctx context.Context, c *transport.Client, g *globals, key string) (slotMeta, []byte, error) {
	resp, _, err := roundTrip(ctx, c, g, transport.OpStateMeta, key, nil)
	if err != nil {
		return slotMeta{}, nil, err
	}
	var m slotMeta
	if err := json.Unmarshal(resp.Meta, &m); err != nil {
		return slotMeta{}, nil, fmt.Errorf("STATE_META reply is not JSON: %q", resp.Meta)
	}
	return m, resp.Meta, nil
}

// parseMigrate reads migrate's flags into the action that moves one slot's
// state to a slot of another engine.
func parseMigrate(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "migrate", "migrate [--from URL] --to URL --slot S [--to-slot T] [--force] [--path auto|shm|socket]")
	from := fs.String("from", "", "source "+addrHelp+" (default --addr)")
	to := fs.String("to", "", "destination "+addrHelp+" (required)")
	slots := addSlotPair(fs, "destination slot `id` (default --slot)")
	force := fs.Bool("force", false, "migrate even when the engines report different model hashes")
	path := fs.String("path", "auto", "`auto`: through shared memory between two engines on Unix sockets that serve it, else the socket; shm: shared memory or fail; socket: STATE_GET into STATE_PUT")
	srcKey, dstKey, err := slots.parse(args, func() error {
		if *to == "" {
			return fs.usagef("migrate needs --to URL")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if *path != "auto" && *path != "shm" && *path != "socket" {
		return nil, fs.usagef("--path must be auto, shm or socket, got %q", *path)
	}
	if *from != "" {
		g.addr = *from // the command's own connection is the source
	}
	m := &migration{g: g, to: *to, slot: *slots.slot, toSlot: *slots.toSlot, srcKey: srcKey, dstKey: dstKey, force: *force, path: *path}
	return m.run, nil
}

// migration is a parsed migrate command: which slot's state goes where.
type migration struct {
	g              *globals
	to             string
	slot, toSlot   int
	srcKey, dstKey string
	force          bool
	path           string // --path: auto, shm or socket
}

// run checks both slots before a byte moves, then streams the source's state
// into the destination and reports the transfer.
func (m *migration) run(ctx context.Context, src *transport.Client, out *output) error {
	// The source is checked before the destination is even dialled: an
	// empty slot's state would empty the destination slot, and a
	// missing one is the source's error.
	sm, smRaw, err := m.checkSource(ctx, src)
	if err != nil {
		return err
	}
	dst, err := m.g.dial(ctx, m.to)
	if err != nil {
		return fmt.Errorf("--to %s: %w", m.to, err)
	}
	defer dst.Close()
	if err := m.checkDestination(ctx, dst, sm); err != nil {
		return err
	}
	start := time.Now()
	var put *transport.Response
	var n int64
	why := "--path socket"
	if m.path != "socket" {
		put, n, why, err = m.handOff(ctx, src, dst)
	}
	if put == nil && err == nil && m.path == "shm" {
		err = fmt.Errorf("--path shm: %s", why)
	}
	path := "shared memory"
	if put == nil && err == nil {
		path = "socket"
		put, n, err = m.transfer(ctx, src, dst, out)
	}
	if err != nil {
		return err
	}
	m.report(out, put.Meta, smRaw, n, time.Since(start), path, why)
	return nil
}

// handOff moves the state through the engines' shared memory (STATE_EXPORT,
// STATE_IMPORT) where both are on this host's Unix sockets and serve it,
// and returns the import's reply and the bytes moved; a nil reply without
// an error is a path not taken, and why says why. A refused import is an
// error (the destination slot is empty, the source's as it was): the socket
// path would be refused the same.
func (m *migration) handOff(ctx context.Context, src, dst *transport.Client) (*transport.Response, int64, string, error) {
	if !isUnix(m.g.addr) || !isUnix(m.to) {
		return nil, 0, "an engine is not named by a unix:// address", nil
	}
	for _, c := range []struct {
		name string
		c    *transport.Client
	}{{"source", src}, {"destination", dst}} {
		if ok, err := hasCapability(ctx, c.c, m.g, "state_shm"); err != nil || !ok {
			return nil, 0, fmt.Sprintf("the %s engine does not hand states over shared memory (INFO: no state_shm)", c.name), nil
		}
	}
	exp, _, err := roundTrip(ctx, src, m.g, transport.OpStateExport, m.srcKey, nil)
	if err != nil {
		if exp == nil {
			return nil, 0, "", err // the connection failed
		}
		return nil, 0, "the source could not export: " + err.Error(), nil
	}
	var em struct {
		Path  string `json:"path"`
		Bytes int64  `json:"bytes"`
		NPast int64  `json:"n_past"`
	}
	if err := json.Unmarshal(exp.Meta, &em); err != nil || em.Path == "" {
		return nil, 0, "", fmt.Errorf("STATE_EXPORT reply without a path: %s", exp.Meta)
	}
	if em.NPast == 0 {
		return nil, 0, "", emptySlotError(m.slot, em.Bytes)
	}
	payload, _ := json.Marshal(map[string]any{"path": em.Path, "bytes": em.Bytes})
	// The destination reads the export as the source writes it; the source
	// keeps it until this command closes its connection, after the
	// destination's reply.
	put, _, err := roundTrip(ctx, dst, m.g, transport.OpStateImport, m.dstKey, payload)
	if err != nil {
		return nil, 0, "", fmt.Errorf("STATE_IMPORT of %s: %w", em.Path, err)
	}
	return put, em.Bytes, "", nil
}

// isUnix says whether addr names a Unix socket.
func isUnix(addr string) bool { return strings.HasPrefix(strings.ToLower(addr), "unix://") }

// hasCapability says whether the engine's INFO lists capability.
func hasCapability(ctx context.Context, c *transport.Client, g *globals, capability string) (bool, error) {
	resp, _, err := roundTrip(ctx, c, g, transport.OpInfo, "0", nil)
	if err != nil {
		return false, err
	}
	var info struct {
		Capabilities []string `json:"capabilities"`
	}
	if err := json.Unmarshal(resp.Meta, &info); err != nil {
		return false, err
	}
	return slices.Contains(info.Capabilities, capability), nil
}

// checkSource refuses a missing or empty source slot, whose state would only
// empty the destination slot.
func (m *migration) checkSource(ctx context.Context, src *transport.Client) (slotMeta, []byte, error) {
	sm, smRaw, err := stateMeta(ctx, src, m.g, m.srcKey)
	if err != nil {
		return slotMeta{}, nil, fmt.Errorf("source slot %d: %w", m.slot, err)
	}
	if sm.NPast == 0 {
		return slotMeta{}, nil, emptySlotError(m.slot, sm.StateSize)
	}
	return sm, smRaw, nil
}

// checkDestination refuses a busy destination slot or, without --force, one
// whose engine holds another model: a refused STATE_PUT would only be known
// after the whole state had crossed the network.
func (m *migration) checkDestination(ctx context.Context, dst *transport.Client, sm slotMeta) error {
	dm, _, err := stateMeta(ctx, dst, m.g, m.dstKey)
	if err != nil {
		return fmt.Errorf("destination slot %d: %w", m.toSlot, err)
	}
	if dm.IsProcessing || dm.IsTransferring {
		return fmt.Errorf("destination slot %d is busy", m.toSlot)
	}
	if sm.ModelHash != "" && dm.ModelHash != "" && sm.ModelHash != dm.ModelHash && !m.force {
		return fmt.Errorf("the engines hold different models (source %s %.12s…, destination %s %.12s…): a state only restores into the model that made it; --force overrides",
			sm.ModelAlias, sm.ModelHash, dm.ModelAlias, dm.ModelHash)
	}
	return nil
}

// transfer pipes the source's STATE_GET body into the destination's
// STATE_PUT, so the state is never held whole, and returns the put's reply
// and the bytes moved.
func (m *migration) transfer(ctx context.Context, src, dst *transport.Client, out *output) (*transport.Response, int64, error) {
	get, err := src.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: m.srcKey, Trace: m.g.trace})
	if err != nil {
		return nil, 0, err
	}
	if err := get.Err(); err != nil {
		return nil, 0, err
	}
	// The slot may have been emptied since STATE_META: its reply says so
	// before a byte reaches the destination.
	var gm slotMeta
	if json.Unmarshal(get.Meta, &gm) == nil && gm.NPast == 0 {
		get.Close()
		return nil, 0, emptySlotError(m.slot, gm.StateSize)
	}
	// The source's body is the destination's payload: the bytes cross
	// through one 1 MiB copy buffer, never held whole.
	bar := out.newProgress(get.PayloadLen, fmt.Sprintf("slot %d → slot %d", m.slot, m.toSlot))
	put, err := statePut(ctx, dst, m.dstKey, m.g.trace, bar.teeTo(get.Body), get.PayloadLen, bar)
	if err != nil {
		return nil, 0, err
	}
	return put, int64(get.PayloadLen), nil
}

// report gives the destination's reply, the transfer's size and speed, and
// the path it took (why: why not shared memory).
func (m *migration) report(out *output, putMeta, smRaw []byte, n int64, elapsed time.Duration, path, why string) {
	out.meta(putMeta)
	out.set("source_meta", jsonValue(smRaw))
	out.set("bytes", n)
	out.set("seconds", elapsed.Seconds())
	out.set("gbps", float64(n)/max(elapsed.Seconds(), 1e-9)/1e9)
	out.set("path", path)
	if why != "" {
		out.set("path_why", why)
		path += " (" + why + ")"
	}
	out.notef("%d bytes, slot %d of %s → slot %d of %s, in %.3fs (%s), path: %s",
		n, m.slot, m.g.addr, m.toSlot, m.to, elapsed.Seconds(), gbps(n, elapsed.Seconds()), path)
}

// parseBench reads bench's flags into the action that times a slot's state
// going out of the engine and back in.
func parseBench(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "bench", "bench --slot S [--rounds N] [--to-slot T]")
	slots := addSlotPair(fs, "slot the state is put back into (default --slot: the slot ends as it began)")
	rounds := fs.Int("rounds", 5, "round trips (`N`)")
	key, putKey, err := slots.parse(args, func() error {
		if *rounds < 1 {
			return fs.usagef("--rounds must be >= 1, got %d", *rounds)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	b := &benchmark{g: g, slot: *slots.slot, toSlot: *slots.toSlot, rounds: *rounds, key: key, putKey: putKey}
	return b.run, nil
}

// benchmark is a parsed bench command: which slot, how many rounds, and
// where the state goes back.
type benchmark struct {
	g                    *globals
	slot, toSlot, rounds int
	key, putKey          string
}

// benchRound is one round trip's timings.
type benchRound struct {
	GetSeconds float64 `json:"get_seconds"`
	GetGBps    float64 `json:"get_gbps"`
	PutSeconds float64 `json:"put_seconds"`
	PutGBps    float64 `json:"put_gbps"`
}

// run warns of an empty slot, times each round, and reports the medians.
func (b *benchmark) run(ctx context.Context, c *transport.Client, out *output) error {
	m, _, err := stateMeta(ctx, c, b.g, b.key)
	if err != nil {
		return err
	}
	if m.NPast == 0 {
		w := fmt.Sprintf("slot %d is empty, so its state is a few bytes; prefill it first (hydractl prefill --slot %d --text …)", b.slot, b.slot)
		out.set("warning", w)
		out.notef("warning: %s", w)
	}
	// One state is held in memory: the put sends what the get received,
	// so neither side of the measure touches a disk.
	var blob []byte
	var results []benchRound
	for i := range b.rounds {
		var r benchRound
		r, blob, err = b.round(ctx, c, blob)
		if err != nil {
			return err
		}
		results = append(results, r)
		out.notef("round %d: %d bytes  get %.3fs %.2f GB/s  put %.3fs %.2f GB/s",
			i+1, len(blob), r.GetSeconds, r.GetGBps, r.PutSeconds, r.PutGBps)
	}
	b.report(out, m, results, len(blob))
	return nil
}

// round times one STATE_GET into blob, grown only when too small, and one
// STATE_PUT of it back, and returns the timings and blob.
func (b *benchmark) round(ctx context.Context, c *transport.Client, blob []byte) (benchRound, []byte, error) {
	start := time.Now()
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: b.key, Trace: b.g.trace})
	if err != nil {
		return benchRound{}, blob, err
	}
	if err := resp.Err(); err != nil {
		return benchRound{}, blob, err
	}
	if uint64(cap(blob)) < resp.PayloadLen {
		blob = make([]byte, resp.PayloadLen)
	}
	blob = blob[:resp.PayloadLen]
	if _, err := io.ReadFull(resp.Body, blob); err != nil {
		return benchRound{}, blob, err
	}
	getD := time.Since(start)
	start = time.Now()
	if _, _, err := roundTrip(ctx, c, b.g, transport.OpStatePut, b.putKey, blob); err != nil {
		return benchRound{}, blob, err
	}
	putD := time.Since(start)
	n := float64(len(blob))
	return benchRound{getD.Seconds(), n / getD.Seconds() / 1e9, putD.Seconds(), n / putD.Seconds() / 1e9}, blob, nil
}

// report gives every round and the median get and put speeds over them.
func (b *benchmark) report(out *output, m slotMeta, results []benchRound, size int) {
	getMed := medianOf(results, func(r benchRound) float64 { return r.GetGBps })
	putMed := medianOf(results, func(r benchRound) float64 { return r.PutGBps })
	out.set("slot", b.slot)
	out.set("to_slot", b.toSlot)
	out.set("bytes", size)
	out.set("n_past", m.NPast)
	out.set("rounds", results)
	out.set("get_gbps_median", getMed)
	out.set("put_gbps_median", putMed)
	out.notef("median over %d rounds: get %.2f GB/s, put %.2f GB/s (%d-byte blob, n_past %d)",
		len(results), getMed, putMed, size, m.NPast)
}

// medianOf is the median of f over the rounds, the mean of the middle two
// when their number is even.
func medianOf(results []benchRound, f func(benchRound) float64) float64 {
	v := make([]float64, len(results))
	for i, r := range results {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
