package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
)

// configureRequest is the typed form of a CONFIGURE payload. Pointers tell
// "absent" from "zero". state_chunk_size stays a json.Number because its
// conversion follows the C++ engine's (see chunkSizeFromNumber).
type configureRequest struct {
	StateChunkSize *json.Number  `mapstructure:"state_chunk_size"`
	Sampler        SamplerFields `mapstructure:",squash"`
	Seed           *uint64       `mapstructure:"seed"`
	NPredict       *int64        `mapstructure:"n_predict"`
}

// configureResult is what a CONFIGURE applied, for the reply and the log.
type configureResult struct {
	ChunkRequested string // the literal asked for, "" if absent
	ChunkApplied   uint64
	Params         map[string]any // sampler defaults applied, by key
	Ignored        []string       // keys this engine does not know
}

// parseConfigure decodes and validates a CONFIGURE payload without applying
// it, so a bad request changes nothing. nCtx is the most tokens a slot holds
// (0: not known), which bounds the penalties' window.
func parseConfigure(payload []byte, nCtx int) (configureRequest, []string, error) {
	var req configureRequest
	if len(bytes.TrimSpace(payload)) == 0 {
		return req, nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return req, nil, fmt.Errorf("config_json is not valid JSON: %w", err)
	}
	if dec.More() {
		return req, nil, errors.New("config_json has data after the JSON object")
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return req, nil, errors.New("config_json must be a JSON object")
	}
	// json.Number is a string type, so the decoder below would take a
	// string for state_chunk_size; the C++ engine reads a number only.
	if v, ok := obj["state_chunk_size"]; ok {
		if _, isNum := v.(json.Number); !isNum {
			return req, nil, fmt.Errorf("state_chunk_size must be a number, got %s", jsonKind(v))
		}
	}
	var md mapstructure.Metadata
	d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{Result: &req, Metadata: &md})
	if err != nil {
		return req, nil, err
	}
	if err := d.Decode(obj); err != nil {
		return req, nil, fmt.Errorf("config_json: %s", oneLine(err))
	}
	if err := req.Sampler.Validate(nCtx); err != nil {
		return req, nil, err
	}
	if v := req.NPredict; v != nil && (*v < -1 || *v > math.MaxInt32) {
		return req, nil, fmt.Errorf("n_predict must be -1 (no limit) or in [0, %d], got %d", math.MaxInt32, *v)
	}
	if req.StateChunkSize != nil {
		if _, err := chunkSizeFromNumber(*req.StateChunkSize); err != nil {
			return req, nil, err
		}
	}
	sort.Strings(md.Unused)
	return req, md.Unused, nil
}

// jsonKind names the JSON type of a decoded value, for errors.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a number"
}

// oneLine renders err on a single line, for a log line and an error meta.
// mapstructure reports every bad key of a request at once, joined under a
// header, one per line; those become "; "-separated.
func oneLine(err error) string {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		parts := make([]string, 0, len(joined.Unwrap()))
		for _, e := range joined.Unwrap() {
			parts = append(parts, oneLine(e))
		}
		return strings.Join(parts, "; ")
	}
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// chunkSizeFromNumber converts like the C++ engine's get<size_t>: negative
// integers wrap (so they clamp to the maximum), fractions truncate, anything
// beyond uint64 saturates. The result still goes through ClampStateChunkSize.
func chunkSizeFromNumber(n json.Number) (uint64, error) {
	s := string(n)
	if strings.ContainsAny(s, ".eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("state_chunk_size: %w", err)
		}
		f = math.Trunc(f)
		switch {
		case f < 0 || f >= math.MaxUint64:
			return math.MaxUint64, nil
		default:
			return uint64(f), nil
		}
	}
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return 0, fmt.Errorf("state_chunk_size: %q is not a number", s)
	}
	if b.Sign() < 0 || !b.IsUint64() {
		return math.MaxUint64, nil
	}
	return b.Uint64(), nil
}

// apply applies a parsed request to t.
func (req configureRequest) apply(t *Tunables, ignored []string) configureResult {
	res := configureResult{Ignored: ignored}
	if req.StateChunkSize != nil {
		n, _ := chunkSizeFromNumber(*req.StateChunkSize) // validated by parseConfigure
		res.ChunkRequested = string(*req.StateChunkSize)
		res.ChunkApplied = t.SetStateChunkSize(n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	params := req.Sampler.Apply(&t.sampler)
	if v := req.Seed; v != nil {
		t.sampler.Seed = *v
		params["seed"] = *v
	}
	if v := req.NPredict; v != nil {
		t.nPredict = int(*v)
		params["n_predict"] = *v
	}
	if len(params) > 0 {
		res.Params = params
	}
	return res
}

// ApplySampler sets engine-wide sampler defaults from key=value strings (the
// engine's sampler setting) through CONFIGURE's own parsing and checks, so
// the two accept the same keys and values. Values are JSON numbers or
// booleans; an unknown key, or one that is not a sampler default, is an
// error, and a bad request changes nothing.
func (t *Tunables) ApplySampler(kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fields := make([]string, 0, len(kv))
	for _, k := range keys {
		if k == "state_chunk_size" || k == "n_predict" {
			return fmt.Errorf("sampler: %s is not a sampler default", k)
		}
		v := strings.TrimSpace(kv[k])
		var scalar any
		err := json.Unmarshal([]byte(v), &scalar)
		switch scalar.(type) {
		case float64, bool:
		default:
			err = errors.New("not a number or a boolean")
		}
		if err != nil {
			return fmt.Errorf("sampler: %s=%q is not a number or a boolean", k, kv[k])
		}
		key, _ := json.Marshal(k)
		fields = append(fields, string(key)+":"+v)
	}
	req, unknown, err := parseConfigure([]byte("{"+strings.Join(fields, ",")+"}"), 0)
	if err != nil {
		return fmt.Errorf("sampler: %w", err)
	}
	if len(unknown) > 0 {
		return fmt.Errorf("sampler: unknown keys %s (the keys are CONFIGURE's sampler keys: temperature, top_k, top_p, …)", strings.Join(unknown, ", "))
	}
	req.apply(t, nil)
	return nil
}
