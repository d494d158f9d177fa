package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// engineKey is the key of engine-wide ops; it must parse as a slot id for the
// C++ engine, and the coordinator sends "0".
const engineKey = "0"

// parseCommand parses a command line after the command name into an action,
// and returns the command's full name ("state get") for reports.
func parseCommand(g *globals, name string, args []string) (action, string, error) {
	var parse func(*globals, []string) (action, error)
	switch name {
	case "info":
		parse = parseInfo
	case "meta":
		parse = parseMeta
	case "configure":
		parse = parseConfigure
	case "prefill":
		parse = parsePrefill
	case "decode":
		parse = parseDecode
	case "state":
		return parseState(g, args)
	case "migrate":
		parse = parseMigrate
	case "bench":
		parse = parseBench
	case "expert-mode":
		parse = parseExpertMode
	case "swap-quant":
		parse = parseSwapQuant
	default:
		return nil, name, usagef("unknown command %q", name)
	}
	act, err := parse(g, args)
	return act, name, ofCommand(err, name)
}

// ofCommand ties a usage error that names no command to command name, so
// the report points at that command's --help.
func ofCommand(err error, name string) error {
	if ue, ok := err.(usageError); ok && ue.cmd == "" {
		ue.cmd = name
		return ue
	}
	return err
}

// parseState parses "state [global flags] get|put ...": global flags may come
// between "state" and its subcommand too.
func parseState(g *globals, args []string) (action, string, error) {
	fs := newFlagSet(g, "state", "state get --slot S -o FILE\n       hydractl state put --slot S -i FILE")
	if err := fs.FlagSet.Parse(args); err != nil {
		return nil, "state", fs.parseError(err)
	}
	if fs.NArg() == 0 {
		return nil, "state", fs.usagef("state needs a subcommand: get or put")
	}
	sub, rest := fs.Arg(0), fs.Args()[1:]
	switch sub {
	case "get":
		act, err := parseStateGet(g, rest)
		return act, "state get", ofCommand(err, "state get")
	case "put":
		act, err := parseStatePut(g, rest)
		return act, "state put", ofCommand(err, "state put")
	}
	return nil, "state", fs.usagef("unknown state subcommand %q (want get or put)", sub)
}

// flagSet is a command's flags, which include the global ones.
type flagSet struct {
	*flag.FlagSet
	synopsis string
}

// globalFlags names the flags globals.register adds.
var globalFlags = func() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&globals{}).register(fs)
	m := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { m[f.Name] = true })
	return m
}()

// newFlagSet returns a command's flag set, which also takes the global flags.
// It prints nothing itself: help and errors are the caller's to report.
func newFlagSet(g *globals, name, synopsis string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	g.register(fs)
	return &flagSet{fs, synopsis}
}

// usage is the command's usage text: synopsis, its own flags, the global ones.
func (fs *flagSet) usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: hydractl %s\n", fs.synopsis)
	own := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	own.SetOutput(&b)
	fs.VisitAll(func(f *flag.Flag) {
		if globalFlags[f.Name] {
			return
		}
		own.Var(f.Value, f.Name, f.Usage)
		if strings.Contains(f.Usage, "(default ") {
			// The text says what the default is: not the flag's sentinel.
			own.Lookup(f.Name).DefValue = reflect.New(reflect.TypeOf(f.Value).Elem()).Interface().(flag.Value).String()
		} else {
			own.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	if flagCount(own) > 0 {
		b.WriteString("\nFlags:\n")
		own.PrintDefaults()
	}
	b.WriteString(globalUsage)
	return b.String()
}

func flagCount(fs *flag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n
}

// globalUsage ends every command's usage.
const globalUsage = `
Global flags, also accepted here (hydractl help tells more):
  --addr URL      ` + addrHelpText + ` (default ` + defaultAddr + `)
  --trace ID, --timeout D, --json, --no-progress, --tls-ca FILE, --tls-cert FILE, --tls-key FILE, --tls-server-name NAME
`

// usagef is a usage error of this command.
func (fs *flagSet) usagef(format string, args ...any) error {
	return usageError{cmd: fs.Name(), msg: fmt.Sprintf(format, args...)}
}

// parseError turns a flag package error into help or a usage error.
func (fs *flagSet) parseError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return helpRequest{fs.usage()}
	}
	return fs.usagef("%s: %v", fs.Name(), err)
}

