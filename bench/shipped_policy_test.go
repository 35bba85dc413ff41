package main

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/capbroker/capbroker/broker/policy"
)

// TestWriteShippedAllowsTheBenchHosts: the shipped policies, as the full pipeline's broker
// gets them, load and allow the bench's git and LLM hosts on the upstream's port.
func TestWriteShippedAllowsTheBenchHosts(t *testing.T) {
	dir := t.TempDir()
	const port = 8443
	if err := writeShipped(dir, strconv.Itoa(port)); err != nil {
		t.Fatal(err)
	}
	e, err := policy.New(context.Background(), os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []policy.Input{
		{Phase: policy.PhaseConnect, AgentID: "bench", Method: "CONNECT", Host: hostGit, Port: port},
		{Phase: policy.PhaseRequest, AgentID: "bench", Method: "POST", Scheme: "https", Host: hostGit, Port: port, Path: "/o/r.git/git-upload-pack"},
		{Phase: policy.PhaseRequest, AgentID: "bench", Method: "GET", Scheme: "https", Host: hostIntercept, Port: port, Path: "/v1/models", Credentials: []string{"openai"}},
	} {
		d, err := e.Decide(context.Background(), &in)
		if err != nil || !d.Allow {
			t.Errorf("%s %s %s%s: %+v, %v", in.Phase, in.Method, in.Host, in.Path, d, err)
		}
	}
}
