package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// engineKey is the key of engine-wide ops; it must parse as a slot id for the
// C++ engine, and the coordinator sends "0".
const engineKey = "0"

// parseCommand parses a command line after the command name into an action.
func parseCommand(g *globals, name string, args []string, stderr io.Writer) (action, error) {
	switch name {
	case "info":
		return parseInfo(g, args, stderr)
	case "meta":
		return parseMeta(g, args, stderr)
	case "configure":
		return parseConfigure(g, args, stderr)
	case "prefill":
		return parsePrefill(g, args, stderr)
	case "decode":
		return parseDecode(g, args, stderr)
	case "state":
		if len(args) == 0 {
			return nil, usagef("state needs a subcommand: get or put")
		}
		switch args[0] {
		case "get":
			return parseStateGet(g, args[1:], stderr)
		case "put":
			return parseStatePut(g, args[1:], stderr)
		}
		return nil, usagef("unknown state subcommand %q (want get or put)", args[0])
	case "migrate":
		return parseMigrate(g, args, stderr)
	case "bench":
		return parseBench(g, args, stderr)
	case "expert-mode":
		return parseExpertMode(g, args, stderr)
	case "swap-quant":
		return parseSwapQuant(g, args, stderr)
	}
	return nil, usagef("unknown command %q", name)
}

// newFlagSet returns a command's flag set, which also takes the global flags.
func newFlagSet(g *globals, name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: hydractl %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	g.register(fs)
	return fs
}

// parseArgs parses args into fs and requires exactly want positional
// arguments, named by what in the error.
func parseArgs(fs *flag.FlagSet, args []string, want int, what string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != want {
		if want == 0 {
			return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
		}
		return usagef("%s: want %s, got %d argument(s)", fs.Name(), what, fs.NArg())
	}
	return nil
}

// slotFlag adds --slot.
func slotFlag(fs *flag.FlagSet) *int {
	return fs.Int("slot", 0, "slot `id`")
}

// slotKey validates a slot id and returns it as a request key.
func slotKey(slot int) (string, error) {
	if slot < 0 {
		return "", usagef("--slot must be >= 0, got %d", slot)
	}
	return strconv.Itoa(slot), nil
}

// setFlags names the flags given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

func parseInfo(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "info", "info", stderr)
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpInfo, engineKey, nil), nil
}

func parseMeta(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "meta", "meta --slot S", stderr)
	slot := slotFlag(fs)
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpStateMeta, key, nil), nil
}

func parseConfigure(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "configure", "configure JSON", stderr)
	if err := parseArgs(fs, args, 1, "one JSON argument"); err != nil {
		return nil, err
	}
	payload, err := configurePayload(fs.Arg(0))
	if err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpConfigure, engineKey, payload), nil
}

func parseExpertMode(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "expert-mode", "expert-mode solo|combined", stderr)
	if err := parseArgs(fs, args, 1, "solo or combined"); err != nil {
		return nil, err
	}
	mode := fs.Arg(0)
	if mode != "solo" && mode != "combined" {
		return nil, usagef("expert-mode: want solo or combined, got %q", mode)
	}
	return metaOnly(g, transport.OpSetExpertMode, engineKey, []byte(mode)), nil
}

func parseSwapQuant(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "swap-quant", "swap-quant KEY PATTERN", stderr)
	if err := parseArgs(fs, args, 2, "KEY and PATTERN"); err != nil {
		return nil, err
	}
	payload, err := swapQuantPayload(fs.Arg(0), fs.Arg(1))
	if err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpSwapQuant, engineKey, payload), nil
}

// metaOnly is an op with a small payload whose reply is all in its meta.
func metaOnly(g *globals, op transport.Op, key string, payload []byte) action {
	return func(ctx context.Context, c *transport.Client, out *output) error {
		resp, _, err := roundTrip(ctx, c, g, op, key, payload)
		if err != nil {
			return err
		}
		out.meta(resp.Meta)
		return nil
	}
}

