// Command hydractl is a command-line client for a Hydra RPC engine.
//
// It prints the reply's meta JSON on stdout and human-oriented notes (sizes,
// throughput, generated text) on stderr, so stdout can be piped to jq. A
// non-OK status is reported on stderr with its name and exits 1; usage
// errors exit 2.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

const (
	defaultAddr    = "tcp://127.0.0.1:9510"
	defaultTimeout = 10 * time.Minute
)

// addrHelpText describes an engine address; addrHelp is the same for flag
// help, where `URL` names the flag's argument.
const (
	addrHelpText = "engine address: tcp://HOST:PORT, HOST:PORT, unix:///PATH or tls://HOST:PORT"
	addrHelp     = "engine `URL`: tcp://HOST:PORT, HOST:PORT, unix:///PATH or tls://HOST:PORT"
)

const usage = `usage: hydractl [--addr URL] [--trace ID] [--timeout D] [--json] [--no-progress] COMMAND [flags] [args]

Commands:
  info                                        engine capabilities and mode (INFO)
  meta --slot S                               a slot's n_past and state size (STATE_META)
  configure JSON                              engine tunables, e.g. '{"state_chunk_size":2097152}' (CONFIGURE)
  prefill --slot S (--messages JSON | --text TEXT | --tokens 1,2,3) [-o FILE]
                                              evaluate a prompt; -o saves the returned state blob (PREFILL)
  decode --slot S [--n N]                     generate N (default 16) tokens from the slot's KV (DECODE)
  state get --slot S -o FILE                  stream the slot's state blob to FILE (STATE_GET)
  state put --slot S -i FILE                  restore the slot from a state blob file (STATE_PUT)
  migrate [--from URL] --to URL --slot S [--to-slot T] [--force] [--path auto|shm|socket]
                                              move a slot's state from one engine into another: through
                                              shared memory between two engines on Unix sockets (STATE_EXPORT,
                                              STATE_IMPORT), else STATE_GET streamed into STATE_PUT, without
                                              a file; says which path and why (the source keeps its state;
                                              an empty source slot is refused)
  bench --slot S [--rounds N] [--to-slot T]   STATE_GET/STATE_PUT round trips of the slot's state, in GB/s
  expert-mode solo|combined                   switch the expert mode (SET_EXPERT_MODE)
  swap-quant KEY PATTERN                      swap tensor quantisation (SWAP_QUANT)

Global flags (also accepted after the command):
  --addr URL      ` + addrHelpText + ` (default ` + defaultAddr + `)
  --trace ID      trace id sent with the request, for the engine's logs
  --timeout D     limit for the whole command, e.g. 30s; 0 disables (default 10m)
  --json          print one JSON object on stdout: {"command","ok",…,"meta"} (errors too), no notes
  --no-progress   no progress bar (bars are drawn only when stderr is a terminal)
  --tls-ca FILE, --tls-cert FILE, --tls-key FILE, --tls-server-name NAME
                  for tls://HOST:PORT engines: the CA to trust, a client certificate (mutual TLS)

Every command takes -h/--help (also: hydractl help COMMAND), printed on stdout.
The reply's meta JSON goes to stdout; sizes, throughput and decoded text to stderr.
Exit status: 0 OK, 1 error or non-OK reply, 2 usage error (with --json also a JSON object on stdout).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// globals are the flags every command shares.
type globals struct {
	addr       string
	trace      string
	timeout    time.Duration
	json       bool
	noProgress bool
	tlsCA      string
	tlsCert    string
	tlsKey     string
	tlsName    string
}

// dial connects to addr, with TLS settings for tls:// addresses.
func (g *globals) dial(ctx context.Context, addr string) (*transport.Client, error) {
	var opts []transport.Option
	if strings.HasPrefix(strings.ToLower(addr), "tls://") {
		cfg, err := transport.ClientTLSConfig(g.tlsCA, g.tlsCert, g.tlsKey, g.tlsName)
		if err != nil {
			return nil, err
		}
		opts = append(opts, transport.WithTLS(cfg))
	}
	return transport.DialClient(ctx, addr, opts...)
}

// register adds the global flags to fs, with their current values as defaults,
// so they may also follow the command name.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "addr", g.addr, addrHelp)
	fs.StringVar(&g.trace, "trace", g.trace, "trace id sent with the request")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "limit for the whole command; 0 disables")
	fs.BoolVar(&g.json, "json", g.json, "print one JSON object on stdout (result or error) instead of meta and notes")
	fs.BoolVar(&g.noProgress, "no-progress", g.noProgress, "never draw a progress bar")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "CA (PEM) that a tls:// engine's certificate must chain to (default: system roots)")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "client certificate (PEM) for a tls:// engine that asks for one")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "client private key (PEM)")
	fs.StringVar(&g.tlsName, "tls-server-name", g.tlsName, "name to check in the engine's certificate (default: the host in --addr)")
}

// action performs a parsed command over a connected client.
type action func(ctx context.Context, c *transport.Client, out *output) error

// output is where a command reports. Normally the meta goes to stdout and
// notes to stderr; with --json the meta and the command's figures are
// collected into one object printed at the end.
type output struct {
	stdout, stderr io.Writer
	json           bool
	progress       bool           // progress bars allowed (stderr is a terminal)
	result         map[string]any // --json: the command's figures
}

// meta prints a reply's meta JSON on stdout, or keeps it for --json.
func (o *output) meta(m []byte) {
	if o.json {
		o.set("meta", jsonValue(m))
		return
	}
	if len(m) > 0 {
		fmt.Fprintf(o.stdout, "%s\n", m)
	}
}

// set records a figure for --json.
func (o *output) set(key string, v any) {
	if o.result == nil {
		o.result = map[string]any{}
	}
	o.result[key] = v
}

// notef prints a human-oriented note on stderr (not with --json).
func (o *output) notef(format string, args ...any) {
	if !o.json {
		fmt.Fprintf(o.stderr, format+"\n", args...)
	}
}

// jsonValue embeds a meta in the --json object: as JSON when it is, else as
// a string.
func jsonValue(m []byte) any {
	if len(m) == 0 {
		return nil
	}
	if json.Valid(m) {
		return json.RawMessage(m)
	}
	return string(m)
}

// printJSON writes the --json object for command name.
func (o *output) printJSON(name string, err error) {
	obj := map[string]any{"command": name, "ok": err == nil}
	for k, v := range o.result {
		obj[k] = v
	}
	if err != nil {
		obj["error"] = err.Error()
		var re *transport.ReplyError
		if errors.As(err, &re) {
			obj["status"] = re.Status.String()
			obj["error"] = re.Message()
			obj["meta"] = jsonValue(re.Meta)
		}
	}
	b, merr := json.Marshal(obj)
	if merr != nil {
		b = fmt.Appendf(nil, `{"command":%q,"ok":false,"error":%q}`, name, merr.Error())
	}
	fmt.Fprintf(o.stdout, "%s\n", b)
}

// usageError is a bad command line: exit status 2. cmd names the command
// whose usage it breaks ("" for the global line).
type usageError struct{ cmd, msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{msg: fmt.Sprintf(format, args...)}
}

// helpRequest is -h/--help: text is the usage to print on stdout, exit 0.
type helpRequest struct{ text string }

func (h helpRequest) Error() string { return "help requested" }

// wantsJSON scans a command line for --json before it is parsed, so that a
// line that fails to parse still reports in JSON. The last --json[=BOOL]
// before a "--" wins.
func wantsJSON(args []string) bool {
	on := false
	for _, a := range args {
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "json" {
			continue
		}
		if !hasVal {
			on = true
		} else if b, err := strconv.ParseBool(val); err == nil {
			on = b
		}
	}
	return on
}

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	g := &globals{addr: defaultAddr, timeout: defaultTimeout}
	jsonOut := wantsJSON(args)
	fs := newFlagSet(g, "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		return usageFailed(stdout, stderr, jsonOut, "", usageError{msg: err.Error()})
	}
	if fs.NArg() == 0 {
		if jsonOut {
			return usageFailed(stdout, stderr, true, "", usagef("no command given"))
		}
		fmt.Fprint(stderr, usage)
		return 2
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) == 0 {
			fmt.Fprint(stdout, usage)
			return 0
		}
		// hydractl help COMMAND [SUBCOMMAND] is COMMAND [SUBCOMMAND] --help.
		name, rest = rest[0], append(slices.Clone(rest[1:]), "--help")
	}

	act, full, err := parseCommand(g, name, rest)
	if err != nil {
		var h helpRequest
		if errors.As(err, &h) {
			fmt.Fprint(stdout, h.text)
			return 0
		}
		return usageFailed(stdout, stderr, jsonOut || g.json, full, err)
	}

	ctx := context.Background()
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	out := &output{stdout: stdout, stderr: stderr, json: g.json, progress: !g.noProgress && isTerminal(stderr)}
	err = execute(ctx, g, act, out)
	if g.json {
		out.printJSON(full, err)
	}
	if err != nil {
		reportError(stderr, full, err)
		return 1
	}
	return 0
}

// usageFailed reports a bad command line for command name ("" before one is
// known): on stderr with a pointer to the usage, and with --json also as the
// usual JSON object on stdout. It returns exit status 2.
func usageFailed(stdout, stderr io.Writer, jsonOut bool, name string, err error) int {
	msg, hint := err.Error(), "hydractl help"
	var ue usageError
	if errors.As(err, &ue) && ue.cmd != "" {
		hint = "hydractl " + ue.cmd + " --help"
	}
	if jsonOut {
		obj := map[string]any{"ok": false, "error": msg, "usage_error": true}
		if name != "" {
			obj["command"] = name
		}
		b, _ := json.Marshal(obj)
		fmt.Fprintf(stdout, "%s\n", b)
	}
	fmt.Fprintf(stderr, "hydractl: %s\nRun '%s' for usage.\n", msg, hint)
	return 2
}

// execute dials the engine and runs act.
func execute(ctx context.Context, g *globals, act action, out *output) error {
	c, err := g.dial(ctx, g.addr)
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
