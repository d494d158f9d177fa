package gguf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Tokenizer is a Hugging Face byte-level BPE tokenizer (a directory with
// tokenizer.json and tokenizer_config.json, as the Hub ships them) turned
// into the GGUF tokenizer metadata that llama.cpp's convert_hf_to_gguf.py
// writes for it: tokenizer model "gpt2", the pre-tokenizer name llama.cpp
// knows the family by, every token with its type, the merges, the special
// token ids, the add-BOS/EOS flags and the chat template. A model written
// with it tokenizes, in llama.cpp, as the real model of that family does.
type Tokenizer struct {
	Pre    string   // tokenizer.ggml.pre
	Tokens []string // by id; ids no token has are "[PAD<id>]"
	Types  []int32  // Token* by id
	Merges []string // "left right", rank order

	// Special maps bos, eos, unk, sep, pad, mask (and eot or eom, where
	// the post-processor makes the end token another one) to their ids.
	Special map[string]int
	// Add maps bos, eos and sep to whether a tokenizer adds them.
	Add map[string]bool
	// ChatTemplate is the default template, "" for none; Templates are
	// the named others, if tokenizer_config.json has a list of them.
	ChatTemplate string
	Templates    map[string]string

	kv []kvPair // the metadata after the tokens, in convert's order
}

// Token types (llama_token_type, gguf-py's TokenType).
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)

// Size is the tokenizer's vocabulary: its highest id plus one. A model
// needs at least that many rows.
func (t *Tokenizer) Size() int { return len(t.Tokens) }

// hfTokenizer is what LoadTokenizer reads of tokenizer.json.
type hfTokenizer struct {
	Model struct {
		Type         string          `json:"type"`
		Vocab        map[string]int  `json:"vocab"`
		Merges       json.RawMessage `json:"merges"`
		ByteFallback bool            `json:"byte_fallback"`
	} `json:"model"`
	Added         []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

type hfAddedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	Special    bool   `json:"special"`
	Normalized bool   `json:"normalized"`
}

// hfComponent is a normalizer, pre-tokenizer, post-processor or decoder:
// its type and, for a Sequence, its parts.
type hfComponent struct {
	Type        string           `json:"type"`
	Pattern     json.RawMessage  `json:"pattern"`
	Seq         []hfComponent    `json:"pretokenizers"`
	Normalizers []hfComponent    `json:"normalizers"`
	Processors  []hfComponent    `json:"processors"`
	Decoders    []hfComponent    `json:"decoders"`
	Single      []hfTemplatePart `json:"single"`
	Pair        []hfTemplatePart `json:"pair"`
	Cls         json.RawMessage  `json:"cls"`
	Sep         json.RawMessage  `json:"sep"`
	Lowercase   *bool            `json:"lowercase"`
	StripAcc    *bool            `json:"strip_accents"`
}

type hfTemplatePart struct {
	Special *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// LoadTokenizer reads the Hugging Face tokenizer in dir. pre names the
// llama.cpp pre-tokenizer; "" picks it from the tokenizer's own
// pre-tokenizer (PreTokenizerName), which knows the families the tests use.
func LoadTokenizer(dir, pre string) (*Tokenizer, error) {
	var hf hfTokenizer
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &hf, false); err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg, true); err != nil {
		return nil, err
	}
	if hf.Model.Type != "BPE" || hf.Model.ByteFallback || !hasType(hf.PreTokenizer, "ByteLevel") {
		return nil, fmt.Errorf("gguf: %s: not a byte-level BPE tokenizer (model %q): only llama.cpp's gpt2 tokenizer model is written", dir, hf.Model.Type)
	}
	t := &Tokenizer{Special: map[string]int{}, Add: map[string]bool{}}
	var err error
	if t.Tokens, t.Types, err = hf.tokens(cfg); err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", dir, err)
	}
	if t.Merges, err = hf.merges(); err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", dir, err)
	}
	if t.Pre = pre; pre == "" {
		if t.Pre, err = PreTokenizerName(hf.PreTokenizer, addsBOS(&hf, cfg)); err != nil {
			return nil, fmt.Errorf("gguf: %s: %w", dir, err)
		}
	}
	if err := t.specials(dir, &hf, cfg); err != nil {
		return nil, fmt.Errorf("gguf: %s: %w", dir, err)
	}
	return t, nil
}

