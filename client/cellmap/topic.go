package cellmap

import "fmt"

// MaxTopicLen is the longest Kafka topic name (Kafka's own limit).
const MaxTopicLen = 249

// ValidateTopic reports a name Kafka would refuse as a topic: empty,
// longer than MaxTopicLen characters, "." or "..", or holding a character
// other than ASCII letters, digits, '.', '_' and '-' (Kafka's
// org.apache.kafka.common.internals.Topic rules). A cell's topic is
// checked with it, as every --topic flag is.
func ValidateTopic(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty topic name")
	case len(name) > MaxTopicLen:
		return fmt.Errorf("topic name is %d characters, Kafka's limit is %d", len(name), MaxTopicLen)
	case name == "." || name == "..":
		return fmt.Errorf("topic name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q has %q at byte %d: Kafka allows only ASCII letters, digits, '.', '_' and '-'", name, c, i)
		}
	}
	return nil
}
