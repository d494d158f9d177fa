package transport

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"testing/quick"
)

func TestDecodeFrameVector(t *testing.T) {
	// §10: spec frame, token 100, logprob -0.1, not final.
	wire := unhex(t, "64 00 00 00 cd cc cc bd 00")
	want := DecodeFrame{TokenID: 100, Logprob: -0.1}
	frames, err := ParseDecodeFrames(wire)
	if err != nil || len(frames) != 1 || frames[0] != want {
		t.Fatalf("ParseDecodeFrames = %+v, %v; want [%+v]", frames, err, want)
	}
	if got := AppendDecodeFrame(nil, want); !bytes.Equal(got, wire) {
		t.Errorf("AppendDecodeFrame = % x, want % x", got, wire)
	}
}

func TestDecodeFrames(t *testing.T) {
	in := []DecodeFrame{
		{TokenID: 1, Logprob: -0.5},
		{TokenID: math.MaxUint32, Logprob: float32(math.Inf(-1))},
		{TokenID: 42, Logprob: 0, Final: true},
	}
	var b []byte
	for _, f := range in {
		b = AppendDecodeFrame(b, f)
	}
	if len(b) != len(in)*DecodeFrameSize || b[len(b)-1] != DecodeFlagFinal {
		t.Fatalf("encoded % x", b)
	}
	out, err := ParseDecodeFrames(b)
	if err != nil || len(out) != len(in) {
		t.Fatalf("ParseDecodeFrames = %+v, %v", out, err)
	}
	for i := range in {
		if out[i] != in[i] {
			t.Errorf("frame %d = %+v, want %+v", i, out[i], in[i])
		}
	}

	// Reserved flag bits are ignored.
	b[len(b)-1] = 0xfe
	if out, _ := ParseDecodeFrames(b); out[2].Final {
		t.Error("flags 0xfe read as final")
	}
	if out, err := ParseDecodeFrames(nil); err != nil || len(out) != 0 {
		t.Errorf("empty payload: %v, %v", out, err)
	}
	for _, n := range []int{1, 8, 10, 17} {
		if _, err := ParseDecodeFrames(make([]byte, n)); err == nil {
			t.Errorf("%d-byte payload accepted", n)
		}
	}
}

func TestDecodeFrameRoundTrip(t *testing.T) {
	f := func(id uint32, bits uint32, final bool) bool {
		in := DecodeFrame{TokenID: id, Logprob: math.Float32frombits(bits), Final: final}
		out, err := ParseDecodeFrames(AppendDecodeFrame(nil, in))
		return err == nil && len(out) == 1 && out[0].TokenID == id &&
			math.Float32bits(out[0].Logprob) == bits && out[0].Final == final
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestDecodeMetaJSON(t *testing.T) {
	var m DecodeMeta
	raw := `{"tokens_generated":3,"n_past":12,"stop_reason":"eos","text":"Hi!"}`
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	want := DecodeMeta{TokensGenerated: 3, NPast: 12, StopReason: "eos", Text: "Hi!"}
	if m != want {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	if b, _ := json.Marshal(m); string(b) != raw {
		t.Errorf("Marshal = %s, want %s", b, raw)
	}
}
