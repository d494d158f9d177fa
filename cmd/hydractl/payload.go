package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// chatMessage is one OpenAI-style chat message.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// prefillPayload builds a PREFILL payload from exactly one of the prompt
// flags; set names the flags given on the command line.
//
//	--messages: a JSON array of messages, wrapped as {"messages":[…]}, or a
//	            whole request object (to pass "model" and the like), sent as is
//	--text:     a single user message
//	--tokens:   comma-separated ids, sent as raw little-endian u32
func prefillPayload(set map[string]bool, messages, text, tokens string) ([]byte, error) {
	n := 0
	for _, f := range []string{"messages", "text", "tokens"} {
		if set[f] {
			n++
		}
	}
	if n != 1 {
		return nil, usagef("prefill needs exactly one of --messages, --text and --tokens")
	}
	switch {
	case set["text"]:
		return json.Marshal(struct {
			Messages []chatMessage `json:"messages"`
		}{[]chatMessage{{Role: "user", Content: text}}})
	case set["tokens"]:
		return tokenPayload(tokens)
	}
	raw := bytes.TrimSpace([]byte(messages))
	if !json.Valid(raw) {
		return nil, usagef("--messages is not valid JSON")
	}
	switch raw[0] {
	case '{':
		var probe struct {
			Messages json.RawMessage `json:"messages"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil || len(probe.Messages) == 0 {
			return nil, usagef(`--messages object has no "messages" key`)
		}
		return raw, nil
	case '[':
		return json.Marshal(struct {
			Messages json.RawMessage `json:"messages"`
		}{raw})
	}
	return nil, usagef("--messages must be a JSON array of messages or a request object")
}

// tokenPayload turns "1,2,3" into little-endian u32 token ids.
func tokenPayload(list string) ([]byte, error) {
	fields := strings.Split(list, ",")
	b := make([]byte, 0, 4*len(fields))
	for i, f := range fields {
		f = strings.TrimSpace(f)
		id, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, usagef("--tokens: item %d (%q) is not a token id (0..%d)", i+1, f, uint32(math.MaxUint32))
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return b, nil
}

// decodePayload is the JSON DECODE request continuing the slot's KV.
func decodePayload(n int) []byte {
	b, _ := json.Marshal(struct {
		NPredict int           `json:"n_predict"`
		Messages []chatMessage `json:"messages"` // nil: continue, do not re-prefill
	}{NPredict: n})
	return b
}

// swapQuantPayload is [u16 quant_key_len][quant_key][tensor_pattern].
func swapQuantPayload(key, pattern string) ([]byte, error) {
	if len(key) > math.MaxUint16 {
		return nil, usagef("swap-quant: KEY of %d bytes exceeds the 16-bit length limit", len(key))
	}
	b := make([]byte, 0, 2+len(key)+len(pattern))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	return append(b, pattern...), nil
}

// configurePayload checks a CONFIGURE argument. Empty is allowed: the engine
// answers it with {"success":true}.
func configurePayload(arg string) ([]byte, error) {
	if strings.TrimSpace(arg) == "" {
		return nil, nil
	}
	if !json.Valid([]byte(arg)) {
		return nil, usagef("configure: argument is not valid JSON: %s", arg)
	}
	return []byte(arg), nil
}

// gbps formats a throughput in GB/s (10^9 bytes per second).
func gbps(n int64, seconds float64) string {
	if seconds <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f GB/s", float64(n)/seconds/1e9)
}
