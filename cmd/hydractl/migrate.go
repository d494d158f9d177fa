package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
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

func parseMigrate(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "migrate", "migrate [--from URL] --to URL --slot S [--to-slot T] [--force]")
	from := fs.String("from", "", "source "+addrHelp+" (default --addr)")
	to := fs.String("to", "", "destination "+addrHelp+" (required)")
	slot := slotFlag(fs)
	toSlot := fs.Int("to-slot", -1, "destination slot `id` (default --slot)")
	force := fs.Bool("force", false, "migrate even when the engines report different model hashes")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	if *to == "" {
		return nil, fs.usagef("migrate needs --to URL")
	}
	srcKey, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	if *from != "" {
		g.addr = *from // the command's own connection is the source
	}
	if !fs.isSet("to-slot") {
		*toSlot = *slot
	}
	dstKey, err := slotKey(fs, "--to-slot", *toSlot)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, src *transport.Client, out *output) error {
		// The source is checked before the destination is even dialled: an
		// empty slot's state would empty the destination slot, and a
		// missing one is the source's error.
		sm, smRaw, err := stateMeta(ctx, src, g, srcKey)
		if err != nil {
			return fmt.Errorf("source slot %d: %w", *slot, err)
		}
		if sm.NPast == 0 {
			return emptySlotError(*slot, sm.StateSize)
		}
		dst, err := g.dial(ctx, *to)
		if err != nil {
			return fmt.Errorf("--to %s: %w", *to, err)
		}
		defer dst.Close()

		// Check the destination too: a refused STATE_PUT would only be
		// known after the whole state had crossed the network.
		dm, _, err := stateMeta(ctx, dst, g, dstKey)
		if err != nil {
			return fmt.Errorf("destination slot %d: %w", *toSlot, err)
		}
		if dm.IsProcessing || dm.IsTransferring {
			return fmt.Errorf("destination slot %d is busy", *toSlot)
		}
		if sm.ModelHash != "" && dm.ModelHash != "" && sm.ModelHash != dm.ModelHash && !*force {
			return fmt.Errorf("the engines hold different models (source %s %.12s…, destination %s %.12s…): a state only restores into the model that made it; --force overrides",
				sm.ModelAlias, sm.ModelHash, dm.ModelAlias, dm.ModelHash)
		}

		start := time.Now()
		get, err := src.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: srcKey, Trace: g.trace})
		if err != nil {
			return err
		}
		if err := get.Err(); err != nil {
			return err
		}
		// The slot may have been emptied since STATE_META: its reply says so
		// before a byte reaches the destination.
		var gm slotMeta
		if json.Unmarshal(get.Meta, &gm) == nil && gm.NPast == 0 {
			get.Close()
			return emptySlotError(*slot, gm.StateSize)
		}
		// The source's body is the destination's payload: the bytes cross
		// through one 1 MiB copy buffer, never held whole.
		bar := out.newProgress(get.PayloadLen, fmt.Sprintf("slot %d → slot %d", *slot, *toSlot))
		put, err := statePut(ctx, dst, dstKey, g.trace, bar.teeTo(get.Body), get.PayloadLen, bar)
		if err != nil {
			return err
		}
		elapsed := time.Since(start)
		out.meta(put.Meta)
		n := int64(get.PayloadLen)
		out.set("source_meta", jsonValue(smRaw))
		out.set("bytes", n)
		out.set("seconds", elapsed.Seconds())
		out.set("gbps", float64(n)/max(elapsed.Seconds(), 1e-9)/1e9)
		out.notef("%d bytes, slot %d of %s → slot %d of %s, in %.3fs (%s)",
			n, *slot, g.addr, *toSlot, *to, elapsed.Seconds(), gbps(n, elapsed.Seconds()))
		return nil
	}, nil
}

func parseBench(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "bench", "bench --slot S [--rounds N] [--to-slot T]")
	slot := slotFlag(fs)
	rounds := fs.Int("rounds", 5, "round trips (`N`)")
	toSlot := fs.Int("to-slot", -1, "slot the state is put back into (default --slot: the slot ends as it began)")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	if *rounds < 1 {
		return nil, fs.usagef("--rounds must be >= 1, got %d", *rounds)
	}
	key, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	if !fs.isSet("to-slot") {
		*toSlot = *slot
	}
	putKey, err := slotKey(fs, "--to-slot", *toSlot)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, c *transport.Client, out *output) error {
		m, _, err := stateMeta(ctx, c, g, key)
		if err != nil {
			return err
		}
		if m.NPast == 0 {
			w := fmt.Sprintf("slot %d is empty, so its state is a few bytes; prefill it first (hydractl prefill --slot %d --text …)", *slot, *slot)
			out.set("warning", w)
			out.notef("warning: %s", w)
		}
		// One state is held in memory: the put sends what the get received,
		// so neither side of the measure touches a disk.
		var blob []byte
		type round struct {
			GetSeconds float64 `json:"get_seconds"`
			GetGBps    float64 `json:"get_gbps"`
			PutSeconds float64 `json:"put_seconds"`
			PutGBps    float64 `json:"put_gbps"`
		}
		var results []round
		for i := range *rounds {
			start := time.Now()
			resp, err := c.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: key, Trace: g.trace})
			if err != nil {
				return err
			}
			if err := resp.Err(); err != nil {
				return err
			}
			if uint64(cap(blob)) < resp.PayloadLen {
				blob = make([]byte, resp.PayloadLen)
			}
			blob = blob[:resp.PayloadLen]
			if _, err := io.ReadFull(resp.Body, blob); err != nil {
				return err
			}
			getD := time.Since(start)
			start = time.Now()
			if _, _, err := roundTrip(ctx, c, g, transport.OpStatePut, putKey, blob); err != nil {
				return err
			}
			putD := time.Since(start)
			n := float64(len(blob))
			r := round{getD.Seconds(), n / getD.Seconds() / 1e9, putD.Seconds(), n / putD.Seconds() / 1e9}
			results = append(results, r)
			out.notef("round %d: %d bytes  get %.3fs %.2f GB/s  put %.3fs %.2f GB/s",
				i+1, len(blob), r.GetSeconds, r.GetGBps, r.PutSeconds, r.PutGBps)
		}
		median := func(f func(round) float64) float64 {
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
		getMed := median(func(r round) float64 { return r.GetGBps })
		putMed := median(func(r round) float64 { return r.PutGBps })
		out.set("slot", *slot)
		out.set("to_slot", *toSlot)
		out.set("bytes", len(blob))
		out.set("n_past", m.NPast)
		out.set("rounds", results)
		out.set("get_gbps_median", getMed)
		out.set("put_gbps_median", putMed)
		out.notef("median over %d rounds: get %.2f GB/s, put %.2f GB/s (%d-byte blob, n_past %d)",
			len(results), getMed, putMed, len(blob), m.NPast)
		return nil
	}, nil
}
