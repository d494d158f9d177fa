package request

import (
	"bytes"
	"encoding/json"
	"math"
)

// textPrompt is a text completion's prompt: text, token ids, or pieces of
// text and token ids mixed.
type textPrompt struct {
	text   string
	tokens []int32
	pieces []Piece
}

// Piece is a piece of a mixed prompt ([12, "text", 34], as llama-server
// takes one): text, or a run of token ids (Tokens set).
type Piece struct {
	Text   string
	Tokens []int32
}

// parsePrompt reads a text completion's prompt: a string, token ids, or
// strings and token ids mixed, alone or as the only element of a batch (one
// choice per request here).
func parsePrompt(raw json.RawMessage) (textPrompt, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return textPrompt{}, badRequest("prompt is required")
	}
	var p textPrompt
	if ids, ok := IDArray(raw); ok { // the common shape, read in one pass
		var err error
		p.tokens, err = tokenIDs(ids, 0)
		return p, err
	}
	if json.Unmarshal(raw, &p.text) == nil {
		return p, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		var err error
		p.tokens, err = tokenIDs(ids, 0)
		return p, err
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) != nil {
		return p, badRequest("prompt must be a string, an array of token ids, or strings and token ids mixed")
	}
	if pieces, ok, err := mixedPieces(batch); ok || err != nil {
		p.pieces = pieces
		return p, err
	}
	if len(batch) != 1 {
		return p, badRequest("prompt batches of %d are not supported: send one prompt per request", len(batch))
	}
	return parsePrompt(batch[0])
}

// mixedPieces reads an array of strings and token ids with both in it
// (ok); any other array is not a mixed prompt.
func mixedPieces(elems []json.RawMessage) (pieces []Piece, ok bool, err error) {
	var hasText, hasID bool
	for _, e := range elems {
		var s string
		var id int64
		switch {
		case string(bytes.TrimSpace(e)) == "null": // decodes as "" and 0 alike: neither
			return nil, false, nil
		case json.Unmarshal(e, &s) == nil:
			hasText = true
		case json.Unmarshal(e, &id) == nil:
			hasID = true
		default:
			return nil, false, nil
		}
	}
	if !hasText || !hasID {
		return nil, false, nil
	}
	for i, e := range elems {
		var s string
		if json.Unmarshal(e, &s) == nil {
			pieces = append(pieces, Piece{Text: s})
			continue
		}
		var id int64
		_ = json.Unmarshal(e, &id)
		toks, err := tokenIDs([]int64{id}, i)
		if err != nil {
			return nil, true, err
		}
		if n := len(pieces); n > 0 && pieces[n-1].Tokens != nil {
			pieces[n-1].Tokens = append(pieces[n-1].Tokens, toks...)
		} else {
			pieces = append(pieces, Piece{Tokens: toks})
		}
	}
	return pieces, true, nil
}

// tokenIDs checks prompt token ids, the first at position first.
func tokenIDs(ids []int64, first int) ([]int32, error) {
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, badRequest("prompt token %d (%d) is not a token id", first+i, id)
		}
		toks[i] = int32(id)
	}
	return toks, nil
}
