package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dop251/goja"
)

// installHelpers defines the standard PAC functions (as Netscape specified
// them and browsers implement them) in vm's global scope, in Go. None of
// them reaches the network or the file system; DNS goes through
// PACOptions.Resolve only.
func (p *PAC) installHelpers(vm *pacVM) error {
	rt := vm.rt
	fns := map[string]any{
		"isPlainHostName":     isPlainHostName,
		"dnsDomainIs":         dnsDomainIs,
		"localHostOrDomainIs": localHostOrDomainIs,
		"dnsDomainLevels":     func(host string) int { return strings.Count(host, ".") },
		"shExpMatch":          shExpMatch,
		"convert_addr":        convertAddr,
		"myIpAddress":         func() string { return p.myIP },
		"isResolvable":        func(host string) bool { return p.resolveOne(vm, host).IsValid() },
		"dnsResolve": func(host string) goja.Value {
			if a := p.resolveOne(vm, host); a.IsValid() {
				return rt.ToValue(a.String())
			}
			return goja.Null()
		},
		"isInNet": func(host, pattern, mask string) bool {
			a := p.resolveOne(vm, host)
			return a.IsValid() && isInNet(a, pattern, mask)
		},
		"weekdayRange": func(call goja.FunctionCall) goja.Value {
			return rt.ToValue(weekdayRange(p.now(), callArgs(call)))
		},
		"dateRange": func(call goja.FunctionCall) goja.Value {
			return rt.ToValue(dateRange(p.now(), callArgs(call)))
		},
		"timeRange": func(call goja.FunctionCall) goja.Value {
			return rt.ToValue(timeRange(p.now(), callArgs(call)))
		},
		// Microsoft's IPv6-aware extensions, found in corporate scripts.
		"myIpAddressEx":     func() string { return p.myIP },
		"isResolvableEx":    func(host string) bool { return len(p.resolveAll(vm, host)) > 0 },
		"dnsResolveEx":      func(host string) string { return joinAddrs(p.resolveAll(vm, host)) },
		"isInNetEx":         func(host, prefix string) bool { return isInNetEx(p.resolveAll(vm, host), prefix) },
		"sortIpAddressList": sortIPAddressList,
		"getClientVersion":  func() string { return "1.0" },
		// Scripts debug with alert(); its text goes nowhere.
		"alert": func(goja.FunctionCall) goja.Value { return goja.Undefined() },
	}
	for name, fn := range fns {
		if err := rt.Set(name, fn); err != nil {
			return err
		}
	}
	return nil
}

func callArgs(call goja.FunctionCall) []string {
	args := make([]string, len(call.Arguments))
	for i, a := range call.Arguments {
		args[i] = a.String()
	}
	return args
}

// resolveOne returns host's address: the literal itself, or the first IPv4
// address Resolve gives (else the first address), or an invalid Addr.
func (p *PAC) resolveOne(vm *pacVM, host string) netip.Addr {
	host = normalizeHost(host)
	if a, err := netip.ParseAddr(host); err == nil {
		return a.WithZone("").Unmap()
	}
	if p.resolve == nil || host == "" {
		return netip.Addr{}
	}
	addrs, err := p.resolve(vm.ctx, host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}
	}
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap()
		}
	}
	return addrs[0].WithZone("")
}

// resolveAll returns every address of host: the literal itself, or what
// Resolve gives, or none.
func (p *PAC) resolveAll(vm *pacVM, host string) []netip.Addr {
	host = normalizeHost(host)
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.WithZone("").Unmap()}
	}
	if p.resolve == nil || host == "" {
		return nil
	}
	addrs, err := p.resolve(vm.ctx, host)
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			out = append(out, a.WithZone("").Unmap())
		}
	}
	return out
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ";")
}

