package httpapi

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// replySpy is the mock backend noting how much of the reply had been
// written each time the host asked it for a slot's state, which it does
// when it frees the slot.
type replySpy struct {
	iface.Backend
	rec     *httptest.ResponseRecorder
	written []string
}

func (b *replySpy) Slot(ctx context.Context, i int) (iface.SlotInfo, error) {
	b.written = append(b.written, b.rec.Body.String())
	return b.Backend.Slot(ctx, i)
}

// TestSlotFreedBeforeReplyEnds: a completion frees its slot before the
// reply's last byte, so a client's next request, sent the moment the reply
// ends, finds the slot and the prompt it holds (as RPC frees a slot before
// its trailer).
func TestSlotFreedBeforeReplyEnds(t *testing.T) {
	for _, tc := range []struct{ name, body, last string }{
		{"json", `{"prompt":"Once","max_tokens":4}`, `"choices"`},
		{"stream", `{"prompt":"Once","max_tokens":4,"stream":true}`, "[DONE]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mock.New(nil)
			info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 1})
			if err != nil {
				t.Fatal(err)
			}
			spy := &replySpy{Backend: m, rec: httptest.NewRecorder()}
			_, h := serve(t, spy, info, nil)
			h.ServeHTTP(spy.rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(tc.body)))
			if spy.rec.Code != 200 || !strings.Contains(spy.rec.Body.String(), tc.last) {
				t.Fatalf("%d %s", spy.rec.Code, spy.rec.Body)
			}
			if len(spy.written) == 0 {
				t.Fatal("the slot was never freed")
			}
			if at := spy.written[len(spy.written)-1]; strings.Contains(at, tc.last) {
				t.Fatalf("the slot was freed after the reply's end was written:\n%s", at)
			}
		})
	}
}
