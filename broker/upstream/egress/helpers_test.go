package egress

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// evalJS runs expr on one of p's runtimes and returns its string value.
func evalJS(t *testing.T, p *PAC, expr string) string {
	t.Helper()
	vm, err := p.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer p.put(vm)
	v, err := vm.rt.RunString(expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v.String()
}

func TestPACHelpers(t *testing.T) {
	// Wednesday 2026-03-04 23:30:15 at UTC+2, which is 21:30:15 GMT.
	now := time.Date(2026, 3, 4, 23, 30, 15, 0, time.FixedZone("EET", 2*3600))
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		switch host {
		case "git.corp.example":
			return []netip.Addr{netip.MustParseAddr("10.1.2.3")}, nil
		case "v6.corp.example":
			return []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("fd00::9")}, nil
		}
		return nil, nil
	}
	p, err := NewPAC([]byte(`function FindProxyForURL(url, host) { return "DIRECT"; }`),
		PACOptions{Resolve: resolve, MyIP: netip.MustParseAddr("192.168.5.6")})
	if err != nil {
		t.Fatal(err)
	}
	p.now = func() time.Time { return now }
	cases := map[string]string{
		`isPlainHostName("www")`:                                       "true",
		`isPlainHostName("www.example")`:                               "false",
		`isPlainHostName("fd00::1")`:                                   "false",
		`dnsDomainIs("www.corp.example", ".corp.example")`:             "true",
		`dnsDomainIs("WWW.Corp.Example", ".corp.example")`:             "true",
		`dnsDomainIs("www", ".corp.example")`:                          "false",
		`dnsDomainIs("evilcorp.example", ".corp.example")`:             "false",
		`localHostOrDomainIs("www.corp.example", "www.corp.example")`:  "true",
		`localHostOrDomainIs("www", "www.corp.example")`:               "true",
		`localHostOrDomainIs("www.other.example", "www.corp.example")`: "false",
		`localHostOrDomainIs("home", "www.corp.example")`:              "false",
		`isResolvable("git.corp.example")`:                             "true",
		`isResolvable("nx.example")`:                                   "false",
		`dnsResolve("git.corp.example")`:                               "10.1.2.3",
		`dnsResolve("nx.example")`:                                     "null",
		`dnsResolve("192.0.2.1")`:                                      "192.0.2.1",
		`isInNet("git.corp.example", "10.0.0.0", "255.0.0.0")`:         "true",
		`isInNet("git.corp.example", "10.1.3.0", "255.255.255.0")`:     "false",
		`isInNet("172.16.5.4", "172.16.0.0", "255.240.0.0")`:           "true",
		`isInNet("172.32.5.4", "172.16.0.0", "255.240.0.0")`:           "false",
		`isInNet("172.16.5.4", "bogus", "255.240.0.0")`:                "false",
		`isInNet("nx.example", "0.0.0.0", "0.0.0.0")`:                  "false",
		`myIpAddress()`:                                        "192.168.5.6",
		`dnsDomainLevels("www")`:                               "0",
		`dnsDomainLevels("www.corp.example")`:                  "2",
		`shExpMatch("http://home.corp.example/x", "*/home.*")`: "true",
		`shExpMatch("www.example", "*.example")`:               "true",
		`shExpMatch("example", "*.example")`:                   "false",
		`shExpMatch("a1.example", "a?.example")`:               "true",
		`shExpMatch("a12.example", "a?.example")`:              "false",
		`shExpMatch("a.b.c", "a*c")`:                           "true",
		`shExpMatch("abc", "*")`:                               "true",
		`shExpMatch("", "*")`:                                  "true",
		`shExpMatch("a.example", "A.example")`:                 "false",
		`shExpMatch("axbxcxd", "a*b*c*e")`:                     "false",
		`shExpMatch("a.example", "a[.]example")`:               "false",
		`convert_addr("10.1.2.3")`:                             "167838211",
		`convert_addr("255.255.255.255")`:                      "4294967295",
		`convert_addr("bogus")`:                                "0",
		// Wednesday local, Wednesday GMT.
		`weekdayRange("WED")`:                            "true",
		`weekdayRange("wed")`:                            "true",
		`weekdayRange("MON", "FRI")`:                     "true",
		`weekdayRange("THU", "FRI")`:                     "false",
		`weekdayRange("SAT", "WED")`:                     "true", // wraps
		`weekdayRange("FRI", "TUE")`:                     "false",
		`weekdayRange("WED", "GMT")`:                     "true",
		`weekdayRange("XYZ")`:                            "false",
		`weekdayRange()`:                                 "false",
		`dateRange(4)`:                                   "true",
		`dateRange(5)`:                                   "false",
		`dateRange("MAR")`:                               "true",
		`dateRange(2026)`:                                "true",
		`dateRange(2025)`:                                "false",
		`dateRange(1, 15)`:                               "true",
		`dateRange(25, 4)`:                               "true", // wraps month end
		`dateRange(25, 3)`:                               "false",
		`dateRange(5, 25)`:                               "false",
		`dateRange("JAN", "MAR")`:                        "true",
		`dateRange("NOV", "FEB")`:                        "false",
		`dateRange("NOV", "MAR")`:                        "true", // wraps year end
		`dateRange(2025, 2027)`:                          "true",
		`dateRange(2027, 2025)`:                          "false",
		`dateRange(1, "MAR", 4, "MAR")`:                  "true",
		`dateRange(5, "MAR", 1, "APR")`:                  "false",
		`dateRange(20, "DEC", 10, "MAR")`:                "true",
		`dateRange("FEB", 2026, "MAR", 2026)`:            "true",
		`dateRange("APR", 2026, "MAY", 2026)`:            "false",
		`dateRange(1, "JAN", 2026, 4, "MAR", 2026)`:      "true",
		`dateRange(5, "MAR", 2026, 1, "JAN", 2027)`:      "false",
		`dateRange(4, "GMT")`:                            "true",
		`dateRange(2026, "MAR")`:                         "false", // mixed shapes
		`dateRange(2026, "MAR", 4)`:                      "false",
		`dateRange("MAR", 4, "MAR", 5)`:                  "false", // month day is not a shape
		`dateRange(32)`:                                  "false",
		`dateRange()`:                                    "false",
		`timeRange(23)`:                                  "true",
		`timeRange(21, "GMT")`:                           "true",
		`timeRange(23, "GMT")`:                           "false",
		`timeRange(9, 17)`:                               "false",
		`timeRange(22, 2)`:                               "true", // wraps midnight
		`timeRange(23, 23)`:                              "true",
		`timeRange(23, 0, 23, 30)`:                       "true", // to the end of 23:30
		`timeRange(23, 31, 23, 59)`:                      "false",
		`timeRange(23, 30, 15, 23, 30, 15)`:              "true",
		`timeRange(23, 30, 16, 23, 31, 0)`:               "false",
		`timeRange(21, 0, 22, 0, "GMT")`:                 "true",
		`timeRange(25)`:                                  "false",
		`timeRange(1, 2, 3)`:                             "false",
		`timeRange()`:                                    "false",
		`myIpAddressEx()`:                                "192.168.5.6",
		`isResolvableEx("git.corp.example")`:             "true",
		`isResolvableEx("nx.example")`:                   "false",
		`dnsResolveEx("v6.corp.example")`:                "10.9.9.9;fd00::9",
		`dnsResolveEx("nx.example")`:                     "",
		`isInNetEx("v6.corp.example", "fd00::/8")`:       "true",
		`isInNetEx("v6.corp.example", "10.9.0.0/16")`:    "true",
		`isInNetEx("v6.corp.example", "2001:db8::/32")`:  "false",
		`isInNetEx("2001:db8::1", "2001:db8::/32")`:      "true",
		`isInNetEx("2001:db8::1", "bogus")`:              "false",
		`sortIpAddressList("10.2.0.1;fd00::1;10.1.0.1")`: "fd00::1;10.1.0.1;10.2.0.1",
		`sortIpAddressList("10.2.0.1;bogus")`:            "false",
		`getClientVersion()`:                             "1.0",
		`typeof alert("x")`:                              "undefined",
		`new Date().getFullYear()`:                       "2026",
	}
	for expr, want := range cases {
		t.Run(expr, func(t *testing.T) {
			if got := evalJS(t, p, expr); got != want {
				t.Errorf("%s = %s, want %s", expr, got, want)
			}
		})
	}
}
