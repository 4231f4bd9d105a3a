package gie

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// EndpointRef is what the identity mapping reads of a router's endpoint
// (for GIE, its EndpointMetadata).
type EndpointRef struct {
	// Namespace and Name are the endpoint's namespaced name. GIE names the
	// endpoint of a pod's Nth target port "<pod>-rank-<N>".
	Namespace, Name string
	// PodName is the pod's name, without a rank suffix.
	PodName string
	// Address and Port are where the model server listens.
	Address, Port string
}

// How an endpoint maps to the pod identity kvindex knows it by: the
// bridge's --pod for that model server (PodIdentity values).
const (
	// PodIdentityAddressPort: "address:port", as the vLLM sidecar example
	// sets --pod ($(POD_IP):8000; an IPv6 address is not bracketed). The
	// default.
	PodIdentityAddressPort = "address-port"
	// PodIdentityNamespacedName: "namespace/pod".
	PodIdentityNamespacedName = "namespaced-name"
	// PodIdentityPodName: the pod's name.
	PodIdentityPodName = "pod-name"
)

// How GIE's "-rank-N" endpoints map to data-parallel ranks (Ranks values).
const (
	// RanksSuffix: the endpoint "<pod>-rank-N" is rank N of its pod; with
	// address-port identity the pod is address:(port − N·RankPortStride),
	// the port of rank 0. The default.
	RanksSuffix = "suffix"
	// RanksNone: every endpoint is rank 0 of its own identity (its own
	// address:port, or its own endpoint name): for pods whose target ports
	// are independent model servers, each with its own --pod.
	RanksNone = "none"
)

// IdentityMapper maps endpoints to kvindex identities.
type IdentityMapper struct {
	// PodIdentity is one of the PodIdentity* constants ("" means
	// address-port).
	PodIdentity string
	// Ranks is RanksSuffix or RanksNone ("" means suffix).
	Ranks string
	// RankPortStride is the port distance between consecutive ranks'
	// target ports under RanksSuffix with address-port identity. Default
	// 1 (zero means 1).
	RankPortStride int
}

// Validate reports an unknown mode or a negative stride.
func (m IdentityMapper) Validate() error {
	switch m.PodIdentity {
	case "", PodIdentityAddressPort, PodIdentityNamespacedName, PodIdentityPodName:
	default:
		return fmt.Errorf("%w: podIdentity %q: want %s, %s or %s", ErrInvalidConfig, m.PodIdentity,
			PodIdentityAddressPort, PodIdentityNamespacedName, PodIdentityPodName)
	}
	switch m.Ranks {
	case "", RanksSuffix, RanksNone:
	default:
		return fmt.Errorf("%w: ranks %q: want %s or %s", ErrInvalidConfig, m.Ranks, RanksSuffix, RanksNone)
	}
	if m.RankPortStride < 0 || m.RankPortStride > math.MaxUint16 {
		return fmt.Errorf("%w: rankPortStride %d is outside [0, %d] (a port distance)", ErrInvalidConfig, m.RankPortStride, math.MaxUint16)
	}
	return nil
}

// Identity returns e's kvindex identity. It errors (ErrIdentity) when the
// mode needs a field e lacks, or a rank's port would go below 1.
func (m IdentityMapper) Identity(e EndpointRef) (Identity, error) {
	rank, hasRank := rankSuffix(e.Name)
	if m.Ranks == RanksNone {
		rank, hasRank = 0, false
	}
	pod := e.PodName
	if pod == "" {
		pod = e.Name
		if hasRank {
			pod = strings.TrimSuffix(e.Name, "-rank-"+strconv.Itoa(rank))
		}
	}
	var id string
	switch m.PodIdentity {
	case "", PodIdentityAddressPort:
		if e.Address == "" || e.Port == "" {
			return Identity{}, fmt.Errorf("%w: endpoint %s/%s has no address:port", ErrIdentity, e.Namespace, e.Name)
		}
		port, err := strconv.Atoi(e.Port)
		if err != nil {
			return Identity{}, fmt.Errorf("%w: endpoint %s/%s: port %q: %v", ErrIdentity, e.Namespace, e.Name, e.Port, err)
		}
		stride := max(m.RankPortStride, 1)
		base := port - rank*stride
		if base < 1 {
			return Identity{}, fmt.Errorf("%w: endpoint %s/%s: rank %d below port %d", ErrIdentity, e.Namespace, e.Name, rank, port)
		}
		// Joined as the sidecar's --pod=$(POD_IP):8000 joins them: an
		// IPv6 address unbracketed (net.JoinHostPort would bracket it, and
		// no candidate on an IPv6 cluster would match).
		id = e.Address + ":" + strconv.Itoa(base)
	case PodIdentityNamespacedName:
		name := pod
		if m.Ranks == RanksNone {
			name = e.Name
		}
		id = e.Namespace + "/" + name
	case PodIdentityPodName:
		id = pod
		if m.Ranks == RanksNone {
			id = e.Name
		}
	}
	if id == "" || id == "/" {
		return Identity{}, fmt.Errorf("%w: endpoint %s/%s maps to an empty pod", ErrIdentity, e.Namespace, e.Name)
	}
	return Identity{Pod: id, Rank: uint32(rank)}, nil
}

// rankSuffix parses GIE's "<pod>-rank-<N>" endpoint name.
func rankSuffix(name string) (int, bool) {
	i := strings.LastIndex(name, "-rank-")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(name[i+len("-rank-"):])
	if err != nil || n < 0 || strconv.Itoa(n) != name[i+len("-rank-"):] {
		return 0, false
	}
	return n, true
}