// readJSON decodes path into v; a missing optional file leaves v as it is.
func readJSON(path string, v any, optional bool) error {
	b, err := os.ReadFile(path)
	if optional && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("gguf: %s: %w", path, err)
	}
	return nil
}

// hasType reports whether a component, or any part of a Sequence, has
// type typ.
func hasType(raw json.RawMessage, typ string) bool {
	var c hfComponent
	if len(raw) == 0 || json.Unmarshal(raw, &c) != nil {
		return false
	}
	return c.has(typ)
}

func (c hfComponent) has(typ string) bool {
	if c.Type == typ {
		return true
	}
	for _, parts := range [][]hfComponent{c.Seq, c.Normalizers, c.Processors, c.Decoders} {
		for _, p := range parts {
			if p.has(typ) {
				return true
			}
		}
	}
	return false
}

// tokens lists the vocabulary by id as convert's get_vocab_base does: the
// model's pieces are normal; an added token is a control token if it is
// special or looks like one (<|…|>, <｜…｜>), user-defined otherwise (then
// with "▁" as a space, since llama.cpp takes added tokens pre-normalized);
// a non-normalized added token is stored as the tokenizer decodes it back.
// An id no token has is an unused "[PAD<id>]".
func (hf *hfTokenizer) tokens(cfg map[string]any) ([]string, []int32, error) {
	n := 0
	for _, id := range hf.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range hf.Added {
		n = max(n, a.ID+1)
	}
	if n == 0 || n > maxVocab {
		return nil, nil, fmt.Errorf("vocabulary of %d tokens", n)
	}
	tokens, types := make([]string, n), make([]int32, n)
	for piece, id := range hf.Model.Vocab {
		if id < 0 {
			return nil, nil, fmt.Errorf("token %q has id %d", piece, id)
		}
		tokens[id], types[id] = piece, TokenNormal
	}
	cleanup, _ := cfg["clean_up_tokenization_spaces"].(bool)
	byteLevel := hasType(hf.Decoder, "ByteLevel")
	// An added token's id may also be a model piece's; the added token is
	// what the tokenizer decodes that id to, so it wins.
	for _, a := range hf.Added {
		if a.ID < 0 {
			return nil, nil, fmt.Errorf("added token %q has id %d", a.Content, a.ID)
		}
		tok := a.Content
		if !a.Normalized {
			tok = roundTrip(tok, byteLevel, cleanup)
		}
		if a.Special || looksSpecial(tok) {
			tokens[a.ID], types[a.ID] = tok, TokenControl
		} else {
			tokens[a.ID], types[a.ID] = strings.ReplaceAll(tok, "▁", " "), TokenUserDefined
		}
	}
	for i := range tokens {
		if types[i] == 0 {
			tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), TokenUnused
		}
	}
	return tokens, types, nil
}

// looksSpecial is convert's test for added tokens some tokenizers fail to
// mark special although they are control tokens.
func looksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>") ||
		strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>") ||
		strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">")
}

// roundTrip is an added token encoded alone and decoded back, as Hugging
// Face's tokenizers do it: the token itself comes back, passed through the
// byte-level decoder, which maps a token only if every character is in its
// byte alphabet (so "<think>" stays, and so does "<｜x｜>"), and through the
// tokenizer's clean-up of spaces before punctuation where it is on.
func roundTrip(s string, byteLevel, cleanup bool) string {
	if byteLevel {
		var b []byte
		ok := true
		for _, r := range s {
			c, in := byteOfRune[r]
			if !in {
				ok = false
				break
			}
			b = append(b, c)
		}
		if ok {
			s = lossyUTF8(b)
		}
	}
	if cleanup {
		s = strings.NewReplacer(" .", ".", " ?", "?", " !", "!", " ,", ",", " ' ", "'",
			" n't", "n't", " 'm", "'m", " 's", "'s", " 've", "'ve", " 're", "'re").Replace(s)
	}
	return s
}

