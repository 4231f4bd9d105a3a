package gie

import "errors"

// Sentinel errors.
var (
	// ErrInvalidConfig: a plugin's parameters are malformed or out of
	// range; the message names the field.
	ErrInvalidConfig = errors.New("kvindex gie: invalid config")
	// ErrTokenize: the tokenizer failed or answered something unusable;
	// the message says what.
	ErrTokenize = errors.New("kvindex gie: tokenize")
	// ErrNoPrompt: the request carries no prompt the plugin can tokenize
	// (an API other than completions and chat completions, an empty
	// prompt, or one the tokenizer answered no tokens for).
	ErrNoPrompt = errors.New("kvindex gie: no prompt")
	// ErrIdentity: an endpoint cannot be mapped to a kvindex pod identity
	// (for example a "-rank-N" endpoint whose port is below N).
	ErrIdentity = errors.New("kvindex gie: endpoint identity")
	// ErrStale: the index answered, but from a view older than
	// maxStaleness (its progress time is that far in the past: the
	// answering replica has not heard from etcd since); the message says
	// how old.
	ErrStale = errors.New("kvindex gie: stale answer")
)
