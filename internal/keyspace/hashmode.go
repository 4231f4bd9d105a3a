package keyspace

import "fmt"

// ParseHashMode parses a hash mode as the ingester's --hash-mode flag and
// the endpoint record's hash_mode field spell it: "token" or "engine".
func ParseHashMode(s string) (HashMode, error) {
	switch m := HashMode(s); m {
	case HashModeToken, HashModeEngine:
		return m, nil
	}
	return "", fmt.Errorf("keyspace: unknown hash mode %q (want %q or %q)", s, HashModeToken, HashModeEngine)
}
