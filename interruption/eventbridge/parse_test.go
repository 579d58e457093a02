package eventbridge_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleetd/interruption"
	"github.com/fleetd/fleetd/interruption/eventbridge"
)

func readEvent(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "events", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		file      string
		kind      interruption.Kind
		instances []string
		deadline  time.Time
		detail    string
		id        string
		ignored   bool
	}{
		{file: "spot-interruption.json", kind: interruption.SpotInterruption, instances: []string{"i-0b662ef9931388ba0"},
			deadline: ts("2026-03-01T12:02:00Z"), detail: "terminate", id: "1e5527d7-bb36-4607-3370-4164db56a40e"},
		{file: "spot-interruption-hibernate.json", kind: interruption.SpotInterruption, instances: []string{"i-0c773f0a042499cb1"},
			deadline: ts("2026-03-01T12:05:00Z"), detail: "hibernate", id: "2f6638e8-cc47-4718-4481-5275ec67b51f"},
		{file: "rebalance.json", kind: interruption.Rebalance, instances: []string{"i-0b662ef9931388ba0"},
			detail: "rebalance-recommendation", id: "5d2e1b9a-7c1f-4f0e-9b6a-2a8e1c3d4e5f"},
		{file: "state-change-terminated.json", kind: interruption.Lost, instances: []string{"i-0b662ef9931388ba0"},
			detail: "terminated", id: "9c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"},
		{file: "health-scheduled-change.json", kind: interruption.Maintenance, instances: []string{"i-0abcdef1234567890", "i-0fedcba9876543210"},
			deadline: ts("2026-03-08T10:00:00Z"), detail: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", id: "7bf73129-1428-4cd3-a780-95db273d1602"},
		{file: "capacity-reservation-interruption.json", kind: interruption.SpotInterruption, instances: []string{"i-0d884a1b153500dc2"},
			deadline: ts("2026-03-01T12:03:00Z"), detail: "capacity-reservation: terminate", id: "3a4b5c6d-7e8f-4a0b-9c1d-2e3f4a5b6c7d"},
		{file: "state-change-running.json", ignored: true},
		{file: "health-other-service.json", ignored: true},
		{file: "unknown-version.json", ignored: true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			ev, err := eventbridge.Parse(readEvent(t, tc.file))
			if tc.ignored {
				if !errors.Is(err, eventbridge.ErrIgnored) {
					t.Fatalf("Parse: %v, want ErrIgnored", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Kind != tc.kind || !slices.Equal(ev.Instances, tc.instances) || !ev.Deadline.Equal(tc.deadline) || ev.Detail != tc.detail || ev.ID != tc.id {
				t.Errorf("Parse = %+v\nwant kind %s instances %v deadline %v detail %q id %s", ev, tc.kind, tc.instances, tc.deadline, tc.detail, tc.id)
			}
			ns := ev.Notices()
			if len(ns) != len(tc.instances) {
				t.Fatalf("%d notices, want %d", len(ns), len(tc.instances))
			}
			for i, n := range ns {
				if err := n.Validate(); err != nil {
					t.Error(err)
				}
				if n.Instance != tc.instances[i] || n.Kind != tc.kind || n.Source != eventbridge.Source || n.ID != tc.id || !n.Deadline.Equal(tc.deadline) {
					t.Errorf("notice %+v", n)
				}
			}
		})
	}
}

func TestParseMalformed(t *testing.T) {
	for name, body := range map[string]string{
		"not json":          `not json`,
		"array":             `[]`,
		"no id":             `{"version":"0","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","time":"2026-03-01T12:00:00Z","detail":{"instance-id":"i-0b662ef9931388ba0"}}`,
		"no version":        `{"id":"x","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","time":"2026-03-01T12:00:00Z","detail":{"instance-id":"i-0b662ef9931388ba0"}}`,
		"bad time":          `{"version":"0","id":"x","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","time":"yesterday","detail":{"instance-id":"i-0b662ef9931388ba0"}}`,
		"no detail":         `{"version":"0","id":"x","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","time":"2026-03-01T12:00:00Z"}`,
		"arn, not id":       `{"version":"0","id":"x","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","time":"2026-03-01T12:00:00Z","detail":{"instance-id":"arn:aws:ec2:us-east-1b:instance/i-0b662ef9931388ba0"}}`,
		"detail not object": `{"version":"0","id":"x","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","time":"2026-03-01T12:00:00Z","detail":"terminated"}`,
		"unknown state":     `{"version":"0","id":"x","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","time":"2026-03-01T12:00:00Z","detail":{"instance-id":"i-0b662ef9931388ba0","state":"exploded"}}`,
		"bad health time":   `{"version":"0","id":"x","detail-type":"AWS Health Event","source":"aws.health","time":"2026-03-01T12:00:00Z","detail":{"service":"EC2","eventTypeCategory":"scheduledChange","startTime":"soon","affectedEntities":[{"entityValue":"i-0b662ef9931388ba0"}]}}`,
	} {
		if _, err := eventbridge.Parse([]byte(body)); err == nil || errors.Is(err, eventbridge.ErrIgnored) {
			t.Errorf("%s: Parse = %v, want a parse error (not ErrIgnored)", name, err)
		}
	}
}

// FuzzParse: no input panics, and whatever parses is a usable event.
func FuzzParse(f *testing.F) {
	entries, err := os.ReadDir(filepath.Join("testdata", "events"))
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		f.Add(readEvent(f, e.Name()))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := eventbridge.Parse(body)
		if err != nil {
			return
		}
		if ev.ID == "" || !ev.Kind.Valid() || len(ev.Instances) == 0 {
			t.Fatalf("Parse accepted %q as %+v", body, ev)
		}
		for _, n := range ev.Notices() {
			if err := n.Validate(); err != nil || !utf8.ValidString(n.Instance) {
				t.Fatalf("notice %+v from %q: %v", n, body, err)
			}
		}
	})
}