// roundTrip sends an in-memory payload and reads the whole reply, which must
// be small. A non-OK status is returned as a *transport.ReplyError.
func roundTrip(ctx context.Context, c *transport.Client, g *globals, op transport.Op, key string, payload []byte) (*transport.Response, []byte, error) {
	resp, err := c.Do(ctx, transport.Request{
		Op: op, Key: key, Trace: g.trace,
		Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload)),
	})
	if err != nil {
		return nil, nil, err
	}
	if err := resp.Err(); err != nil {
		return resp, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	return resp, body, nil
}

func parsePrefill(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "prefill", "prefill --slot S (--messages JSON | --text TEXT | --tokens 1,2,3) [-o FILE]", stderr)
	slot := slotFlag(fs)
	messages := fs.String("messages", "", "chat messages as a JSON array, or a whole request `JSON` object with \"messages\"")
	text := fs.String("text", "", "prompt `TEXT`, sent as one user message")
	tokens := fs.String("tokens", "", "raw token ids, comma-separated (`1,2,3`)")
	outPath := fs.String("o", "", "write the returned state blob to `FILE`")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	payload, err := prefillPayload(setFlags(fs), *messages, *text, *tokens)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, c *transport.Client, out *output) error {
		start := time.Now()
		resp, err := c.Do(ctx, transport.Request{
			Op: transport.OpPrefill, Key: key, Trace: g.trace,
			Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload)),
		})
		if err != nil {
			return err
		}
		if err := resp.Err(); err != nil {
			return err
		}
		out.set("blob_bytes", resp.PayloadLen)
		if *outPath == "" {
			if err := resp.Close(); err != nil { // the blob is not wanted: drain it
				return err
			}
			out.meta(resp.Meta)
			out.notef("state blob: %d bytes (not saved; -o FILE keeps it)", resp.PayloadLen)
			return nil
		}
		n, err := saveBody(resp, *outPath, nil)
		if err != nil {
			return err
		}
		out.meta(resp.Meta)
		elapsed := time.Since(start)
		out.set("file", *outPath)
		out.set("seconds", elapsed.Seconds())
		out.notef("state blob: %d bytes to %s in %.3fs (%s, prefill included)", n, *outPath, elapsed.Seconds(), gbps(n, elapsed.Seconds()))
		return nil
	}, nil
}

func parseDecode(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "decode", "decode --slot S --n N", stderr)
	slot := slotFlag(fs)
	n := fs.Int("n", 16, "tokens to generate (`N`)")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	if *n < 0 {
		return nil, usagef("--n must be >= 0, got %d", *n)
	}
	payload := decodePayload(*n)
	return func(ctx context.Context, c *transport.Client, out *output) error {
		resp, body, err := roundTrip(ctx, c, g, transport.OpDecode, key, payload)
		if err != nil {
			return err
		}
		frames, err := transport.ParseDecodeFrames(body)
		if err != nil {
			return err
		}
		out.meta(resp.Meta)
		if out.json {
			type frame struct {
				TokenID uint32  `json:"token_id"`
				Logprob float32 `json:"logprob"`
				Final   bool    `json:"final"`
			}
			fs := make([]frame, len(frames))
			for i, f := range frames {
				fs[i] = frame{f.TokenID, f.Logprob, f.Final}
			}
			out.set("frames", fs)
		}
		var m transport.DecodeMeta
		if err := json.Unmarshal(resp.Meta, &m); err != nil {
			out.notef("%d token frames; meta is not a DECODE meta: %v", len(frames), err)
			return nil
		}
		out.notef("%d token frames, stop_reason %q, n_past %d; text:\n%s", len(frames), m.StopReason, m.NPast, m.Text)
		if len(frames) != m.TokensGenerated {
			out.notef("warning: %d frames but tokens_generated is %d", len(frames), m.TokensGenerated)
		}
		return nil
	}, nil
}

