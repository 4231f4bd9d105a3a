package bridge

import (
	"fmt"
	"net"
	"strings"
)

// DefaultTopicPattern is llm-d's topic convention, "kv@<pod-id>@<model>"
// (llm-d-router pkg/kvevents/engineadapter parseTopic, for vLLM and SGLang
// pods alike; llm-d-inference-sim publishes kv@<ip>:<port>@<model>).
const DefaultTopicPattern = "kv@{pod}@{model}"

// topicPattern matches ZMQ topics against a pattern of literal text and
// the placeholders {pod} and {model} (each at most once, {pod} required).
// A placeholder takes the shortest text up to the literal that follows
// it, or the rest of the topic when it ends the pattern: for
// "kv@{pod}@{model}", "kv@10.0.0.7:8000@org/m@v2" is pod "10.0.0.7:8000",
// model "org/m@v2".
type topicPattern struct {
	// prefix is the literal text before the first placeholder: the ZMQ
	// subscription the bridge sends, so publishers filter for it.
	prefix string
	parts  []topicPart
}

type topicPart struct {
	literal string // literal text, or "" for a placeholder
	field   string // "pod" or "model" for a placeholder
}

// parseTopicPattern parses a topic pattern (see topicPattern).
func parseTopicPattern(p string) (topicPattern, error) {
	var tp topicPattern
	seen := map[string]bool{}
	rest := p
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			tp.parts = append(tp.parts, topicPart{literal: rest})
			break
		}
		if i > 0 {
			tp.parts = append(tp.parts, topicPart{literal: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return topicPattern{}, fmt.Errorf("%q: unclosed {", p)
		}
		name := rest[i+1 : i+j]
		if name != "pod" && name != "model" {
			return topicPattern{}, fmt.Errorf("%q: unknown placeholder {%s} (want {pod} and {model})", p, name)
		}
		if seen[name] {
			return topicPattern{}, fmt.Errorf("%q: {%s} appears twice", p, name)
		}
		if n := len(tp.parts); n > 0 && tp.parts[n-1].field != "" {
			return topicPattern{}, fmt.Errorf("%q: placeholders need literal text between them", p)
		}
		seen[name] = true
		tp.parts = append(tp.parts, topicPart{field: name})
		rest = rest[i+j+1:]
	}
	if !seen["pod"] {
		return topicPattern{}, fmt.Errorf("%q: no {pod} placeholder", p)
	}
	if len(tp.parts) > 0 && tp.parts[0].field == "" {
		tp.prefix = tp.parts[0].literal
	}
	return tp, nil
}

// hasModel reports whether the pattern names the model.
func (tp topicPattern) hasModel() bool {
	for _, p := range tp.parts {
		if p.field == "model" {
			return true
		}
	}
	return false
}

// match returns the pod and model a topic names; ok is false when the
// topic does not fit the pattern or a placeholder would be empty.
func (tp topicPattern) match(topic string) (pod, model string, ok bool) {
	rest := topic
	for i, p := range tp.parts {
		if p.field == "" {
			if !strings.HasPrefix(rest, p.literal) {
				return "", "", false
			}
			rest = rest[len(p.literal):]
			continue
		}
		var v string
		if i+1 < len(tp.parts) {
			k := strings.Index(rest, tp.parts[i+1].literal)
			if k < 0 {
				return "", "", false
			}
			v, rest = rest[:k], rest[k:]
		} else {
			v, rest = rest, ""
		}
		if v == "" {
			return "", "", false
		}
		if p.field == "pod" {
			pod = v
		} else {
			model = v
		}
	}
	return pod, model, rest == ""
}

// replayPattern makes a pod's replay endpoint from its topic's fields:
// "tcp://{host}:5558" with the placeholders {pod} (the pod as its topic
// names it), {host} (the pod without a trailing ":port", so
// llm-d-inference-sim's "10.0.0.7:8000" gives "10.0.0.7") and {model}.
// The zero value is no replay.
type replayPattern struct{ pattern string }

// parseReplayPattern checks that p, with its placeholders filled, is a
// tcp://HOST:PORT endpoint the bridge can dial. "" is no replay.
func parseReplayPattern(p string) (replayPattern, error) {
	if p == "" {
		return replayPattern{}, nil
	}
	rp := replayPattern{pattern: p}
	if strings.Contains(strings.NewReplacer("{pod}", "", "{host}", "", "{model}", "").Replace(p), "{") {
		return replayPattern{}, fmt.Errorf("%q: unknown placeholder (want {pod}, {host} or {model})", p)
	}
	if _, err := dialAddr(rp.fill("pod-0", "model")); err != nil {
		return replayPattern{}, err
	}
	return rp, nil
}

// addr is the host:port to dial for a pod's replay socket, "" for none;
// err when the filled pattern is not a dialable endpoint.
func (rp replayPattern) addr(pod, model string) (string, error) {
	if rp.pattern == "" {
		return "", nil
	}
	return dialAddr(rp.fill(pod, model))
}

func (rp replayPattern) fill(pod, model string) string {
	host := pod
	if h, _, err := net.SplitHostPort(pod); err == nil {
		host = h
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 address
	}
	return strings.NewReplacer("{pod}", pod, "{host}", host, "{model}", model).Replace(rp.pattern)
}

// listenAddr turns the bind endpoint "tcp://HOST:PORT" into the address
// to listen on; HOST "*" is every interface, PORT 0 a free port.
func listenAddr(endpoint string) (string, error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: want tcp://HOST:PORT", endpoint)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %v", endpoint, err)
	}
	if host == "*" {
		host = ""
	}
	var p uint16
	if _, err := fmt.Sscanf(port, "%d", &p); err != nil || fmt.Sprint(p) != port {
		return "", fmt.Errorf("%q: port %q is not in 0-65535", endpoint, port)
	}
	return net.JoinHostPort(host, port), nil
}