// isInNetEx: any of addrs within a CIDR such as "10.0.0.0/8" or "fd00::/8".
func isInNetEx(addrs []netip.Addr, prefix string) bool {
	pfx, err := netip.ParsePrefix(prefix)
	if err != nil {
		return false
	}
	pfx = unmapPrefix(pfx)
	for _, a := range addrs {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// sortIPAddressList sorts a ";"-separated list, IPv6 before IPv4 as
// Microsoft's does; false when an entry is not an address.
func sortIPAddressList(list string) any {
	var addrs []netip.Addr
	for f := range strings.SplitSeq(list, ";") {
		a, err := netip.ParseAddr(strings.TrimSpace(f))
		if err != nil {
			return false
		}
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is6() {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	return joinAddrs(addrs)
}

func dnsDomainIs(host, domain string) bool {
	return strings.HasSuffix(strings.ToLower(host), strings.ToLower(domain))
}

// localHostOrDomainIs is true when host is hostdom, or is unqualified and
// hostdom's first label.
func localHostOrDomainIs(host, hostdom string) bool {
	host, hostdom = strings.ToLower(host), strings.ToLower(hostdom)
	if host == hostdom {
		return true
	}
	return !strings.Contains(host, ".") && strings.HasPrefix(hostdom, host+".")
}

// isInNet: an IPv4 address and dotted-quad pattern and mask.
func isInNet(a netip.Addr, pattern, mask string) bool {
	pa, err1 := netip.ParseAddr(pattern)
	ma, err2 := netip.ParseAddr(mask)
	if err1 != nil || err2 != nil || !a.Is4() || !pa.Is4() || !ma.Is4() {
		return false
	}
	x, y, m := a.As4(), pa.As4(), ma.As4()
	for i := range x {
		if x[i]&m[i] != y[i]&m[i] {
			return false
		}
	}
	return true
}

// convertAddr: "10.1.2.3" as the unsigned 32-bit number 0x0a010203.
func convertAddr(s string) float64 {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return 0
	}
	b := a.As4()
	return float64(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
}

// shExpMatch matches str against a shell glob: '*' any run, '?' one byte,
// everything else literally, the whole string, case-sensitively.
func shExpMatch(str, pat string) bool {
	s, p := 0, 0
	star, mark := -1, 0
	for s < len(str) {
		switch {
		case p < len(pat) && (pat[p] == '?' || pat[p] == str[s]):
			s++
			p++
		case p < len(pat) && pat[p] == '*':
			star, mark = p, s
			p++
		case star >= 0:
			p = star + 1
			mark++
			s = mark
		default:
			return false
		}
	}
	for p < len(pat) && pat[p] == '*' {
		p++
	}
	return p == len(pat)
}

// stripGMT drops a final "GMT" argument and returns the clock to read.
func stripGMT(now time.Time, args []string) (time.Time, []string) {
	if n := len(args); n > 0 && strings.EqualFold(args[n-1], "GMT") {
		return now.UTC(), args[:n-1]
	}
	return now, args
}

var weekdays = map[string]time.Weekday{
	"SUN": time.Sunday, "MON": time.Monday, "TUE": time.Tuesday, "WED": time.Wednesday,
	"THU": time.Thursday, "FRI": time.Friday, "SAT": time.Saturday,
}

// weekdayRange(wd1[, wd2][, "GMT"]): today is wd1, or within wd1..wd2
// inclusive, wrapping past Saturday ("FRI", "MON").
func weekdayRange(now time.Time, args []string) bool {
	now, args = stripGMT(now, args)
	if len(args) < 1 || len(args) > 2 {
		return false
	}
	d1, ok1 := weekdays[strings.ToUpper(args[0])]
	d2, ok2 := d1, true
	if len(args) == 2 {
		d2, ok2 = weekdays[strings.ToUpper(args[1])]
	}
	if !ok1 || !ok2 {
		return false
	}
	return inRange(int(d1), int(d2), int(now.Weekday()))
}

// inRange: lo <= x <= hi, or, when lo > hi, a range that wraps.
func inRange(lo, hi, x int) bool {
	if lo <= hi {
		return lo <= x && x <= hi
	}
	return lo <= x || x <= hi
}

var months = map[string]int{
	"JAN": 1, "FEB": 2, "MAR": 3, "APR": 4, "MAY": 5, "JUN": 6,
	"JUL": 7, "AUG": 8, "SEP": 9, "OCT": 10, "NOV": 11, "DEC": 12,
}

// dateRange takes, before an optional "GMT", one or two of the same
// shape: day (1-31), month (JAN-DEC), year (four digits), day month,
// month year, or day month year. With one it is today's; with two, today
// within them inclusive (days and months wrap: dateRange("DEC", "FEB")).
func dateRange(now time.Time, args []string) bool {
	now, args = stripGMT(now, args)
	if len(args) == 0 || len(args) > 6 {
		return false
	}
	if len(args) == 1 {
		args = append(args, args[0])
	}
	if len(args)%2 != 0 {
		return false
	}
	half := len(args) / 2
	lo, loShape, ok1 := dateKey(args[:half])
	hi, hiShape, ok2 := dateKey(args[half:])
	if !ok1 || !ok2 || loShape != hiShape {
		return false
	}
	y, m, d := now.Date()
	today := [3]int{y, int(m), d}
	for i, used := range loShape {
		if !used {
			today[i] = 0
		}
	}
	num := func(k [3]int) int { return k[0]*10000 + k[1]*100 + k[2] }
	if loShape[0] && num(lo) > num(hi) { // a year range does not wrap
		return false
	}
	return inRange(num(lo), num(hi), num(today))
}

// dateKey reads one side of a dateRange: the (year, month, day) it names,
// zero where not given, and which of the three it gives. The shapes are
// day, month, year, day month, month year, and day month year.
func dateKey(args []string) (key [3]int, shape [3]bool, ok bool) {
	var order []int // field indexes as given: year 0, month 1, day 2
	for _, a := range args {
		var i, v int
		if m, isMonth := months[strings.ToUpper(a)]; isMonth {
			i, v = 1, m
		} else if n, err := strconv.Atoi(a); err == nil && len(a) <= 2 && n >= 1 && n <= 31 {
			i, v = 2, n
		} else if err == nil && len(a) == 4 && n >= 1000 {
			i, v = 0, n
		} else {
			return key, shape, false
		}
		order = append(order, i)
		shape[i], key[i] = true, v
	}
	switch fmt.Sprint(order) {
	case "[2]", "[1]", "[0]", "[2 1]", "[1 0]", "[2 1 0]":
		return key, shape, true
	}
	return key, shape, false
}

// timeRange(hour), (h1, h2), (h1, m1, h2, m2) or (h1, m1, s1, h2, m2, s2),
// then an optional "GMT". One hour: within that hour. Two hours: from the
// start of h1 until h2 begins. With minutes (and seconds): from the first
// time to the second inclusive, to the end of its minute when seconds are
// not given. A range whose start is after its end wraps past midnight.
func timeRange(now time.Time, args []string) bool {
	now, args = stripGMT(now, args)
	hours := map[int][]int{1: {0}, 2: {0, 1}, 4: {0, 2}, 6: {0, 3}}[len(args)]
	if hours == nil {
		return false
	}
	n := make([]int, len(args))
	for i, a := range args {
		v, err := strconv.Atoi(a)
		limit := 59
		if slices.Contains(hours, i) {
			limit = 24
		}
		if err != nil || v < 0 || v > limit {
			return false
		}
		n[i] = v
	}
	t := now.Hour()*3600 + now.Minute()*60 + now.Second()
	switch len(n) {
	case 1:
		return now.Hour() == n[0]
	case 2:
		if n[0] == n[1] {
			return now.Hour() == n[0]
		}
		return inRangeHalfOpen(n[0]*3600, n[1]*3600, t)
	case 4:
		return inRange(n[0]*3600+n[1]*60, n[2]*3600+n[3]*60+59, t)
	case 6:
		return inRange(n[0]*3600+n[1]*60+n[2], n[3]*3600+n[4]*60+n[5], t)
	}
	return false
}

func inRangeHalfOpen(lo, hi, x int) bool {
	if lo <= hi {
		return lo <= x && x < hi
	}
	return lo <= x || x < hi
}

// isPlainHostName: a name with no dot; an IPv6 literal is not one.
func isPlainHostName(host string) bool { return !strings.ContainsAny(host, ".:") }
