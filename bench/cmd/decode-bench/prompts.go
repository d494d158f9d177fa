package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// words are the prompts' vocabulary: plain English, so that any tokenizer
// splits it the ordinary way.
var words = strings.Fields(`the a of and to in is that for it as with was on be by this are from at or an
which have has not but all were when we there can more one if their will each about how up out them then
she many some so these would other into time two like him see could no make than first been its who now
people my made over did down only way find use may water long little very after words called just where
most know get through back much before go good new write our used me man too any day same right look think
also around another came come work three word must because does part even place well such here take why
things help put years different away again off went old number great tell men say small every found still
between name should home big give air line set own under read last never us left end along while might next
sound below saw something thought both few those always looked show large often together asked house world
going want school important until form food keep children feet land side without boy once animals life enough
took sometimes four head above kind began almost live page got earth need far hand high year mother light
country father let night following picture being study second eyes soon times story boys since white days
ever paper hard near sentence better best across during today others however sure means knew try told young
miles sun ways thing whole hear example heard several change answer room sea against top turned learn point
city play toward five using himself usually`)

// promptText is a deterministic text of n words; each seed gives another
// text from its first word on, so that no server finds it in a cache.
func promptText(seed, n int) string {
	var b strings.Builder
	x := uint64(seed)*0x9E3779B97F4A7C15 + 0x2545F4914F6CDD1D
	for i := range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if i > 0 {
			b.WriteByte(' ')
		}
		w := words[x%uint64(len(words))]
		if i == 0 || x%11 == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		b.WriteString(w)
		if x%13 == 0 {
			b.WriteByte('.')
		}
	}
	b.WriteByte('.')
	return b.String()
}

// tokenizer turns texts into the model's tokens with llama-batched
// -tokenize: the same llama.cpp tokenizer Ollama's llamarunner uses (BOS
// added, special tokens parsed).
type tokenizer struct {
	bin, model, dir string
}

func (t tokenizer) tokenize(ctx context.Context, texts []string) ([][]int32, error) {
	f := filepath.Join(t.dir, "prompts.json")
	b, err := json.Marshal(texts)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f, b, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, t.bin, "-m", t.model, "-tokenize", "-prompt-file", f)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -tokenize: %w\n%s", t.bin, err, errb.String())
	}
	var toks [][]int32
	if err := json.Unmarshal(out.Bytes(), &toks); err != nil {
		return nil, fmt.Errorf("%s -tokenize: %w", t.bin, err)
	}
	if len(toks) != len(texts) {
		return nil, fmt.Errorf("%s -tokenize: %d token lists for %d texts", t.bin, len(toks), len(texts))
	}
	return toks, nil
}

// prompts makes texts of about n tokens each: it measures the tokens a
// word takes on a long sample, then tokenizes every text it returns.
func (t tokenizer) prompts(ctx context.Context, seeds []int, n int) ([]prompt, error) {
	const sampleWords = 400
	cal, err := t.tokenize(ctx, []string{promptText(-1, sampleWords)})
	if err != nil {
		return nil, err
	}
	perWord := float64(len(cal[0])-1) / sampleWords // BOS aside
	nWords := max(int(float64(n-1)/perWord+0.5), 1)
	texts := make([]string, len(seeds))
	for i, s := range seeds {
		texts[i] = promptText(s, nWords)
	}
	toks, err := t.tokenize(ctx, texts)
	if err != nil {
		return nil, err
	}
	ps := make([]prompt, len(texts))
	for i := range texts {
		ps[i] = prompt{Text: texts[i], Tokens: toks[i]}
	}
	return ps, nil
}

// extend is p's text with a few words more, tokenized.
func (t tokenizer) extend(ctx context.Context, ps []prompt, seed, nWords int) ([]prompt, error) {
	texts := make([]string, len(ps))
	for i, p := range ps {
		texts[i] = p.Text + " " + promptText(seed+i, nWords)
	}
	toks, err := t.tokenize(ctx, texts)
	if err != nil {
		return nil, err
	}
	out := make([]prompt, len(ps))
	for i := range ps {
		out[i] = prompt{Text: texts[i], Tokens: toks[i]}
	}
	return out, nil
}