// parse parses args, flags and positional arguments in any order (flags may
// follow the arguments; "--" ends the flags), and requires exactly want
// positional arguments, named by what in the error. It returns them.
func (fs *flagSet) parse(args []string, want int, what string) ([]string, error) {
	var pos []string
	for {
		if err := fs.FlagSet.Parse(args); err != nil {
			return nil, fs.parseError(err)
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) != want {
		if want == 0 {
			return nil, fs.usagef("%s: unexpected argument %q", fs.Name(), pos[0])
		}
		return nil, fs.usagef("%s: want %s, got %d argument(s)", fs.Name(), what, len(pos))
	}
	return pos, nil
}

// isSet reports whether the flag name was given on the command line.
func (fs *flagSet) isSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// slotFlag adds --slot.
func slotFlag(fs *flagSet) *int {
	return fs.Int("slot", 0, "slot `id` (required)")
}

// requireSlot checks that --slot was given and is a slot id, and returns it
// as a request key: no command guesses which slot was meant.
func requireSlot(fs *flagSet, slot int) (string, error) {
	if !fs.isSet("slot") {
		return "", fs.usagef("%s needs --slot S", fs.Name())
	}
	return slotKey(fs, "--slot", slot)
}

// slotKey validates a slot id given by flag and returns it as a request key.
func slotKey(fs *flagSet, flagName string, slot int) (string, error) {
	if slot < 0 {
		return "", fs.usagef("%s must be >= 0, got %d", flagName, slot)
	}
	return strconv.Itoa(slot), nil
}

// setFlags names the flags given on the command line.
func setFlags(fs *flagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

func parseInfo(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "info", "info")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpInfo, engineKey, nil), nil
}

func parseMeta(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "meta", "meta --slot S")
	slot := slotFlag(fs)
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	key, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpStateMeta, key, nil), nil
}

func parseConfigure(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "configure", "configure JSON")
	pos, err := fs.parse(args, 1, "one JSON argument")
	if err != nil {
		return nil, err
	}
	payload, err := configurePayload(pos[0])
	if err != nil {
		return nil, err
	}
	return metaOnly(g, transport.OpConfigure, engineKey, payload), nil
}

func parseExpertMode(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "expert-mode", "expert-mode solo|combined")
	pos, err := fs.parse(args, 1, "solo or combined")
	if err != nil {
		return nil, err
	}
	mode := pos[0]
	if mode != "solo" && mode != "combined" {
		return nil, fs.usagef("expert-mode: want solo or combined, got %q", mode)
	}
	return metaOnly(g, transport.OpSetExpertMode, engineKey, []byte(mode)), nil
}

func parseSwapQuant(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "swap-quant", "swap-quant KEY PATTERN")
	pos, err := fs.parse(args, 2, "KEY and PATTERN")
	if err != nil {
		return nil, err
	}
	payload, err := swapQuantPayload(pos[0], pos[1])
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

func parsePrefill(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "prefill", "prefill --slot S (--messages JSON | --text TEXT | --tokens 1,2,3) [-o FILE]")
	slot := slotFlag(fs)
	messages := fs.String("messages", "", "chat messages as a JSON array, or a whole request `JSON` object with \"messages\"")
	text := fs.String("text", "", "prompt `TEXT`, sent as one user message")
	tokens := fs.String("tokens", "", "raw token ids, comma-separated (`1,2,3`)")
	outPath := fs.String("o", "", "write the returned state blob to `FILE`")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	key, err := requireSlot(fs, *slot)
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

func parseDecode(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "decode", "decode --slot S [--n N]")
	slot := slotFlag(fs)
	n := fs.Int("n", 16, "tokens to generate (`N`)")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	key, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	if *n < 0 {
		return nil, fs.usagef("--n must be >= 0, got %d", *n)
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

func parseStateGet(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "state get", "state get --slot S -o FILE")
	slot := slotFlag(fs)
	outPath := fs.String("o", "", "write the state blob to `FILE` (required)")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	key, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	if *outPath == "" {
		return nil, fs.usagef("state get needs -o FILE")
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

func parseStatePut(g *globals, args []string) (action, error) {
	fs := newFlagSet(g, "state put", "state put --slot S -i FILE")
	slot := slotFlag(fs)
	inPath := fs.String("i", "", "read the state blob from `FILE` (required)")
	if _, err := fs.parse(args, 0, ""); err != nil {
		return nil, err
	}
	key, err := requireSlot(fs, *slot)
	if err != nil {
		return nil, err
	}
	if *inPath == "" {
		return nil, fs.usagef("state put needs -i FILE")
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
