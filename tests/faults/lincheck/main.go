// Command lincheck checks a recorded history of config-store operations for linearizability with porcupine.
//
//	lincheck [-timeout 60s] [-html out.html] history.jsonl
//
// The history is what tests/faults/history.py writes: one JSON object per operation, with its invocation and
// completion times (nanoseconds), what it asked and what it got. The model is the config store as its clients see
// it: one version for the whole store and the values of the keys the workload uses. Other writers (the registry
// writes tool entries into the same store) move the version but never touch those keys, so a read or a write may
// find the version higher than the last one the model saw, never lower, and the values must be exactly the model's.
//
// An operation whose outcome is unknown (a timeout, an error that does not say the write was not made) may have
// taken effect at any moment after its invocation, or never: it completes at the end of time and the model tries
// both. One the replicated log shows was made ("persisted", with the version the log gave it) completes at the end
// of time too, at that version. A read that got no answer says nothing and is left out.
//
// Prints one JSON line: {"verdict": "ok"|"illegal"|"unknown", "operations": N, "seconds": S, ...}; exits 0 for ok,
// 1 for illegal, 2 for unknown (the search ran out of time), 3 for a bad history.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// record is one line of the history file.
type record struct {
	ID      int                `json:"id"`
	Client  int                `json:"client"`
	Call    int64              `json:"call"`
	Return  *int64             `json:"return"`
	Kind    string             `json:"op"` // "read" or "write"
	Keys    []string           `json:"keys"`
	Puts    [][2]string        `json:"puts"`
	Deletes []string           `json:"deletes"`
	Expect  []expectation      `json:"expect"`
	Status  string             `json:"status"` // "ok", "conflict", "unknown"
	Version int64              `json:"version"`
	Values  map[string]*string `json:"values"`
}

type expectation struct {
	Key   string  `json:"key"`
	Value *string `json:"value"` // nil: the key must be absent
}

// state is the model's store: a lower bound of the version and the exact values of the workload's keys.
type state struct {
	version int64
	values  map[string]string
}

func (s state) with(puts [][2]string, deletes []string) (state, bool) {
	values := make(map[string]string, len(s.values)+len(puts))
	for k, v := range s.values {
		values[k] = v
	}
	changed := false
	for _, put := range puts {
		if old, ok := values[put[0]]; !ok || old != put[1] {
			values[put[0]] = put[1]
			changed = true
		}
	}
	for _, key := range deletes {
		if _, ok := values[key]; ok {
			delete(values, key)
			changed = true
		}
	}
	return state{s.version, values}, changed
}

func (s state) holds(expect []expectation) bool {
	for _, e := range expect {
		current, present := s.values[e.Key]
		if e.Value == nil {
			if present {
				return false
			}
		} else if !present || current != *e.Value {
			return false
		}
	}
	return true
}

func (s state) String() string {
	keys := make([]string, 0, len(s.values))
	for k := range s.values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%s", k, s.values[k]))
	}
	return fmt.Sprintf("v>=%d {%s}", s.version, strings.Join(parts, " "))
}

// step: the states the store may be in after `r`, from `s`; none if `r`'s answer is impossible from `s`.
func step(s state, r *record) []interface{} {
	if r.Kind == "read" {
		if r.Version < s.version {
			return nil // a version older than one already seen: a stale read
		}
		for _, key := range r.Keys {
			want, present := s.values[key]
			got := r.Values[key]
			if present != (got != nil) || (present && want != *got) {
				return nil
			}
		}
		return []interface{}{state{r.Version, s.values}}
	}
	after, changed := s.with(r.Puts, r.Deletes)
	holds := s.holds(r.Expect)
	switch r.Status {
	case "persisted": // timed out, but the log holds it at r.Version
		if !holds || !changed || r.Version <= s.version {
			return nil
		}
		after.version = r.Version
		return []interface{}{after}
	case "conflict":
		if holds {
			return nil
		}
		return []interface{}{s}
	case "ok":
		if !holds {
			return nil
		}
		if changed {
			if r.Version <= s.version {
				return nil // a change must move the version past every one seen
			}
		} else if r.Version < s.version {
			return nil
		}
		after.version = r.Version
		return []interface{}{after}
	default: // unknown: made, or not
		if !holds || !changed {
			return []interface{}{s}
		}
		after.version = s.version + 1
		return []interface{}{s, after}
	}
}

