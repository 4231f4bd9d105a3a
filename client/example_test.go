package client_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/client"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// standIn plays an indexd replica for the examples. For block hashes:
// vllm-0 holds the whole prompt on GPU, vllm-1 its first two blocks (the
// second offloaded to CPU). For tokens (token mode): vllm-0 (block size
// 16) holds all three full blocks on GPU, vllm-2 (block size 32) its one
// full block on CPU.
type standIn struct {
	kvindexv1.UnimplementedIndexServiceServer
}

func (standIn) Lookup(_ context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	gpu, cpu := kvindexv1.Tier_TIER_GPU, kvindexv1.Tier_TIER_CPU
	if req.Tokens != nil {
		return &kvindexv1.LookupResponse{Revision: 7, Matches: []*kvindexv1.EndpointMatch{
			{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-0"}, MatchedBlocks: 3, Tiers: []kvindexv1.Tier{gpu, gpu, gpu}, BlockSize: 16},
			{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-2"}, MatchedBlocks: 1, Tiers: []kvindexv1.Tier{cpu}, BlockSize: 32},
		}}, nil
	}
	return &kvindexv1.LookupResponse{Revision: 7, Matches: []*kvindexv1.EndpointMatch{
		{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-0"}, MatchedBlocks: uint32(len(req.BlockHashes)), Tiers: []kvindexv1.Tier{gpu, gpu, gpu}},
		{Endpoint: &kvindexv1.Endpoint{Pod: "default/vllm-1"}, MatchedBlocks: 2, Tiers: []kvindexv1.Tier{gpu, cpu}},
	}}, nil
}

// serveStandIn runs the stand-in on a loopback port until stop.
func serveStandIn() (addr string, stop func()) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	kvindexv1.RegisterIndexServiceServer(srv, standIn{})
	go srv.Serve(l)
	return l.Addr().String(), srv.Stop
}

// A router sends a prompt's token ids to kvindex (token mode: no engine
// hash to reproduce; the replica keys the prompt at each endpoint's block
// size), then scores the endpoints by the share of the prompt each holds.
func Example() {
	addr, stop := serveStandIn()
	defer stop()

	// In production: client.New("dns:///indexd.kvindex:50051").
	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	prompt := client.TokenPrompt{TokenIDs: make([]uint32, 50)} // the request's token ids
	for i := range prompt.TokenIDs {
		prompt.TokenIDs[i] = uint32(1000 + i)
	}
	res, err := c.LookupTokens(context.Background(), "meta-llama/Llama-3.1-8B-Instruct", prompt)
	if err != nil {
		log.Fatal(err)
	}
	scores := client.ScoreTokens(res.Matches, len(prompt.TokenIDs), client.DefaultTierWeights())
	for _, m := range res.Matches {
		fmt.Printf("%s: %d blocks of %d tokens %v, score %.2f\n", m.Endpoint.Pod, m.Blocks, m.BlockSize, m.Tiers, scores[m.Endpoint])
	}
	// Output:
	// default/vllm-0: 3 blocks of 16 tokens [gpu gpu gpu], score 1.00
	// default/vllm-2: 1 blocks of 32 tokens [cpu], score 0.80
}

// A router that hashes locally computes the canonical keys itself (here
// at block size 16, with a LoRA adapter) and looks them up as block
// hashes; the keys are the same on every engine, whatever its own hash
// (these are the vectors' bs4_lora_every_block).
func ExampleTokenKeys() {
	prompt := client.TokenPrompt{TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, LoRAName: "sql-lora"}
	fmt.Printf("%016x\n", client.TokenKeys(prompt, 4))
	// Output:
	// [ed460869831834ea 8c503fab61580802 cab53835d195f2ac]
}

// A router in front of vLLM engines in engine-hash mode hashes a prompt
// the way they do (sha256_cbor with a fixed PYTHONHASHSEED), asks kvindex
// which endpoints hold its prefix, and scores them.
func ExampleHasher() {
	addr, stop := serveStandIn()
	defer stop()

	// Engines run with PYTHONHASHSEED=0, block size 16 and
	// --prefix-caching-hash-algo sha256_cbor.
	hasher, err := client.NewHasher("0", 16)
	if err != nil {
		log.Fatal(err)
	}
	tokens := make([]uint32, 50) // three full blocks and a partial one (the fixture seed0_bs16_ascii)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	hashes := hasher.BlockHashes(tokens, client.HashExtras{})
	fmt.Printf("block hashes: %x\n", hashes)

	c, err := client.New(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := c.Lookup(context.Background(), "meta-llama/Llama-3.1-8B-Instruct", hashes)
	if err != nil {
		log.Fatal(err)
	}
	scores := client.Score(res.Matches, len(hashes), client.DefaultTierWeights())
	for _, m := range res.Matches {
		fmt.Printf("%s rank %d: %d blocks %v, score %.2f\n", m.Endpoint.Pod, m.Endpoint.DPRank, m.Blocks, m.Tiers, scores[m.Endpoint])
	}
	// Output:
	// block hashes: [2ceabcfae6d332ea 26470bbec927f5bf 480a8718e6d0b0b5]
	// default/vllm-0 rank 0: 3 blocks [gpu gpu gpu], score 1.00
	// default/vllm-1 rank 0: 2 blocks [gpu cpu], score 0.60
}
