package keyspace

// EndpointsPrefix is the prefix of every endpoint record key.
func (k Keyspace) EndpointsPrefix() string { return k.prefix + sectionEndpoints }

// ModelEndpointsPrefix is the prefix of every endpoint record key of model.
func (k Keyspace) ModelEndpointsPrefix(model string) string {
	return k.prefix + sectionEndpoints + escape(model) + "/"
}

// EndpointKey is the key of ep's EndpointRecord:
// endpoints/{model}/{pod}/{rank}.
func (k Keyspace) EndpointKey(ep Endpoint) string {
	dst := make([]byte, 0, len(k.prefix)+len(sectionEndpoints)+len(ep.Model)+len(ep.Pod)+12)
	dst = append(dst, k.prefix...)
	dst = append(dst, sectionEndpoints...)
	return string(appendEndpoint(dst, ep))
}

// ParseEndpointKey parses an endpoint record key strictly.
func (k Keyspace) ParseEndpointKey(key string) (Endpoint, error) {
	rest, err := k.cut(key, sectionEndpoints)
	if err != nil {
		return Endpoint{}, err
	}
	return k.parseEndpointPath(key, rest)
}
