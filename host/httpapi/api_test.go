package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// usage is an OpenAI reply's token count, as a client reads it.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
}

// isStatus reports whether err is an apiError of HTTP status code.
func isStatus(err error, code int) bool {
	e, ok := err.(*apiError)
	return ok && e.Status == code
}

// newTestServer is a server over the in-process mock backend.
func newTestServer(t *testing.T, slots int) (*host.Server, http.Handler) {
	t.Helper()
	b, info := loadMock(t, slots)
	return serve(t, b, info, nil)
}

// loadMock is the in-process mock backend, loaded with slots slots.
func loadMock(t *testing.T, slots int) (iface.Backend, iface.BackendInfo) {
	t.Helper()
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: slots})
	if err != nil {
		t.Fatal(err)
	}
	return b, info
}

// serve is a server over b, logging to log (nil: nowhere).
func serve(t *testing.T, b iface.Backend, info iface.BackendInfo, log hclog.Logger) (*host.Server, http.Handler) {
	t.Helper()
	s := host.NewServer(b, info, nil, host.Config{Logger: log})
	t.Cleanup(s.Close)
	return s, Handler(s, Options{})
}

func post(h http.Handler, path, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
	return rec
}

func TestAcquireIdleOrder(t *testing.T) {
	// Slot 0 holds a sequence put there over RPC (never used by HTTP),
	// there before the server starts.
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: []int32{1, 2, 3, 4, 5}}); err != nil {
		t.Fatal(err)
	}
	s, h := serve(t, b, info, nil)
	order := []int{}
	for range 3 {
		rec := post(h, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
		var r struct {
			IDSlot int `json:"id_slot"`
		}
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		order = append(order, r.IDSlot)
	}
	// Empty slots first (1, 2), then the one HTTP used least recently (1),
	// never the RPC-held slot 0 while another is available.
	if order[0] != 1 || order[1] != 2 || order[2] != 1 {
		t.Errorf("auto slots %v, want [1 2 1]", order)
	}

	// With every slot busy a completion waits for one, named or not, and is
	// served as soon as one frees. (That an RPC client's sequence is never
	// given to a completion is tests/http_slots_test.go's: these leases are
	// a front end's, so a slot they free is HTTP's to reuse.)
	leases := make([]*host.SlotLease, 3)
	for i := range leases {
		if leases[i], err = s.TakeSlot(i); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		body string
		free int
	}{{`{"prompt":"hi"}`, 2}, {`{"prompt":"hi","id_slot":1}`, 1}} {
		got := make(chan *httptest.ResponseRecorder, 1)
		go func() { got <- post(h, "/v1/completions", tc.body) }()
		select {
		case rec := <-got:
			t.Fatalf("%s with every slot busy: answered %d %s", tc.body, rec.Code, rec.Body)
		case <-time.After(200 * time.Millisecond):
		}
		leases[tc.free].Release()
		rec := <-got
		var r struct {
			IDSlot int `json:"id_slot"`
		}
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil || r.IDSlot != tc.free {
			t.Errorf("%s after slot %d freed: %d %s", tc.body, tc.free, rec.Code, rec.Body)
		}
		if leases[tc.free], err = s.TakeSlot(tc.free); err != nil {
			t.Fatal(err)
		}
	}
	if rec := post(h, "/v1/completions", `{"prompt":"hi","id_slot":7}`); rec.Code != http.StatusBadRequest {
		t.Errorf("missing slot: %d %s", rec.Code, rec.Body)
	}
}

// TestAcquirePacksSplitKV: with KV cells split between the slots, a
// completion takes the least recently used free slot next to a busy one
// rather than the least recently used of all; with one shared pool, the
// least recently used.
func TestAcquirePacksSplitKV(t *testing.T) {
	for _, tc := range []struct {
		name    string
		unified bool
		want    int
	}{{"kv per slot", false, 1}, {"kv unified", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			b := mock.New(nil)
			info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 4})
			if err != nil {
				t.Fatal(err)
			}
			info.KVUnified, info.NCtxSlot = tc.unified, 64
			s, h := serve(t, b, info, nil)
			slotOf := func(body string) int {
				t.Helper()
				rec := post(h, "/v1/completions", body)
				var r struct {
					IDSlot int `json:"id_slot"`
				}
				if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
					t.Fatalf("%d %s", rec.Code, rec.Body)
				}
				return r.IDSlot
			}
			// Slots 0–3 hold completions, slot 0's the oldest; then slot 2
			// is busy (a front end holds it, as a decode would).
			for i, p := range []string{"a", "b", "c", "d"} {
				if got := slotOf(`{"prompt":"` + p + `","max_tokens":1}`); got != i {
					t.Fatalf("filling: completion %d took slot %d", i, got)
				}
				time.Sleep(2 * time.Millisecond) // distinct last-use times
			}
			l, err := s.TakeSlot(2)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			if got := slotOf(`{"prompt":"e","max_tokens":1}`); got != tc.want {
				t.Errorf("with slot 2 busy a completion took slot %d, want %d", got, tc.want)
			}
		})
	}
}

