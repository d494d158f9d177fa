package gguf

import (
	"fmt"
	"slices"
)

// Embedding makes a model an embedding or reranking model as llama.cpp's
// converter writes one: {arch}.pooling_type, and for a qwen3 reranker
// (Qwen3-Reranker's layout) the classifier head cls.output.weight with its
// labels ({arch}.classifier.output_labels) and a rerank template
// (tokenizer.chat_template.rerank), in which {query} and {document} stand
// for the texts.
type Embedding struct {
	Pooling        string   // "" (none written: llama.cpp pools none), none, mean, cls, last or rank
	Classifier     []string // the head's output labels; none: no head
	RerankTemplate string
}

// poolingTypes are llama_pooling_type's values by llama-server's names.
var poolingTypes = map[string]uint32{"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}

// validateEmbedding checks the pooling's name and that only qwen3, whose
// loader reads it, has a classifier head.
func (c Config) validateEmbedding() error {
	if _, ok := poolingTypes[c.Pooling]; c.Pooling != "" && !ok {
		return fmt.Errorf("gguf: pooling %q: want none, mean, cls, last or rank", c.Pooling)
	}
	if len(c.Classifier) > 0 && c.arch() != ArchQwen3 {
		return fmt.Errorf("gguf: a classifier head is read by llama.cpp's qwen3 models, not %s", c.arch())
	}
	if slices.Contains(c.Classifier, "") {
		return fmt.Errorf("gguf: classifier labels must not be empty")
	}
	return nil
}

// embeddingHparams are the pooling and the classifier's labels.
func (c Config) embeddingHparams() []kvPair {
	var kv []kvPair
	a := c.arch() + "."
	if c.Pooling != "" {
		kv = append(kv, kvPair{a + "pooling_type", poolingTypes[c.Pooling]})
	}
	if len(c.Classifier) > 0 {
		kv = append(kv, kvPair{a + "classifier.output_labels", c.Classifier})
	}
	return kv
}

// classifier is the head: a row of Embd weights for each label, scaled as
// the output head so that the scores spread.
func (c Config) classifier(wt ggmlType) []tensor {
	if len(c.Classifier) == 0 {
		return nil
	}
	return []tensor{{name: "cls.output.weight", dims: []int{c.Embd, len(c.Classifier)}, typ: wt, scale: 4 * uniformScale(c.Embd)}}
}

// rerankTemplate is tokenizer.chat_template.rerank.
func (c Config) rerankTemplate() []kvPair {
	if c.RerankTemplate == "" {
		return nil
	}
	return []kvPair{{"tokenizer.chat_template.rerank", c.RerankTemplate}}
}
