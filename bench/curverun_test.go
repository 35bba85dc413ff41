package main

import (
	"slices"
	"strings"
	"testing"
)

func TestSelectCurves(t *testing.T) {
	all, err := selectCurves("all")
	if err != nil || !slices.Contains(all, "concurrency") || !slices.Contains(all, "idle") || !slices.IsSorted(all) {
		t.Fatalf("all: %v, %v", all, err)
	}
	for _, spec := range []string{"", "none", " none "} {
		if got, err := selectCurves(spec); got != nil || err != nil {
			t.Errorf("%q: %v, %v", spec, got, err)
		}
	}
	if got, err := selectCurves("idle, concurrency,idle"); err != nil || strings.Join(got, ",") != "idle,concurrency" {
		t.Errorf("idle, concurrency,idle: %v, %v", got, err)
	}
	if _, err := selectCurves("idle,nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "concurrency") {
		t.Errorf("an unknown curve: %v", err)
	}
}
