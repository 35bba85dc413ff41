package main

import (
	"strings"
	"testing"
)

// TestIssue40Targets: every run's summary states each target of bulk transfers, many keys and
// a connection per request, measured or saying why not.
func TestIssue40Targets(t *testing.T) {
	for name, tc := range map[string]struct {
		pc        *perCommand
		met, skip bool
	}{
		"not measured": {nil, false, true},
		"met":          {&perCommand{Rounds: 6, Steps: map[string]perCommandSteps{"X25519MLKEM768": {StepUS: [3]float64{130, 450, 160}, StepMin: [3]float64{110}, StepMax: [3]float64{160}}}}, true, false},
		"not met":      {&perCommand{Rounds: 6, Steps: map[string]perCommandSteps{"X25519MLKEM768": {StepUS: [3]float64{180}, StepMin: [3]float64{170}, StepMax: [3]float64{200}}}}, false, false},
	} {
		t.Run(name, func(t *testing.T) {
			s := &summary{PerCommand: tc.pc}
			s.checkTargets()
			var names []string
			var pc target
			for _, tg := range s.Targets {
				if strings.Contains(tg.Name, "issue 40") {
					names = append(names, tg.Name)
				}
				if strings.HasPrefix(tg.Name, "connection per request") {
					pc = tg
				}
			}
			if len(names) != 9 { // bulk: 2 ratios both ways; many keys: 2 kinds; h2 clients: 2 paths; the CONNECT
				t.Fatalf("issue 40's targets: %q", names)
			}
			if (pc.Skipped != "") != tc.skip || pc.Met != tc.met || pc.Op != "<=" || pc.Limit != perCommandLimitUS {
				t.Fatalf("the connection per request's target: %+v", pc)
			}
			if !tc.skip && (pc.Value != tc.pc.Steps["X25519MLKEM768"].StepUS[0] || pc.Min == 0 || pc.Max == 0 || pc.Pairs != 6) {
				t.Fatalf("the connection per request's target: %+v", pc)
			}
		})
	}
}