// byteOfRune inverts GPT-2's byte-level alphabet: printable bytes stand for
// themselves, the others (controls, space, DEL, NBSP, soft hyphen) for
// 256, 257, … in byte order.
var byteOfRune = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	next := rune(256)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae {
			m[rune(b)] = byte(b)
		} else {
			m[next] = byte(b)
			next++
		}
	}
	return m
}()

// lossyUTF8 is b as text, each invalid byte a U+FFFD.
func lossyUTF8(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		sb.WriteRune(r) // RuneError for an invalid byte
		b = b[n:]
	}
	return sb.String()
}

// merges are tokenizer.json's merges as llama.cpp reads them: "left
// right"; the newer pair form has its spaces written as "Ġ" (U+0120), the
// byte-level space, as convert writes them.
func (hf *hfTokenizer) merges() ([]string, error) {
	if len(hf.Model.Merges) == 0 {
		return nil, errors.New("no merges")
	}
	var old []string
	if err := json.Unmarshal(hf.Model.Merges, &old); err == nil {
		return old, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(hf.Model.Merges, &pairs); err != nil {
		return nil, fmt.Errorf("merges: %w", err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("merge %d has %d parts", i, len(p))
		}
		out[i] = strings.ReplaceAll(p[0], " ", "Ġ") + " " + strings.ReplaceAll(p[1], " ", "Ġ")
	}
	return out, nil
}

// Pre-tokenizer regular expressions of the families the tests use, as
// their tokenizer.json Split pre-tokenizers write them.
const (
	qwen2Split  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Split = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	o200kSplit  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek V3's three splits; the third has real CR and LF in it.
	deepseek3Split = `\p{N}{1,3}` + "\x00" + "[一-龥\u3040-ゟ゠-ヿ]+" + "\x00" +
		"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// preNames maps a pre-tokenizer's splits (joined by NUL) to llama.cpp's
// names for it, without and with a BOS token added in front. convert
// names a tokenizer by the hash of its encoding of a test text, so the
// same splits get another name when the tokenizer adds a BOS.
var preNames = map[string][2]string{
	qwen2Split:     {"qwen2", "qwen2"},
	llama3Split:    {"smaug-bpe", "llama-bpe"},
	o200kSplit:     {"gpt-4o", "gpt-4o"},
	deepseek3Split: {"joyai-llm", "deepseek-v3"},
}

// PreTokenizerName is the tokenizer.ggml.pre convert_hf_to_gguf.py gives
// a tokenizer.json pre-tokenizer (raw JSON) of a known family; bos says
// whether the tokenizer adds a BOS token when it encodes.
func PreTokenizerName(raw json.RawMessage, bos bool) (string, error) {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", fmt.Errorf("pre_tokenizer: %w", err)
	}
	var splits []string
	var walk func(c hfComponent)
	walk = func(c hfComponent) {
		if c.Type == "Split" {
			var p struct{ Regex, String *string }
			if json.Unmarshal(c.Pattern, &p) == nil && p.Regex != nil {
				splits = append(splits, *p.Regex)
			}
		}
		for _, s := range c.Seq {
			walk(s)
		}
	}
	walk(c)
	names, ok := preNames[strings.Join(splits, "\x00")]
	if !ok {
		return "", errors.New("pre-tokenizer of no known family (Qwen2/3, Llama 3, GPT-4o/gpt-oss, DeepSeek V3): name llama.cpp's pre-tokenizer for it")
	}
	if bos {
		return names[1], nil
	}
	return names[0], nil
}

// addsBOS reports whether Hugging Face's Python tokenizer puts a BOS token
// in front of what it encodes: its post-processor's template starts with
// a special token, or it is a LlamaTokenizerFast, which adds one unless
// add_bos_token is false.
func addsBOS(hf *hfTokenizer, cfg map[string]any) bool {
	var post hfComponent
	if len(hf.PostProcessor) > 0 && json.Unmarshal(hf.PostProcessor, &post) == nil {
		for _, p := range append([]hfComponent{post}, post.Processors...) {
			if p.Type == "TemplateProcessing" && len(p.Single) > 1 && p.Single[0].Special != nil {
				return true
			}
		}
	}
	add, set := cfg["add_bos_token"].(bool)
	return cfg["tokenizer_class"] == "LlamaTokenizerFast" && (add || !set)
}

// specialTypes are the special tokens convert looks up, in its order.
var specialTypes = []string{"bos", "eos", "unk", "sep", "pad", "cls", "mask"}

// specialKeys are the GGUF keys of the special token ids; convert has no
// key for cls and skips it.
var specialKeys = map[string]string{
	"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
	"unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
	"pad": "tokenizer.ggml.padding_token_id", "mask": "tokenizer.ggml.mask_token_id",
	"eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
}

// specials reads the special tokens, the add flags, the normalizer flags
// and the chat templates as gguf-py's SpecialVocab does, and lays out
// their metadata in its order: ids, flags, template, normalizer.
func (t *Tokenizer) specials(dir string, hf *hfTokenizer, cfg map[string]any) error {
	sv := specialVocab{t: t, cfg: cfg, types: slices.Clone(specialTypes)}
	sv.postProcessor(hf)
	if len(cfg) > 0 { // SpecialVocab reads nothing more of an empty config
		if err := t.templates(dir, cfg); err != nil {
			return err
		}
		for _, typ := range sv.types {
			if v, ok := cfg["add_"+typ+"_token"].(bool); ok {
				sv.setAdd(typ, v)
			}
			var name string
			switch v := cfg[typ+"_token"].(type) {
			case string:
				name = v
			case map[string]any:
				name, _ = v["content"].(string)
			}
			if name == "" {
				continue
			}
			for _, a := range hf.Added { // only an added token is looked up
				if a.Content == name {
					sv.setID(typ, a.ID)
					break
				}
			}
		}
	}
	var model map[string]any
	if err := readJSON(filepath.Join(dir, "config.json"), &model, true); err != nil {
		return err
	}
	for _, typ := range sv.types {
		v, ok := model[typ+"_token_id"].(float64)
		if text, isMap := model["text_config"].(map[string]any); !ok && isMap {
			v, ok = text[typ+"_token_id"].(float64)
		}
		if ok {
			sv.setID(typ, int(v))
		}
	}
	for _, typ := range sv.idOrder {
		if key, ok := specialKeys[typ]; ok {
			t.kv = append(t.kv, kvPair{key, uint32(t.Special[typ])})
		}
	}
	for _, typ := range sv.addOrder {
		if typ == "bos" || typ == "eos" || typ == "sep" { // the flags gguf-py has keys for
			t.kv = append(t.kv, kvPair{"tokenizer.ggml.add_" + typ + "_token", t.Add[typ]})
		}
	}
	t.kv = append(t.kv, t.templateKV()...)
	var norm hfComponent
	if len(hf.Normalizer) > 0 && json.Unmarshal(hf.Normalizer, &norm) == nil {
		lower, strip := norm.flags()
		if lower != nil {
			t.kv = append(t.kv, kvPair{"tokenizer.ggml.normalizer.lowercase", *lower})
		}
		if strip != nil {
			t.kv = append(t.kv, kvPair{"tokenizer.ggml.normalizer.strip_accents", *strip})
		}
	}
	return nil
}

// specialVocab is SpecialVocab's state while it reads: the special types
// it looks for and the order it set ids and flags in (convert writes them
// in that order).
type specialVocab struct {
	t                 *Tokenizer
	cfg               map[string]any
	types             []string
	idOrder, addOrder []string
}

func (sv *specialVocab) setID(typ string, id int) {
	if _, dup := sv.t.Special[typ]; !dup && id >= 0 {
		sv.t.Special[typ] = id
		sv.idOrder = append(sv.idOrder, typ)
	}
}

func (sv *specialVocab) setAdd(typ string, v bool) {
	if _, dup := sv.t.Add[typ]; !dup {
		sv.addOrder = append(sv.addOrder, typ)
	}
	sv.t.Add[typ] = v
}

// cfgToken is a tokenizer_config.json token entry as SpecialVocab compares
// it: set is whether it is there at all (an AddedToken object counts), text
// its value where it is a plain string.
func (sv *specialVocab) cfgToken(typ string) (text string, set bool) {
	v, ok := sv.cfg[typ+"_token"]
	if !ok || v == nil || v == "" {
		return "", false
	}
	s, _ := v.(string)
	return s, true
}

// postProcessor reads the flags a RobertaProcessing or a simple
// TemplateProcessing implies, as SpecialVocab's crude parse does: a
// single-sequence template's leading special token is a BOS it adds, its
// trailing one an EOS (one other than the configured EOS becomes the EOS,
// and the configured one the EOT), and a special token between A and B of
// the pair template a separator.
func (sv *specialVocab) postProcessor(hf *hfTokenizer) {
	var post hfComponent
	if len(hf.PostProcessor) == 0 || json.Unmarshal(hf.PostProcessor, &post) != nil {
		return
	}
	procs := post.Processors
	if len(procs) == 0 {
		procs = []hfComponent{post}
	}
	hasCfg := len(sv.cfg) > 0
	for _, p := range procs {
		switch p.Type {
		case "RobertaProcessing":
			sv.setAdd("bos", true)
			sv.setAdd("eos", true)
			sv.setAdd("sep", true)
			bos, _ := sv.cfgToken("bos")
			eos, _ := sv.cfgToken("eos")
			for _, d := range []struct {
				typ, field, def string
			}{{"cls", string(p.Cls), bos}, {"sep", string(p.Sep), eos}} {
				if _, set := sv.cfgToken(d.typ); !set && hasCfg {
					var pair []any
					tok := d.def
					if json.Unmarshal([]byte(d.field), &pair) == nil && len(pair) > 0 {
						tok, _ = pair[0].(string)
					}
					sv.cfg[d.typ+"_token"] = tok
				}
			}
		case "TemplateProcessing":
			sv.template(p, hasCfg)
		}
	}
}

// template is SpecialVocab's reading of one TemplateProcessing.
func (sv *specialVocab) template(p hfComponent, hasCfg bool) {
	bos, bosSet := sv.cfgToken("bos")
	cls, clsSet := sv.cfgToken("cls")
	eos, _ := sv.cfgToken("eos")
	sep, _ := sv.cfgToken("sep")
	var first, last string
	if len(p.Single) > 1 {
		if s := p.Single[0].Special; s != nil && s.ID != "" {
			first = s.ID
			if !hasCfg {
				bos = first
			} else if first != bos && first != cls {
				if !bosSet {
					sv.cfg["bos_token"], bos = first, first
				}
				if !clsSet {
					sv.cfg["cls_token"], cls = first, first
				}
			}
			sv.setAdd("bos", first == bos || first == cls)
		}
		if s := p.Single[len(p.Single)-1].Special; s != nil && s.ID != "" {
			last = s.ID
			if !hasCfg {
				eos = last
			} else if last != eos {
				for _, extra := range []string{"eot", "eom"} {
					if !slices.Contains(sv.types, extra) {
						sv.types = append(sv.types, extra)
						sv.cfg[extra+"_token"] = sv.cfg["eos_token"]
						break
					}
				}
				sv.cfg["eos_token"], eos = last, last
			}
			sv.setAdd("eos", last == eos)
		}
	}
	pair := p.Pair
	if first != "" && len(pair) > 0 && pair[0].Special != nil && pair[0].Special.ID == first {
		pair = pair[1:]
	}
	if last != "" && len(pair) > 0 && pair[len(pair)-1].Special != nil && pair[len(pair)-1].Special.ID == last {
		pair = pair[:len(pair)-1]
	}
	if len(pair) < 3 || pair[0].Sequence == nil || pair[0].Sequence.ID != "A" ||
		pair[len(pair)-1].Sequence == nil || pair[len(pair)-1].Sequence.ID != "B" {
		return
	}
	mid := pair[1 : len(pair)-1]
	addSep := false
	if s := mid[0].Special; s != nil && s.ID != "" && (s.ID == sep || s.ID == eos) && last == "" {
		addSep = true
	}
	if len(mid) == 2 {
		if s := mid[1].Special; s != nil && s.ID != "" && (s.ID == sep || s.ID == eos) {
			addSep = true
		}
	}
	sv.setAdd("sep", addSep)
	if _, set := sv.cfgToken("sep"); addSep && !set && hasCfg {
		sv.cfg["sep_token"] = eos
	}
}

// flags are the lowercase and strip-accents settings a normalizer makes,
// nil where it says nothing.
func (c hfComponent) flags() (lower, strip *bool) {
	yes := true
	switch c.Type {
	case "Lowercase":
		lower = &yes
	case "StripAccents":
		strip = &yes
	case "BertNormalizer":
		lower, strip = c.Lowercase, c.StripAcc
	case "Sequence":
		for _, n := range c.Normalizers {
			l, s := n.flags()
			if l != nil {
				lower = l
			}
			if s != nil {
				strip = s
			}
		}
	}
	return lower, strip
}

// templates reads the chat template: tokenizer_config.json's (a string, or
// a list of named ones), else chat_template.jinja (with
// additional_chat_templates/*.jinja as named ones) or chat_template.json.
func (t *Tokenizer) templates(dir string, cfg map[string]any) error {
	v, ok := cfg["chat_template"]
	if !ok {
		if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
			t.ChatTemplate = string(b)
			extra, _ := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
			for _, p := range extra {
				b, err := os.ReadFile(p)
				if err != nil {
					return fmt.Errorf("gguf: %w", err)
				}
				t.addNamed(strings.TrimSuffix(filepath.Base(p), ".jinja"), string(b))
			}
			return nil
		}
		var j map[string]any
		if err := readJSON(filepath.Join(dir, "chat_template.json"), &j, true); err != nil {
			return err
		}
		v = j["chat_template"]
	}
	switch v := v.(type) {
	case string:
		t.ChatTemplate = v
	case []any:
		for _, e := range v {
			m, _ := e.(map[string]any)
			name, _ := m["name"].(string)
			tmpl, ok := m["template"].(string)
			if ok {
				t.addNamed(name, tmpl)
			}
		}
	}
	return nil
}

