// Package combined is the link between two engines of one host that run
// combined mode: the peer lends the weights it holds (Lender, on
// llama-engine's --ggml-rpc-port), the head follows what it lends (Link, to
// its --rpc-engine) and binds the weights its pattern names to them.
//
// The wire (docs/protocol.md, "Combined mode between two engines"): the
// head connects and sends Hello; the peer answers with one JSON line, a
// Message, at once and again whenever what it lends changes (a swap, a
// restart of its plugin, its backend going down or coming back). The head
// sends nothing more; either side closing ends the link.
package combined

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Hello is what a head sends first.
const Hello = "HYDRA-LEND/1\n"

// MaxLine bounds one message: a registry of iface.MaxLentWeights weights
// of the longest names and paths fits.
const MaxLine = 16 << 20

// Message is one line from the peer: its registry, or why it lends nothing
// now.
type Message struct {
	Registry *iface.WeightRegistry `json:"registry,omitempty"`
	Error    string                `json:"error,omitempty"`
}

// encode is the message as one line.
func (m Message) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b)+1 > MaxLine {
		return nil, fmt.Errorf("the registry takes %d bytes, more than a message may (%d)", len(b), MaxLine)
	}
	return append(b, '\n'), nil
}

// key tells two messages apart: a registry by its generation, which
// changes whenever any of its weights does.
func (m Message) key() string {
	if m.Registry != nil {
		return "registry " + m.Registry.Generation
	}
	return "error " + m.Error
}

// line is the message as one line, or the reason it cannot be sent as an
// error line.
func (m Message) line() []byte {
	b, err := m.encode()
	if err != nil {
		b, _ = Message{Error: err.Error()}.encode()
	}
	return b
}

// readMessage reads one line and checks it: exactly one of registry and
// error, the registry within iface's bounds.
func readMessage(r *bufio.Reader) (Message, error) {
	line, err := readLine(r)
	if err != nil {
		return Message{}, err
	}
	var m Message
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Message{}, fmt.Errorf("the peer sent a malformed message: %w", err)
	}
	switch {
	case (m.Registry == nil) == (m.Error == ""):
		return Message{}, errors.New("the peer sent a message with neither or both of registry and error")
	case m.Registry != nil:
		if err := m.Registry.Check(); err != nil {
			return Message{}, fmt.Errorf("the peer's registry: %w", err)
		}
	case len(m.Error) > 4096:
		m.Error = m.Error[:4096]
	}
	return m, nil
}

// readLine reads up to '\n', refusing a line longer than MaxLine.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		part, err := r.ReadSlice('\n')
		line = append(line, part...)
		if len(line) > MaxLine {
			return nil, fmt.Errorf("the peer sent a line over %d bytes", MaxLine)
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