// TestQueueFull: completions beyond the queue's room are refused 503 with
// Retry-After, and a waiter that gives up leaves the queue.
func TestQueueFull(t *testing.T) {
	s, _ := newTestServer(t, 1)
	q := newSlotQueue(s, 1)
	busy := func() (*host.SlotLease, error) { return nil, iface.ErrBusy }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range q.max {
		wg.Go(func() {
			if _, err := q.take(ctx, busy); !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: %v", err)
			}
		})
	}
	for q.waiting() < q.max {
		time.Sleep(time.Millisecond)
	}
	_, err := q.take(context.Background(), busy)
	if !isStatus(err, http.StatusServiceUnavailable) || !strings.Contains(err.Error(), "queue") {
		t.Fatalf("over the queue: %v", err)
	}
	rec := httptest.NewRecorder()
	run.WriteError(rec, err.(*apiError))
	if rec.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	cancel()
	wg.Wait()
	if n := q.waiting(); n != 0 {
		t.Fatalf("%d still waiting after they gave up", n)
	}
}

func TestStopStringEndsDecode(t *testing.T) {
	_, h := newTestServer(t, 1)
	full := post(h, "/v1/completions", `{"prompt":"Once","max_tokens":40}`)
	var r struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(full.Body.Bytes(), &r); err != nil || len(r.Choices[0].Text) < 12 {
		t.Fatalf("%s %v", full.Body, err)
	}
	text := r.Choices[0].Text // the mock is deterministic: greedy gives it again
	stop := text[len(text)/2 : len(text)/2+3]
	cut := strings.Index(text, stop)

	body := `{"prompt":"Once","max_tokens":40,"stream":true,"stream_options":{"include_usage":true},"stop":` + mustJSON(stop) + `}`
	rec := post(h, "/v1/completions", body)
	var streamed strings.Builder
	var reason string
	var u *usage
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Choices) > 0 {
			streamed.WriteString(ch.Choices[0].Text)
			if ch.Choices[0].FinishReason != nil {
				reason = *ch.Choices[0].FinishReason
			}
		}
		if ch.Usage != nil {
			u = ch.Usage
		}
	}
	if streamed.String() != text[:cut] || reason != "stop" {
		t.Errorf("stop %q: streamed %q (%s), want %q", stop, streamed.String(), reason, text[:cut])
	}
	// The decode ended at the stop string, not at max_tokens.
	if u == nil || u.CompletionTokens != cut+len(stop) {
		t.Errorf("usage %+v, want %d completion tokens", u, cut+len(stop))
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestConcurrentHTTP runs completions, /slots and /metrics at once (run
// with -race): every completion gets a slot or a clean 503, and the slot
// table ends idle.
func TestConcurrentHTTP(t *testing.T) {
	s, h := newTestServer(t, 3)
	var wg sync.WaitGroup
	codes := make(chan int, 24)
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 0:
				codes <- post(h, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"stream":true}`).Code
			case 1:
				codes <- post(h, "/v1/completions", `{"prompt":"hi","max_tokens":20}`).Code
			default:
				for _, p := range []string{"/metrics", "/slots", "/health"} {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
					if rec.Code != 200 {
						t.Errorf("%s: %d", p, rec.Code)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 && c != http.StatusServiceUnavailable {
			t.Errorf("completion answered %d", c)
		}
	}
	for i, v := range s.Slots() {
		if v.Processing || v.Transferring {
			t.Errorf("slot %d still busy: %+v", i, v)
		}
	}
}
