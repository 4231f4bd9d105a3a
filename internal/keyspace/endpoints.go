package keyspace

import (
	"strconv"
	"strings"
)

// EndpointsPrefix is the prefix of every endpoint record key.
func (k Keyspace) EndpointsPrefix() string { return k.prefix + sectionEndpoints }

// ModelEndpointsPrefix is the prefix of every endpoint record key of model.
func (k Keyspace) ModelEndpointsPrefix(model string) string {
	return k.prefix + sectionEndpoints + escape(model) + "/"
}

// EndpointKey is the key of ep's EndpointRecord:
// endpoints/{model}/{pod}/{rank}.
func (k Keyspace) EndpointKey(ep Endpoint) string {
	var b strings.Builder
	b.Grow(len(k.prefix) + len(sectionEndpoints) + len(ep.Model) + len(ep.Pod) + 12)
	b.WriteString(k.prefix)
	b.WriteString(sectionEndpoints)
	b.WriteString(escape(ep.Model))
	b.WriteByte('/')
	b.WriteString(escape(ep.Pod))
	b.WriteByte('/')
	b.WriteString(strconv.FormatUint(uint64(ep.Rank), 10))
	return b.String()
}

// ParseEndpointKey parses an endpoint record key strictly.
func (k Keyspace) ParseEndpointKey(key string) (Endpoint, error) {
	rest, err := k.cut(key, sectionEndpoints)
	if err != nil {
		return Endpoint{}, err
	}
	return k.parseEndpointPath(key, rest)
}
