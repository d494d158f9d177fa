package cudallama

import "github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/prompt"

// maxTokenBytes is BackendInfo.MaxTokenBytes for a vocabulary whose longest
// token piece (special tokens' text included) is longest bytes: a token
// stands for at most that much text where the tokenizer maps text to pieces
// byte for byte (bytewise: BPE, SPM). It is 0 (not known) for tokenizers
// that normalize (WPM, UGM drop accents and whitespace runs) and where a
// special token strips the whitespace beside it (LStrip, RStrip): there one
// token may stand for any length of text.
func maxTokenBytes(bytewise bool, longest int, special []prompt.Token) int {
	if !bytewise || longest <= 0 {
		return 0
	}
	for _, t := range special {
		if t.LStrip || t.RStrip {
			return 0
		}
	}
	return longest
}
