package main

import "testing"

func TestParseMachineCPU(t *testing.T) {
	for line, want := range map[string]machineCPU{
		"cpu  638906 0 126458 12136849 4001 0 36423 25174 0 0": {total: 12967811, steal: 25174, idle: 12140850}, // idle and iowait
		"cpu  10 0 10 70 0 0 0 10 99 99":                       {total: 100, steal: 10, idle: 70},               // guest is in user already
		"cpu0 10 0 10 70 0 0 0 10":                             {},                                              // not the machine's line
		"cpu 10 0 10":                                          {},                                              // a kernel without steal
		"cpu 10 0 10 70 0 0 0 x":                               {},
	} {
		if got := parseMachineCPU(line); got != want {
			t.Errorf("%q: %+v, want %+v", line, got, want)
		}
	}
}
