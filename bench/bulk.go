package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// Issue 40's bulk targets: 256 MiB downloads and uploads, the bare intercepted path at least
// 0.9x the relay and the full pipeline (a host whose responses are scrubbed) at least 0.9x
// the bare intercepted path, both ways. Each ratio is the median of pairs of adjacent
// transfers (one path first in one pair, the other in the next), with the broker's CPU time
// per MiB in each.

// bulkPairs are the paired transfer ratios of one num/den.
type bulkPairs struct {
	Down paired `json:"download"`
	Up   paired `json:"upload"`
}

// uploadHost is where pa uploads: the full pipeline's llm host refuses bodies its policy
// cannot parse, so its uploads go to its git host (also credentialed, and scrubbed).
func uploadHost(pa *path) string {
	if pa.name == "full" {
		return hostGit
	}
	return pa.host()
}

// transferOnce moves bigSize bytes one way through pa and returns MiB/s and the CPU time of
// pa's process per MiB (0 without one).
func (pa *path) transferOnce(ctx context.Context, up *upstream, download bool) (mbps, cpuPerMiB float64) {
	var cpu0 time.Duration
	if pa.proc != nil {
		cpu0 = pa.proc.cpu()
	}
	if download {
		mbps = pa.download(ctx, up.url(pa.host(), "/v1/models/download"))
	} else {
		mbps = pa.upload(ctx, up.url(uploadHost(pa), "/bench/repo.git/git-upload-pack"))
	}
	if pa.proc != nil && mbps > 0 {
		cpuPerMiB = float64((pa.proc.cpu() - cpu0).Microseconds()) / 1000 / (bigSize >> 20)
	}
	return mbps, cpuPerMiB
}

// measureBulk measures num over den in n pairs of transfers each way; each path's best
// transfers go to s.Transfer.
func (s *summary) measureBulk(ctx context.Context, p *pki, up *upstream, num, den *path, n int) bulkPairs {
	best := func(pa *path, mbps float64, download bool) {
		t := s.Transfer[pa.name]
		if download {
			t.DownloadMBps = max(t.DownloadMBps, mbps)
		} else {
			t.UploadMBps = max(t.UploadMBps, mbps)
		}
		s.Transfer[pa.name] = t
	}
	num.client, den.client = num.withConns(p, 1), den.withConns(p, 1)
	var r bulkPairs
	for _, download := range []bool{true, false} {
		pr := paired{Conns: 1}
		for i := range n {
			var a, b, ca, cb float64
			if i%2 == 0 {
				b, cb = den.transferOnce(ctx, up, download)
				a, ca = num.transferOnce(ctx, up, download)
			} else {
				a, ca = num.transferOnce(ctx, up, download)
				b, cb = den.transferOnce(ctx, up, download)
			}
			best(num, a, download)
			best(den, b, download)
			if a > 0 && b > 0 {
				pr.Ratios = append(pr.Ratios, a/b)
			}
			if ca > 0 && cb > 0 {
				pr.CPURatios = append(pr.CPURatios, ca/cb)
			}
		}
		pr.Median, pr.CPUMedian = median(pr.Ratios), median(pr.CPURatios)
		way := "upload"
		if download {
			r.Down, way = pr, "download"
		} else {
			r.Up = pr
		}
		fmt.Fprintf(stderr, "  %s/%s %s 256 MiB: median %.2fx of %d pairs (CPU per MiB %.2fx)\n", num.name, den.name, way, pr.Median, len(pr.Ratios), pr.CPUMedian)
	}
	return r
}

// bulkOnly is -only bulk: the relay started alone, then the bulk pairs.
func bulkOnly(ctx context.Context, up *upstream, p *pki, intercept, full *path, o options) error {
	relay, stop, err := startOnePeer(ctx, up, p, "relay")
	if err != nil {
		return fmt.Errorf("-only bulk: %w", err)
	}
	defer stop()
	s := &summary{Bulk: map[string]bulkPairs{}, Transfer: map[string]transfer{}}
	s.Bulk["intercept/relay"] = s.measureBulk(ctx, p, up, intercept, relay, max(o.bulkPairs, 1))
	s.Bulk["full/intercept"] = s.measureBulk(ctx, p, up, full, intercept, max(o.bulkPairs, 1))
	s.printBulk(os.Stdout)
	return nil
}

// printBulk writes the bulk pairs' medians with their ranges.
func (s *summary) printBulk(out io.Writer) {
	for _, key := range []string{"intercept/relay", "full/intercept"} {
		b, ok := s.Bulk[key]
		if !ok {
			continue
		}
		for _, w := range []struct {
			name string
			p    paired
		}{{"download", b.Down}, {"upload", b.Up}} {
			if len(w.p.Ratios) == 0 {
				continue
			}
			fmt.Fprintf(out, "  bulk %-16s %-8s %.2fx (%.2f to %.2f, %d pairs), broker CPU per MiB %.2fx\n", key, w.name, w.p.Median, slices.Min(w.p.Ratios), slices.Max(w.p.Ratios), len(w.p.Ratios), w.p.CPUMedian)
		}
	}
}
