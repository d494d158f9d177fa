package httpapi

import (
	"context"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// rankServer serves the mock with rank pooling (--reranking), its info
// changed by edit, recording what Embed gets.
func rankServer(t *testing.T, edit func(*iface.BackendInfo)) (*recordingBackend, http.Handler) {
	t.Helper()
	b, info := loadMockWith(t, 1, map[string]string{mock.OptEmbeddings: "true", mock.OptPooling: iface.PoolingRank})
	if edit != nil {
		edit(&info)
	}
	rb := &recordingBackend{Backend: b}
	_, h := serve(t, rb, info, nil)
	return rb, h
}

type jinaReply struct {
	Model   string `json:"model"`
	Object  string `json:"object"`
	Results []struct {
		Index          int      `json:"index"`
		RelevanceScore *float64 `json:"relevance_score"`
		Score          *float64 `json:"score"`
	} `json:"results"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func bytesOf(s ...string) []int32 {
	var out []int32
	for _, x := range s {
		out = append(out, mock.Tokenize(x)...)
	}
	return out
}

// TestRerank: each document's prompt is the query and the document (the
// mock adds no separators and has no template), its relevance the rank
// pooling's score unnormalised; the results sorted by it, cut to top_n.
func TestRerank(t *testing.T) {
	rb, h := rankServer(t, nil)
	docs := []string{"apples", "bananas", "cherries", "dates"}
	for _, path := range []string{"/rerank", "/reranking", "/v1/rerank", "/v1/reranking"} {
		rec := post(h, path, `{"query":"fruit?","documents":["apples","bananas","cherries","dates"],"top_n":3}`)
		var out jinaReply
		decodeBody(t, rec.Body.Bytes(), &out)
		if rec.Code != 200 || out.Object != "list" || out.Model != "mock" || len(out.Results) != 3 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		var inputs [][]int32
		for _, d := range docs {
			inputs = append(inputs, bytesOf("fruit?", d))
		}
		last := rb.embeds[len(rb.embeds)-1]
		if !reflect.DeepEqual(last.Inputs, inputs) || last.Normalize == nil || *last.Normalize != -1 {
			t.Errorf("%s: Embed got %v normalize %v, want the query and each document, not normalised", path, last.Inputs, last.Normalize)
		}
		raw := -1
		want, _ := rb.Backend.Embed(context.Background(), iface.EmbedRequest{Inputs: inputs, Normalize: &raw})
		scores := map[int]float64{}
		for i, e := range want {
			scores[i] = float64(e.Vectors[0][0])
		}
		order := []int{0, 1, 2, 3}
		slices.SortStableFunc(order, func(x, y int) int {
			if scores[x] > scores[y] {
				return -1
			} else if scores[x] < scores[y] {
				return 1
			}
			return 0
		})
		for k, r := range out.Results {
			if r.Index != order[k] || r.RelevanceScore == nil || *r.RelevanceScore != float64(float32(scores[r.Index])) || r.Score != nil {
				t.Errorf("%s: result %d is %+v, want document %d with %v", path, k, r, order[k], scores[order[k]])
			}
		}
		if n := len(inputs[0]) + len(inputs[1]) + len(inputs[2]) + len(inputs[3]); out.Usage.PromptTokens != n || out.Usage.TotalTokens != n {
			t.Errorf("%s: usage %+v, want %d", path, out.Usage, n)
		}
	}
	// TEI's shape: texts, the bare list, each text where asked.
	rec := post(h, "/rerank", `{"query":"q","texts":["a","b"],"return_text":true}`)
	var tei []struct {
		Index int      `json:"index"`
		Score *float64 `json:"score"`
		Text  string   `json:"text"`
	}
	decodeBody(t, rec.Body.Bytes(), &tei)
	if rec.Code != 200 || len(tei) != 2 || tei[0].Score == nil || tei[0].Text != []string{"a", "b"}[tei[0].Index] || tei[0].Index == tei[1].Index {
		t.Errorf("TEI: %d %s", rec.Code, rec.Body)
	}
	// return_text is TEI's alone; top_n 0 answers no document.
	rec = post(h, "/rerank", `{"query":"q","documents":["a"],"return_text":true,"top_n":0}`)
	var none jinaReply
	decodeBody(t, rec.Body.Bytes(), &none)
	if rec.Code != 200 || len(none.Results) != 0 || none.Usage.PromptTokens != 2 {
		t.Errorf("top_n 0: %d %s", rec.Code, rec.Body)
	}
}

// TestRerankPrompts: a model's rerank template, or its BOS, EOS and SEP as
// its vocabulary adds them (SEP in EOS's place where it has none).
func TestRerankPrompts(t *testing.T) {
	rb, h := rankServer(t, func(info *iface.BackendInfo) { info.RerankTemplate = "Q={query};D={document}." })
	if rec := post(h, "/v1/rerank", `{"query":"a{document}","documents":["x","yz"]}`); rec.Code != 200 {
		t.Fatalf("template: %d %s", rec.Code, rec.Body)
	}
	want := [][]int32{bytesOf("Q=ax;D=x."), bytesOf("Q=ayz;D=yz.")}
	if got := rb.embeds[0].Inputs; !reflect.DeepEqual(got, want) {
		t.Errorf("template prompts %q, want %q", got, want)
	}
	rb, h = rankServer(t, func(info *iface.BackendInfo) {
		sp := *info.Special
		sp.BOS, sp.SEP, sp.AddBOS, sp.AddEOS, sp.AddSEP = 1, 3, true, true, true
		info.Special = &sp
	})
	if rec := post(h, "/v1/rerank", `{"query":"q","documents":["d"]}`); rec.Code != 200 {
		t.Fatalf("separators: %d %s", rec.Code, rec.Body)
	}
	if got, want := rb.embeds[0].Inputs[0], []int32{1, 'q', mock.EOS, 3, 'd', mock.EOS}; !reflect.DeepEqual(got, want) {
		t.Errorf("BOS q EOS SEP d EOS: %v, want %v", got, want)
	}
	rb, h = rankServer(t, func(info *iface.BackendInfo) {
		sp := *info.Special
		sp.EOS, sp.SEP, sp.AddEOS = iface.NoToken, 3, true
		info.Special = &sp
	})
	if rec := post(h, "/v1/rerank", `{"query":"q","documents":["d"]}`); rec.Code != 200 {
		t.Fatalf("no EOS: %d %s", rec.Code, rec.Body)
	}
	if got, want := rb.embeds[0].Inputs[0], []int32{'q', 3, 'd', 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("SEP for EOS: %v, want %v", got, want)
	}
}

// TestRerankBadInput: 400s naming the field.
func TestRerankBadInput(t *testing.T) {
	_, h := rankServer(t, nil)
	for _, c := range []struct{ body, param, msg string }{
		{`{"documents":["a"]}`, "query", `"query" must be provided`},
		{`{"query":3,"documents":["a"]}`, "query", `"query" must be a string`},
		{`{"query":null,"documents":["a"]}`, "query", `"query" must be a string`},
		{`{"query":"q"}`, "texts", `"documents" must be a non-empty string array`},
		{`{"query":"q","documents":[]}`, "documents", `"documents" must be a non-empty string array`},
		{`{"query":"q","documents":[1]}`, "documents", `"documents" must be a non-empty string array`},
		{`{"query":"q","documents":["a"],"top_n":-1}`, "top_n", "top_n must be 0 or more"},
		{`{"query":"q","documents":["a"],"top_n":"2"}`, "top_n", "field top_n"},
	} {
		rec := post(h, "/v1/rerank", c.body)
		e := errorOf(t, rec.Body.Bytes())
		param, _ := e["param"].(string)
		msg, _ := e["message"].(string)
		if rec.Code != 400 || param != c.param || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %s, want param %q and %q", c.body, rec.Code, rec.Body, c.param, c.msg)
		}
	}
}
