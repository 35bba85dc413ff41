package main

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
)

// TestIssue40Targets: every run's summary states each target of bulk transfers, many keys and
// HTTP/2 clients, and our bar for a connection per request, measured or saying why not.
func TestIssue40Targets(t *testing.T) {
	for name, tc := range map[string]struct {
		pc        *perCommand
		met, skip bool
	}{
		"not measured": {nil, false, true},
		"no floor":     {&perCommand{Rounds: 6, Steps: map[string]perCommandSteps{"X25519MLKEM768": {StepUS: [3]float64{130, 450, 160}, StepMin: [3]float64{110}, StepMax: [3]float64{160}}}}, false, true},
		"met":          {withFloor([]float64{150, 160, 170}, []float64{120, 120, 125}), true, false},
		"not met":      {withFloor([]float64{150, 200, 170}, []float64{80, 90, 100}), false, false},
	} {
		t.Run(name, func(t *testing.T) {
			s := &summary{PerCommand: tc.pc}
			s.checkTargets()
			var names []string
			var pc target
			for _, tg := range s.Targets {
				if strings.Contains(tg.Name, "issue 40") || strings.Contains(tg.Name, "(our bar)") {
					names = append(names, tg.Name)
				}
				if strings.HasPrefix(tg.Name, "connection per request") {
					pc = tg
				}
			}
			if len(names) != 9 { // bulk: 2 ratios both ways; many keys: 2 kinds; h2 clients: 2 paths; the CONNECT
				t.Fatalf("issue 40's targets: %q", names)
			}
			if (pc.Skipped != "") != tc.skip || pc.Met != tc.met || pc.Op != "<=" || pc.Limit != perCommandFloorLimit || pc.Unit != "x" {
				t.Fatalf("the connection per request's target: %+v", pc)
			}
			if f := tc.pc.floor(); !tc.skip && (pc.Value != f.Median || pc.Min != slices.Min(f.Ratios) || pc.Max != slices.Max(f.Ratios) || pc.Pairs != 3) {
				t.Fatalf("the connection per request's target: %+v", pc)
			}
		})
	}
}

// withFloor is a run whose CONNECTs were paired with the floor's: the broker's and the floor's
// CPU per CONNECT in each pair.
func withFloor(broker, floor []float64) *perCommand {
	r := &perCommand{Rounds: 3, Floor: &connectFloor{BrokerUS: broker, FloorUS: floor}}
	r.Floor.finish()
	return r
}

// TestConnectFloorPairs: each pair's ratio is the broker's CPU over the floor's in the same
// batch, and the medians are of each side alone.
func TestConnectFloorPairs(t *testing.T) {
	f := &connectFloor{BrokerUS: []float64{150, 200, 180}, FloorUS: []float64{100, 100, 120}}
	f.finish()
	if !slices.Equal(f.Ratios, []float64{1.5, 2, 1.5}) || f.Median != 1.5 || f.Min != 1.5 || f.Max != 2 || f.BrokerMedianUS != 180 || f.FloorMedianUS != 100 {
		t.Fatalf("%+v", f)
	}
	f.FloorUS = append(f.FloorUS, 90) // a batch whose broker half is missing is no pair
	f.finish()
	if len(f.Ratios) != 3 {
		t.Fatalf("%+v", f)
	}
}

// TestConnectFloorAnswers: the floor answers a CONNECT as the bench's client reads the
// broker's, and serves connections until its listener closes.
func TestConnectFloorAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go floorConnect(c)
		}
	}()
	for range 3 {
		if _, err := oneCommand(context.Background(), ln.Addr().String(), "a.example:443", "Basic eDp5", nil, 0); err != nil {
			t.Fatal(err)
		}
	}
}