func describe(r *record) string {
	switch {
	case r.Kind == "read":
		values := []string{}
		for _, k := range r.Keys {
			if v := r.Values[k]; v != nil {
				values = append(values, k+"="+*v)
			} else {
				values = append(values, k+" absent")
			}
		}
		return fmt.Sprintf("c%d read -> v%d %s", r.Client, r.Version, strings.Join(values, " "))
	default:
		parts := []string{}
		for _, e := range r.Expect {
			if e.Value == nil {
				parts = append(parts, "if "+e.Key+" absent")
			} else {
				parts = append(parts, "if "+e.Key+"="+*e.Value)
			}
		}
		for _, p := range r.Puts {
			parts = append(parts, p[0]+":="+p[1])
		}
		for _, d := range r.Deletes {
			parts = append(parts, "delete "+d)
		}
		result := r.Status
		if r.Status == "ok" || r.Status == "persisted" {
			result = fmt.Sprintf("v%d", r.Version)
		}
		if r.Status == "persisted" {
			result = "timed out, in the log at " + result
		}
		return fmt.Sprintf("c%d %s -> %s", r.Client, strings.Join(parts, ", "), result)
	}
}

var model = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{state{0, map[string]string{}}} },
	Step: func(s, input, _ interface{}) []interface{} {
		return step(s.(state), input.(*record))
	},
	Equal: func(a, b interface{}) bool {
		x, y := a.(state), b.(state)
		if x.version != y.version || len(x.values) != len(y.values) {
			return false
		}
		for k, v := range x.values {
			if w, ok := y.values[k]; !ok || w != v {
				return false
			}
		}
		return true
	},
	Hash: func(s interface{}) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(s.(state).String()))
		return h.Sum64()
	},
	DescribeOperation: func(input, _ interface{}) string { return describe(input.(*record)) },
	DescribeState:     func(s interface{}) string { return s.(state).String() },
}

func load(path string) ([]porcupine.Operation, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	var records []*record
	var last int64
	scanner := bufio.NewScanner(file)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; scanner.Scan(); line++ {
		r := &record{}
		if err := json.Unmarshal(scanner.Bytes(), r); err != nil {
			return nil, fmt.Errorf("%s line %d: %v", path, line, err)
		}
		if r.Kind != "read" && r.Kind != "write" {
			return nil, fmt.Errorf("%s line %d: op %q is neither read nor write", path, line, r.Kind)
		}
		if r.Return != nil && *r.Return > last {
			last = *r.Return
		}
		if r.Call > last {
			last = r.Call
		}
		records = append(records, r)
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	never := last + int64(math.MaxInt32)*1000 // after everything: an unknown outcome may land at any later moment
	ops := make([]porcupine.Operation, 0, len(records))
	for _, r := range records {
		unknown := r.Status == "unknown" || r.Status == "persisted" || r.Return == nil
		if unknown && r.Kind == "read" {
			continue // no answer: it said nothing
		}
		end := never
		if !unknown {
			end = *r.Return
		} else if r.Status != "persisted" {
			r.Status = "unknown"
		}
		ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: r, Call: r.Call, Output: nil, Return: end})
	}
	return ops, nil
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "give up (verdict unknown) after this long")
	html := flag.String("html", "", "write porcupine's visualization of the history here")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: lincheck [-timeout 60s] [-html out.html] history.jsonl")
		os.Exit(3)
	}
	ops, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "lincheck:", err)
		os.Exit(3)
	}
	started := time.Now()
	result, info := porcupine.CheckOperationsVerbose(model.ToModel(), ops, *timeout)
	verdict := map[porcupine.CheckResult]string{porcupine.Ok: "ok", porcupine.Illegal: "illegal", porcupine.Unknown: "unknown"}[result]
	out := map[string]interface{}{
		"verdict":    verdict,
		"operations": len(ops),
		"seconds":    time.Since(started).Seconds(),
	}
	if result == porcupine.Illegal {
		out["longest_linearizable_prefix"] = longest(info)
	}
	if *html != "" {
		if err := porcupine.VisualizePath(model.ToModel(), info, *html); err != nil {
			fmt.Fprintln(os.Stderr, "lincheck: visualization:", err)
		} else {
			out["html"] = *html
		}
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetEscapeHTML(false)
	_ = encoder.Encode(out)
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}

// longest: the operations of the longest partial linearization porcupine found, described, in order.
func longest(info porcupine.LinearizationInfo) []string {
	var best []porcupine.Operation
	for _, partition := range info.PartialLinearizationsOperations() {
		for _, candidate := range partition {
			if len(candidate) > len(best) {
				best = candidate
			}
		}
	}
	described := make([]string, 0, len(best))
	for _, op := range best {
		described = append(described, describe(op.Input.(*record)))
	}
	if len(described) > 20 {
		described = described[len(described)-20:]
	}
	return described
}
