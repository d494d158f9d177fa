// Command hydractl is a command-line client for a Hydra RPC engine.
//
// It prints the reply's meta JSON on stdout and human-oriented notes (sizes,
// throughput, generated text) on stderr, so stdout can be piped to jq. A
// non-OK status is reported on stderr with its name and exits 1; usage
// errors exit 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

const (
	defaultAddr    = "tcp://127.0.0.1:9510"
	defaultTimeout = 10 * time.Minute
)

const usage = `usage: hydractl [--addr URL] [--trace ID] [--timeout D] COMMAND [flags] [args]

Commands:
  info                                        engine capabilities and mode (INFO)
  meta --slot S                               a slot's n_past and state size (STATE_META)
  configure JSON                              engine tunables, e.g. '{"state_chunk_size":2097152}' (CONFIGURE)
  prefill --slot S (--messages JSON | --text TEXT | --tokens 1,2,3) [-o FILE]
                                              evaluate a prompt; -o saves the returned state blob (PREFILL)
  decode --slot S --n N                       generate N tokens from the slot's KV (DECODE)
  state get --slot S -o FILE                  stream the slot's state blob to FILE (STATE_GET)
  state put --slot S -i FILE                  restore the slot from a state blob file (STATE_PUT)
  expert-mode solo|combined                   switch the expert mode (SET_EXPERT_MODE)
  swap-quant KEY PATTERN                      swap tensor quantisation (SWAP_QUANT)

Global flags (also accepted after the command):
  --addr URL      engine address: tcp://HOST:PORT, HOST:PORT or unix:///PATH (default ` + defaultAddr + `)
  --trace ID      trace id sent with the request, for the engine's logs
  --timeout D     limit for the whole command, e.g. 30s; 0 disables (default 10m)

The reply's meta JSON goes to stdout; sizes, throughput and decoded text to stderr.
Exit status: 0 OK, 1 error or non-OK reply, 2 usage error.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// globals are the flags every command shares.
type globals struct {
	addr    string
	trace   string
	timeout time.Duration
}

// register adds the global flags to fs, with their current values as defaults,
// so they may also follow the command name.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "addr", g.addr, "engine address: tcp://HOST:PORT, HOST:PORT or unix:///PATH")
	fs.StringVar(&g.trace, "trace", g.trace, "trace id sent with the request")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "limit for the whole command; 0 disables")
}

// action performs a parsed command over a connected client.
type action func(ctx context.Context, c *transport.Client, out *output) error

// output is where a command reports.
type output struct {
	stdout, stderr io.Writer
}

// meta prints a reply's meta JSON on stdout.
func (o *output) meta(m []byte) {
	if len(m) > 0 {
		fmt.Fprintf(o.stdout, "%s\n", m)
	}
}

// notef prints a human-oriented note on stderr.
func (o *output) notef(format string, args ...any) {
	fmt.Fprintf(o.stderr, format+"\n", args...)
}

// usageError is a bad command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	g := &globals{addr: defaultAddr, timeout: defaultTimeout}
	fs := flag.NewFlagSet("hydractl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}

	act, err := parseCommand(g, name, rest, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "hydractl: %s\nRun 'hydractl help' for usage.\n", ue.msg)
		}
		return 2 // flag errors were already printed by the FlagSet
	}

	ctx := context.Background()
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	if err := execute(ctx, g, act, &output{stdout: stdout, stderr: stderr}); err != nil {
		if name == "state" {
			name += " " + rest[0]
		}
		reportError(stderr, name, err)
		return 1
	}
	return 0
}

// execute dials the engine and runs act.
func execute(ctx context.Context, g *globals, act action, out *output) error {
	c, err := transport.DialClient(ctx, g.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return act(ctx, c, out)
}

// reportError prints err for command name; a non-OK reply shows its status
// name and the engine's message.
func reportError(w io.Writer, name string, err error) {
	var re *transport.ReplyError
	if errors.As(err, &re) {
		if msg := re.Message(); msg != "" {
			fmt.Fprintf(w, "hydractl: %s: %s: %s\n", name, re.Status, msg)
		} else {
			fmt.Fprintf(w, "hydractl: %s: %s\n", name, re.Status)
		}
		return
	}
	fmt.Fprintf(w, "hydractl: %s: %v\n", name, err)
}