func parseStateGet(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "state get", "state get --slot S -o FILE", stderr)
	slot := slotFlag(fs)
	outPath := fs.String("o", "", "write the state blob to `FILE` (required)")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	if *outPath == "" {
		return nil, usagef("state get needs -o FILE")
	}
	return func(ctx context.Context, c *transport.Client, out *output) error {
		start := time.Now()
		resp, err := c.Do(ctx, transport.Request{Op: transport.OpStateGet, Key: key, Trace: g.trace})
		if err != nil {
			return err
		}
		if err := resp.Err(); err != nil {
			return err
		}
		bar := out.newProgress(resp.PayloadLen, fmt.Sprintf("slot %d →", *slot))
		n, err := saveBody(resp, *outPath, bar)
		bar.done(err)
		if err != nil {
			return err
		}
		out.meta(resp.Meta)
		out.transfer(n, time.Since(start), "to", *outPath)
		return nil
	}, nil
}

func parseStatePut(g *globals, args []string, stderr io.Writer) (action, error) {
	fs := newFlagSet(g, "state put", "state put --slot S -i FILE", stderr)
	slot := slotFlag(fs)
	inPath := fs.String("i", "", "read the state blob from `FILE` (required)")
	if err := parseArgs(fs, args, 0, ""); err != nil {
		return nil, err
	}
	key, err := slotKey(*slot)
	if err != nil {
		return nil, err
	}
	if *inPath == "" {
		return nil, usagef("state put needs -i FILE")
	}
	return func(ctx context.Context, c *transport.Client, out *output) error {
		f, err := os.Open(*inPath)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file: its size must be known up front", *inPath)
		}
		start := time.Now()
		// Without a bar the *os.File goes to the client as is, which sends it
		// with sendfile; the bar's tee costs that.
		bar := out.newProgress(uint64(fi.Size()), fmt.Sprintf("→ slot %d", *slot))
		resp, err := statePut(ctx, c, key, g.trace, bar.teeTo(f), uint64(fi.Size()), bar)
		if err != nil {
			return err
		}
		out.meta(resp.Meta)
		out.transfer(fi.Size(), time.Since(start), "from", *inPath)
		return nil
	}, nil
}

// saveBody streams a reply payload to path and returns its size. A regular
// file is written through a temporary file renamed into place, so a failed
// transfer never leaves a truncated blob that looks whole (the file gets mode
// 0600: state holds conversation data). Anything else that exists, such as
// /dev/null or a FIFO, is written directly. Without a bar the copy is
// spliced socket to file in the kernel; the bar's writer costs that.
func saveBody(resp *transport.Response, path string, bar *progress) (int64, error) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		if fi.IsDir() {
			return 0, fmt.Errorf("%s is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return 0, err
		}
		n, err := io.Copy(bar.alongside(f), resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return n, err
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".part-*")
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(bar.alongside(tmp), resp.Body) // Body's WriteTo splices socket to file
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return n, err
	}
	return n, nil
}

// transfer reports a completed state transfer of n bytes: a note, or the
// figures for --json. dir is "to" or "from" path.
func (o *output) transfer(n int64, elapsed time.Duration, dir, path string) {
	o.set("bytes", n)
	o.set("seconds", elapsed.Seconds())
	o.set("gbps", float64(n)/max(elapsed.Seconds(), 1e-9)/1e9)
	o.set("file", path)
	o.notef("%d bytes %s %s in %.3fs (%s)", n, dir, path, elapsed.Seconds(), gbps(n, elapsed.Seconds()))
}

// statePut streams n bytes from r into the slot named by key and returns the
// OK reply; bar (which r already feeds) is closed with the outcome.
func statePut(ctx context.Context, c *transport.Client, key, trace string, r io.Reader, n uint64, bar *progress) (*transport.Response, error) {
	resp, err := c.Do(ctx, transport.Request{Op: transport.OpStatePut, Key: key, Trace: trace, Payload: r, PayloadLen: n})
	bar.done(err)
	if err != nil {
		return nil, err
	}
	if err := resp.Err(); err != nil {
		return nil, err
	}
	if err := resp.Close(); err != nil {
		return nil, err
	}
	return resp, nil
}
