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

func parseMigrate(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "migrate", "migrate [--from URL] --to URL --slot S [--to-slot T] [--force]", stderr)
	from := fs.String("from", "", "source engine `URL` (default --addr)")
	to := fs.String("to", "", "destination engine `URL` (required)")
	slot := slotFlag(fs)
	toSlot := fs.Int("to-slot", -1, "destination slot `id` (default --slot)")
	force := fs.Bool("force", false, "migrate even when the engines report different model hashes")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	if *to == "" {
		return nil, usagef("migrate needs --to URL")
	}
	if *from != "" {
		g.addr = *from // the command's own connection is the source
	}
	if *toSlot < 0 {
		*toSlot = *slot
	}
	srcKey, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	dstKey, err := slotKey(*toSlot)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, src *transport.Client, out *output) error {
		dst, err := g.dial(ctx, *to)
		if err != nil {
			return fmt.Errorf("--to %s: %w", *to, err)
		}
		defer dst.Close()

		// Check both ends first: a refused STATE_PUT would only be known
		// after the whole state had crossed the network.
		sm, smRaw, err := stateMeta(ctx, src, g, srcKey)
		if err != nil {
			return fmt.Errorf("source slot %d: %w", *slot, err)
		}
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

func parseBench(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "bench", "bench --slot S [--rounds N] [--to-slot T]", stderr)
	slot := slotFlag(fs)
	rounds := fs.Int("rounds", 5, "round trips (`N`)")
	toSlot := fs.Int("to-slot", -1, "slot the state is put back into (default --slot: the slot ends as it began)")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	if *rounds < 1 {
		return nil, usagef("--rounds must be >= 1, got %d", *rounds)
	}
	if *toSlot < 0 {
		*toSlot = *slot
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	putKey, err := slotKey(*toSlot)
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