// templateNameChar is what a template name may not have.
var templateNameChar = regexp.MustCompile(`[^A-Za-z0-9]`)

// addNamed keeps a named template; "default" is the default one. Names
// are kept to letters, digits and underscores, as gguf-py keeps them.
func (t *Tokenizer) addNamed(name, tmpl string) {
	name = templateNameChar.ReplaceAllString(name, "_")
	switch name {
	case "":
	case "default":
		t.ChatTemplate = tmpl
	default:
		if t.Templates == nil {
			t.Templates = map[string]string{}
		}
		t.Templates[name] = tmpl
	}
}

// templateKV is the chat templates' metadata: the named ones, their names
// (sorted: gguf-py writes a set, in no fixed order) and the default.
func (t *Tokenizer) templateKV() []kvPair {
	var kv []kvPair
	names := make([]string, 0, len(t.Templates))
	for n := range t.Templates {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		kv = append(kv, kvPair{"tokenizer.chat_template." + n, t.Templates[n]})
	}
	if len(names) > 0 {
		kv = append(kv, kvPair{"tokenizer.chat_templates", names})
	}
	if t.ChatTemplate != "" {
		kv = append(kv, kvPair{"tokenizer.chat_template", t.ChatTemplate})
	}
	return kv
}

// metadata is the tokenizer's GGUF metadata for a model of vocab rows
// (at least Size; the rows past the tokenizer are unused "[PAD<id>]"
// tokens, as convert pads a model whose config has more rows).
func (t *Tokenizer) metadata(vocab int) []kvPair {
	tokens, types := t.Tokens, t.Types
	for i := len(tokens); i < vocab; i++ {
		tokens = append(tokens[:i:i], fmt.Sprintf("[PAD%d]", i))
		types = append(types[:i:i], TokenUnused)
	}
	kv := []kvPair{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", t.Pre},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.merges", t.Merges},
	}
	return append(kv, t.kv...)
}
